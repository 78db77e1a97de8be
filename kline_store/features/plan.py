"""What a features store holds: the named expressions, resolved, checked and described for its manifest.

A plan is the list of output fields in order, each with its expression, the bars of history it reads
(``lookback``; None for an expanding or exponential window, which reads the whole series) and the bars after its
day it reads (``lookahead``; Qlib's LABEL0 reads 2). A field that looks ahead is stored ``lookahead`` bars after
the day it describes, at the first bar where it is known: every stored cell depends only on bars at or before
its own, so appends never change a stored cell, and a dataset reading the field as a label ``lookahead`` bars
ahead (``KlineDataset(..., label="LABEL0")`` does) gets the value of its window's day without any look-ahead.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, StoreError
from ..store.labels import FEATURES_KEY, field_lookahead
from .cross_section import KERNELS as CROSS_SECTIONAL, crossing
from .evaluate import MAX_EXPRESSIONS, lookahead, lookback
from .nodes import Node, fields_of
from .parse import MAX_EXPRESSION_CHARS, parse
from .sets import feature_set, label as default_label

# Qlib field names that a kline-store names otherwise.
FIELD_ALIASES = {"factor": "adj_factor"}
META_KEY = FEATURES_KEY   # the manifest entry that describes a features store


@dataclass(frozen=True)
class FeatureField:
    """One output field: its name, expression (text), parsed tree and reach."""

    name: str
    expr: str
    node: Node
    lookback: int | None
    lookahead: int

    def manifest(self) -> dict:
        return {"name": self.name, "expr": self.expr, "lookback": self.lookback, "lookahead": self.lookahead}


@dataclass(frozen=True)
class FeaturePlan:
    """The output fields in order (features, then the label when there is one)."""

    fields: tuple[FeatureField, ...]
    label: str | None
    sets: tuple[str, ...]
    universe: str | None = None   # cross-sections over this universe's members (None: every symbol)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    @property
    def max_lookback(self) -> int | None:
        """Bars of history an update must read back (None: some field needs the whole series)."""
        backs = [f.lookback for f in self.fields]
        return None if any(b is None for b in backs) else max(backs, default=0)

    @property
    def max_lookahead(self) -> int:
        return max((f.lookahead for f in self.fields), default=0)

    def inputs(self) -> frozenset[str]:
        """The store fields the expressions read ($close -> "close")."""
        return frozenset().union(*(fields_of(f.node) for f in self.fields))

    def manifest(self) -> dict:
        out = {"fields": [f.manifest() for f in self.fields], "label": self.label, "sets": list(self.sets)}
        return {**out, "universe": self.universe} if self.universe is not None else out


def _named(text: str, where: str) -> tuple[str, str]:
    """'NAME=EXPR' -> (NAME, EXPR); the name is a word (it becomes a store field)."""
    name, sep, expr = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier() or not expr.strip():
        raise InputError(f"{where} {text!r}: expected NAME=EXPRESSION, NAME a word (letters, digits, _)")
    return name, expr.strip()


def read_expr_file(path: str | os.PathLike) -> list[tuple[str, str]]:
    """A file of ``NAME=EXPR`` lines (blank lines and lines starting with # are skipped)."""
    p = Path(path)
    try:
        if p.is_file() and p.stat().st_size > MAX_EXPRESSIONS * (MAX_EXPRESSION_CHARS // 16):
            raise InputError(f"{p}: {p.stat().st_size:,} bytes, more than an expression file of "
                             f"{MAX_EXPRESSIONS:,} expressions may need; split it")
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: cannot read the expression file ({getattr(exc, 'strerror', None) or exc})") from None
    out = []
    for k, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                out.append(_named(line.strip(), "expression"))
            except InputError as exc:
                raise InputError(f"{p}: line {k}: {exc}") from None
    return out


def _field(name: str, expr: str) -> FeatureField:
    node = parse(expr)
    return FeatureField(name, expr, node, lookback(node), lookahead(node))


def make_plan(sets: Sequence[str] | str | None = ("alpha158",), exprs: Mapping[str, str] | Iterable[str] | None = None,
              label: str | None = "default", files: Sequence[str | os.PathLike] = (),
              universe: str | None = None) -> FeaturePlan:
    """Resolve named sets, the user's expressions and the label into one checked plan.

    Args:
        sets: names of feature sets (``alpha158``, ``alpha360``); a string for one.
        exprs: ``{name: expr}`` or ``["NAME=EXPR", ...]``.
        label: "default" (Qlib's LABEL0), None (no label), an expression (named LABEL0) or ``NAME=EXPR``.
        files: files of ``NAME=EXPR`` lines.
        universe: the universe whose members each day's cross-sections hold (cross-sectional operators only).

    Raises:
        InputError: an unknown set, a bad expression (naming it and the position), a name used twice, no field,
            a universe given to a plan without cross-sectional operators.
    """
    sets = (sets,) if isinstance(sets, str) else tuple(sets or ())
    pairs: list[tuple[str, str, str]] = []       # (name, expr, where it came from)
    for s in sets:
        pairs += [(n, e, f"set {s}") for n, e in feature_set(s).items()]
    if isinstance(exprs, Mapping):
        pairs += [(str(n), str(e), "expression") for n, e in exprs.items()]
    elif exprs is not None:
        if isinstance(exprs, str):
            exprs = [exprs]
        pairs += [(*_named(str(t), "expression"), "expression") for t in exprs]
    for f in files:
        pairs += [(n, e, str(f)) for n, e in read_expr_file(f)]
    label_name = None
    if label is not None:
        if label == "default":
            (label_name, label_expr), = default_label().items()
        elif "=" in label and _is_named(label):
            label_name, label_expr = _named(label, "label")
        else:
            label_name, label_expr = "LABEL0", label
        pairs.append((label_name, label_expr, "label"))
    if not pairs:
        raise InputError("features: nothing to compute; give --set, --expr, --file or --label")
    if len(pairs) > MAX_EXPRESSIONS:
        raise InputError(f"features: {len(pairs):,} expressions, more than the {MAX_EXPRESSIONS:,} one features "
                         "store may hold; split them into several stores")
    seen: dict[str, str] = {}
    for name, _, where in pairs:
        if not name.isidentifier():
            raise InputError(f"{where}: feature name {name!r} is not a word (letters, digits, _)")
        if name.lower() in seen:
            raise InputError(f"feature name {name!r} is used twice ({seen[name.lower()]} and {where}); "
                             "rename one (NAME=EXPR)")
        seen[name.lower()] = where
    fields = tuple(_field(n, e) for n, e, _ in pairs)
    if universe is not None and not any(crossing(f.node) for f in fields):
        raise InputError(f"universe {universe!r}: no expression holds a cross-sectional operator "
                         f"({', '.join(CROSS_SECTIONAL)}), so it would change nothing; datasets and exports take "
                         "universe=NAME for the rows")
    return FeaturePlan(fields, label_name, sets, universe)


def _is_named(text: str) -> bool:
    """'NAME=EXPR' rather than an expression holding '==' / '<=' / '>=' / '!='."""
    name, _, rest = text.partition("=")
    return name.strip().isidentifier() and not rest.startswith("=")


def plan_from_manifest(m: dict, path: Path) -> FeaturePlan:
    """The plan a features store was made with, read back from its (untrusted) manifest.

    Raises:
        StoreError: not a features store, or its description is damaged (naming what).
    """
    meta = m.get(META_KEY)
    if not isinstance(meta, dict) or not isinstance(meta.get("fields"), list):
        raise StoreError(f"{path}: not a features store (its manifest has no '{META_KEY}' entry; make one with "
                         "`kline-store features STORE -o OUT`)")
    out = []
    for k, f in enumerate(meta["fields"]):
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(f.get("expr"), str):
            raise StoreError(f"{path}: manifest key '{META_KEY}.fields[{k}]' is not a feature description")
        try:
            out.append(_field(f["name"], f["expr"]))
        except InputError as exc:
            raise StoreError(f"{path}: manifest key '{META_KEY}.fields[{k}]': {exc}") from None
    if [f.name for f in out] != list(m.get("fields", [])):
        raise StoreError(f"{path}: manifest key '{META_KEY}.fields' disagrees with the store's fields")
    label = meta.get("label")
    if label is not None and label not in m["fields"]:
        raise StoreError(f"{path}: manifest key '{META_KEY}.label' names no field")
    sets = meta.get("sets") if isinstance(meta.get("sets"), list) else []
    universe = meta.get("universe")
    if universe is not None and not isinstance(universe, str):
        raise StoreError(f"{path}: manifest key '{META_KEY}.universe' is not a universe name")
    return FeaturePlan(tuple(out), label, tuple(str(s) for s in sets), universe)


def field_roles(m: dict) -> tuple[tuple[str, ...] | None, str | None, tuple[tuple[str, int], ...]]:
    """What a features store says of its fields, for the datasets (``samples.spec.FieldRoles``): its default
    inputs (every feature but the label), its label, each field's reach. A bar store says nothing."""
    meta = m.get(META_KEY)
    if not isinstance(meta, dict) or not isinstance(meta.get("fields"), list):
        return None, None, ()
    label = meta.get("label") if isinstance(meta.get("label"), str) else None
    names = [f for f in m.get("fields", []) if f != label]
    return tuple(names) or None, label, tuple((f, field_lookahead(m, f)) for f in m.get("fields", []))


__all__ = ["FIELD_ALIASES", "FeatureField", "FeaturePlan", "META_KEY", "field_lookahead", "field_roles", "make_plan",
           "plan_from_manifest", "read_expr_file"]
