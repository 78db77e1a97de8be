"""make_splits: train/valid/test datasets over consecutive date ranges, with an embargo between them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NamedTuple

from .cross_section import CrossSectionDataset
from .dataset import KlineDataset
from .ranges import DateLike, split_bounds
from ..errors import InputError
from ..features.plan import field_roles
from ..feed.options import split_options
from ..store import Store, open_store


class Splits(NamedTuple):
    """Datasets of consecutive, embargoed date ranges (``valid``/``test`` None when not asked for)."""

    train: Any
    valid: Any
    test: Any

    @property
    def val(self) -> Any:
        """The validation split under Lightning's name (``valid`` and ``val`` are the same split)."""
        return self.valid


def make_splits(path: str | os.PathLike | Store, train: tuple[DateLike, DateLike],
                valid: tuple[DateLike, DateLike] | None = None,
                test: tuple[DateLike, DateLike] | None = None, *, window: int = 64,
                fields: Sequence[str] | None = None, horizon: int | None = None, embargo: int | None = None,
                cross_section: bool = False, val: tuple[DateLike, DateLike] | None = None,
                symbols: Sequence[str] | None = None, **options: Any) -> Splits:
    """Train/valid/test datasets over consecutive date ranges, with an embargo between them.

    Each range is ``(start, end)``: ``t``'s date ``>= start`` and every label's date ``<= end``. The embargo is
    made by purging the end of the earlier split: its labels stop ``embargo`` trading days before the next
    split's first ``t`` (an ``end`` of None reaches exactly that far); a ``start`` of None begins ``embargo`` days
    after the previous split's end. Overlapping ranges are an error. Z-score statistics (``normalize="zscore"``)
    come from the train split only and are passed to the others.

    Args:
        path: store directory or open Store.
        train: ``(start, end)`` of the train split (None for an open end).
        valid: ``(start, end)`` or None; ``val=`` is the same (Lightning's name), give one of them.
        test: ``(start, end)`` or None.
        window: days per window.
        fields: input fields.
        horizon: label offset (default 1; a features store's label: its reach, e.g. 2 for LABEL0).
        embargo: trading days that must separate a split's last label day from the next split's first ``t``
            (default: ``horizon``; at least ``horizon`` is enforced).
        cross_section: build :class:`CrossSectionDataset` s instead of :class:`KlineDataset` s.
        symbols: only these symbols' windows, in every split (names; default all).
        **options: other dataset options (label, adjust, normalize, missing, days, universe, ...); with
            ``universe="csi300"`` each split holds the samples of that universe's members on their member days.

    Returns:
        ``Splits(train, valid, test)``.

    Raises:
        InputError: overlapping ranges, a split left without days or valid windows.
    """
    if val is not None:
        if valid is not None:
            raise InputError("make_splits: valid= and val= are the same split; give one of them")
        valid = val
    unknown = sorted(k for k in options if k in ("validation", "eval", "dev"))
    if unknown:
        raise InputError(f"make_splits: unknown split {unknown[0]!r}; the splits are train, val (or valid), test")
    loading, _ = split_options(options)
    if loading:
        raise InputError(f"make_splits({sorted(loading)[0]}=...): a loader option; give it to a split's "
                         f".loader(...), or to KlineDataModule, which passes it to every split's loader")
    if symbols is not None:
        options["symbols"] = symbols
    st = path if isinstance(path, Store) else open_store(path)
    if horizon is None:   # a features store's label is read as far ahead as it looks
        _, label, reach = field_roles(st.manifest)
        horizon = dict(reach).get(options.get("label") or label, 0) or 1
    embargo = horizon if embargo is None else int(embargo)
    if embargo < horizon:
        raise InputError(f"embargo={embargo} is shorter than horizon={horizon}: labels of one split would reach "
                         f"into the next")
    bounds = split_bounds(st.dates, [train, valid, test], embargo, ["train", "val", "test"])
    cls = CrossSectionDataset if cross_section else KlineDataset
    made: list[Any] = []
    stats = options.pop("stats", None)
    for b in bounds:
        if b is None:
            made.append(None)
            continue
        lo, hi = b
        if lo > hi or lo >= st.n_dates or hi < 0:
            raise InputError(f"split {['train', 'val', 'test'][len(made)]} holds no trading day")
        ds = cls(st, window, fields, horizon, st.dates[lo], st.dates[hi], stats=stats, **options)
        if stats is None and options.get("normalize") == "zscore":
            stats = ds.stats  # train statistics for every later split
        made.append(ds)
    return Splits(*made)
