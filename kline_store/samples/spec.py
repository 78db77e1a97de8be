"""What a sample is: the user's options (``SampleSpec``) and their resolution against a store (``SamplePlan``).

``SampleSpec`` is what ``KlineDataset(...)`` was given: frozen, validated on its own, pickled with the dataset.
``resolve(spec, fields, dates)`` checks it against a store's fields and calendar and returns the ``SamplePlan``
that both the valid-window index (``windows.py``) and the batch gather (``gather.py``) read: field indices and
their roles, the label, the calendar bounds. Pure functions; no store object, no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .ranges import DateLike, date_bounds, to_time
from ..errors import InputError

# Field roles by canonical name. Prices are multiplied by the adjustment ratio and divided by the last close under
# per-window normalisation; VOLUME is divided by the adjustment ratio; VOLUME_LIKE is divided by its window mean
# under per-window normalisation. Other fields pass through unchanged.
DEFAULT_FIELDS = ("open", "high", "low", "close", "volume", "amount")
PRICE_FIELDS = frozenset({"open", "high", "low", "close", "pre_close", "vwap", "change"})
VOLUME_FIELDS = frozenset({"volume"})
VOLUME_LIKE_FIELDS = frozenset({"volume", "amount", "turnover"})
ADJ_FIELD = "adj_factor"

LABELS = ("return", "log_return")
ADJUSTS = ("none", "forward", "backward")
NORMALIZES = ("none", "window", "zscore")
MISSING = ("drop", "ffill")
DAYS = ("calendar", "symbol")

Adjust = Literal["none", "forward", "backward"]
Normalize = Literal["none", "window", "zscore"]


def _count(name: str, value: object) -> int:
    """A whole number of bars: an int (numpy's too), never a float, a bool or a string silently truncated."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InputError(f"{name}={value!r}: expected a whole number of bars (an int)")
    return int(value)


@dataclass(frozen=True)
class FieldRoles:
    """What a store says of its own fields: the default inputs, the default label, and how many bars after its
    day each field was computed from. A bar store: OHLCV inputs, a return label, nothing looks ahead. A features
    store: its features, its label, stored ``lookahead`` bars after the day it describes (read it that far
    ahead: ``horizon`` defaults to it and must equal it)."""

    default_fields: tuple[str, ...] | None = None
    default_label: str | None = None
    lookahead: tuple[tuple[str, int], ...] = ()

    def ahead(self, field: str) -> int:
        return dict(self.lookahead).get(field, 0)


@dataclass(frozen=True)
class SampleSpec:
    """The options that define a sample; see :class:`kline_store.samples.dataset.KlineDataset` for their meaning.

    Validated on construction (InputError), independently of any store.
    """

    window: int = 64
    horizon: int | None = None       # None: 1, or a features store's label reach
    fields: tuple[str, ...] | None = None
    start: np.datetime64 | None = None
    end: np.datetime64 | None = None
    label: str | None = None         # None: "return", or a features store's label
    adjust: Adjust = "none"
    normalize: Normalize = "none"
    missing: Literal["drop", "ffill"] = "drop"
    max_missing: int | None = None
    days: Literal["calendar", "symbol"] = "calendar"
    symbols: tuple[str, ...] | None = None
    universe: str | None = None      # only samples whose day t is a member day of this universe of the store

    @classmethod
    def make(cls, window: int = 64, fields: Sequence[str] | str | None = None, horizon: int | None = None,
             start: DateLike = None, end: DateLike = None, **options: object) -> SampleSpec:
        """A spec from loosely typed arguments: one field name as a string, dates in any accepted form."""
        names = None if fields is None else ((fields,) if isinstance(fields, str) else tuple(fields))
        symbols = options.pop("symbols", None)
        if symbols is not None:
            if isinstance(symbols, str):
                symbols = (symbols,)
            elif not isinstance(symbols, (list, tuple)) or not all(isinstance(s, str) for s in symbols):
                raise InputError(f"symbols: expected a list of symbol names, got {type(symbols).__name__}")
            options["symbols"] = tuple(symbols)
        h = None if horizon is None else _count("horizon", horizon)
        return cls(window=_count("window", window), horizon=h, fields=names, start=to_time(start, "start"),
                   end=to_time(end, "end"), **options)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        for name, value, ok in (("adjust", self.adjust, ADJUSTS), ("normalize", self.normalize, NORMALIZES),
                                ("missing", self.missing, MISSING), ("days", self.days, DAYS)):
            if value not in ok:
                raise InputError(f"{name}={value!r}: expected one of {', '.join(map(repr, ok))}")
        if self.window < 1 or (self.horizon is not None and self.horizon < 1):
            raise InputError(f"window={self.window}, horizon={self.horizon}: both must be >= 1")
        if self.days == "symbol" and self.missing == "ffill":
            raise InputError("days='symbol' windows have no missing days; use missing='drop' with them")
        if self.max_missing is not None and self.missing != "ffill":
            raise InputError("max_missing applies to missing='ffill' only")
        if self.universe is not None and not isinstance(self.universe, str):
            raise InputError(f"universe={self.universe!r}: expected the name of one of the store's universes")
        if self.symbols is not None:
            if not self.symbols:
                raise InputError("symbols=[]: give at least one symbol (or None for all)")
            if len(set(self.symbols)) != len(self.symbols):
                raise InputError(f"symbols: {next(s for s in self.symbols if self.symbols.count(s) > 1)!r} is "
                                 f"listed twice")
        if self.fields is not None:
            if not self.fields:
                raise InputError("fields=[]: give at least one field")
            if len(set(self.fields)) != len(self.fields):
                raise InputError(f"fields={list(self.fields)}: a field is listed twice")


@dataclass(frozen=True)
class SamplePlan:
    """A spec resolved against one store: store field indices and their roles (``x`` columns for the roles).

    Read by ``windows.py`` (which windows are valid) and ``gather.py`` (how a batch is made).

    Attributes:
        window, horizon, missing, max_missing, days, adjust, normalize: as in the spec.
        x_fields: store field index of each ``x`` column.
        names: the ``x`` field names.
        close: the close field (label base, per-window normalisation), or None when neither needs it.
        label_kind: "return", "log_return" or "field".
        label_field: the label's store field when ``label_kind == "field"``.
        adj: the ``adj_factor`` field when prices are adjusted.
        price_cols, volume_cols, volume_like_cols: ``x`` columns by role.
        n_dates: calendar length of the store.
        lo, hi: first allowed ``t`` and last allowed label day (calendar indices).
    """

    window: int
    horizon: int = 1
    x_fields: tuple[int, ...] = ()
    names: tuple[str, ...] = ()
    close: int | None = None
    label_kind: Literal["return", "log_return", "field"] = "return"
    label_field: int | None = None
    adj: int | None = None
    adjust: Adjust = "none"
    normalize: Normalize = "none"
    missing: Literal["drop", "ffill"] = "drop"
    max_missing: int | None = None
    days: Literal["calendar", "symbol"] = "calendar"
    price_cols: tuple[int, ...] = ()
    volume_cols: tuple[int, ...] = ()
    volume_like_cols: tuple[int, ...] = ()
    n_dates: int = 0
    lo: int = 0
    hi: int = 0

    @property
    def adjust_label(self) -> bool:
        """Returns are computed on adjusted closes (``close * adj_factor``)."""
        return self.adj is not None and self.label_kind != "field"

    @property
    def x_range(self) -> tuple[int, int] | None:
        """``(first, count)`` when ``x``'s fields are one ascending run of store fields: a single gather."""
        f = self.x_fields
        if f and f == tuple(range(f[0], f[0] + len(f))):
            return f[0], len(f)
        return None

    def compact(self) -> tuple[list[int], SamplePlan]:
        """The store fields a resident copy keeps (``x``'s first, in ``x`` order, then close, adj_factor and the
        label field) and this plan renumbered for that copy, where ``x`` is one contiguous run."""
        extra = [f for f in (self.close, self.adj, self.label_field) if f is not None and f not in self.x_fields]
        keep = list(self.x_fields) + list(dict.fromkeys(extra))
        at = {f: i for i, f in enumerate(keep)}
        plan = dataclasses.replace(
            self, x_fields=tuple(range(len(self.x_fields))), close=at.get(self.close),  # type: ignore[arg-type]
            adj=at.get(self.adj), label_field=at.get(self.label_field))  # type: ignore[arg-type]
        return keep, plan


def field_indices(store_fields: Sequence[str], fields: Sequence[str] | None, where: str,
                  default: Sequence[str] | None = None) -> list[int]:
    """Store indices of the requested fields (default: ``default``, else the OHLCV-amount fields the store has;
    a dataset over a bar store passes the ones every symbol has, ``coverage.with_default_fields``)."""
    if fields is None and default:
        names = list(default)
    elif fields is None:
        names = [f for f in store_fields if f in DEFAULT_FIELDS]
        if not names:
            raise InputError(f"{where}: none of the default fields ({', '.join(DEFAULT_FIELDS)}) is in the "
                             f"store; pass fields= from {', '.join(store_fields)}")
    else:
        names = list(fields)
    unknown = [f for f in names if f not in store_fields]
    if unknown:
        raise InputError(f"{where}: unknown field {', '.join(map(repr, unknown))}; the store has "
                         f"{', '.join(store_fields)}")
    return [list(store_fields).index(f) for f in names]


def resolve(spec: SampleSpec, store_fields: Sequence[str], dates: np.ndarray, where: str,
            roles: FieldRoles = FieldRoles()) -> SamplePlan:
    """Check ``spec`` against a store (its fields and calendar) and derive the plan.

    Args:
        spec: the sample options.
        store_fields: the store's field names.
        dates: the store's calendar.
        where: the store's path, for messages.
        roles: what the store says of its fields (a features store: default inputs and label, label reach).

    Raises:
        InputError: unknown field or label, a window longer than the calendar, adjustment without
            ``adj_factor``, a raw price label with adjusted inputs, no close for a return label.
    """
    store_fields = list(store_fields)
    n_dates = len(dates)
    label = spec.label or roles.default_label or "return"
    reach = roles.ahead(label)
    if reach and spec.horizon not in (None, reach):
        raise InputError(f"label={label!r} with horizon={spec.horizon}: {where} stores {label} {reach} bars after the "
                         f"day it labels (it reads {reach} bars ahead), so horizon must be {reach} (the default)")
    spec = dataclasses.replace(spec, label=label, horizon=spec.horizon or reach or 1)
    if spec.window + spec.horizon > n_dates:
        span = f"{dates[0]}..{dates[-1]}" if n_dates else "-"
        raise InputError(f"window={spec.window} plus horizon={spec.horizon} is longer than the calendar of {where} "
                         f"({n_dates} days, {span})")
    x_fields = field_indices(store_fields, spec.fields, where, roles.default_fields)
    names = [store_fields[i] for i in x_fields]
    if label in LABELS:
        kind, label_field = label, None
    elif label in store_fields:
        kind, label_field = "field", store_fields.index(label)
        if spec.adjust != "none" and (label in PRICE_FIELDS or label in VOLUME_FIELDS):
            raise InputError(f"label={label!r} with adjust={spec.adjust!r}: the label would be raw while x is "
                             f"adjusted; use label='return' or 'log_return' (computed on adjusted closes)")
    else:
        raise InputError(f"label={label!r}: expected 'return', 'log_return' or a field of {where} "
                         f"({', '.join(store_fields)})")
    need_close = kind != "field" or spec.normalize == "window"
    if need_close and "close" not in store_fields:
        raise InputError(f"{where}: no 'close' field, needed by label={label!r}/normalize={spec.normalize!r}; "
                         f"fields are {', '.join(store_fields)}")
    adj = None
    if spec.adjust != "none":
        if ADJ_FIELD not in store_fields:
            raise InputError(f"adjust={spec.adjust!r}: {where} has no {ADJ_FIELD!r} field (fields: "
                             f"{', '.join(store_fields)}); ingest input with corporate-action data or use "
                             f"adjust='none'")
        adj = store_fields.index(ADJ_FIELD)
    lo, hi = date_bounds(dates, spec.start, spec.end)
    return SamplePlan(
        window=spec.window, horizon=spec.horizon, x_fields=tuple(x_fields), names=tuple(names),
        close=store_fields.index("close") if need_close else None, label_kind=kind,  # type: ignore[arg-type]
        label_field=label_field, adj=adj, adjust=spec.adjust, normalize=spec.normalize, missing=spec.missing,
        max_missing=spec.max_missing, days=spec.days,
        price_cols=tuple(i for i, f in enumerate(names) if f in PRICE_FIELDS),
        volume_cols=tuple(i for i, f in enumerate(names) if f in VOLUME_FIELDS),
        volume_like_cols=tuple(i for i, f in enumerate(names) if f in VOLUME_LIKE_FIELDS),
        n_dates=n_dates, lo=lo, hi=hi)
