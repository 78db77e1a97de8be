"""Qlib 0.9.7's data processors (qlib/data/dataset/processor.py) as pure torch functions over a panel.

A panel is `x[dates, symbols, columns]` (float) with `present[dates, symbols]` (bool): a row that is not present
is a row Qlib's frame does not have, so it never counts in a statistic, and every processor passes it through
unchanged. Columns hold features and labels alike; Qlib's `fields_group` ("feature", "label", None) is an index
list here (`fields`, None = every column).

Every processor has `fit(x, present, train) -> state` (a plain dict of tensors, empty for the stateless ones;
`train[dates]` is the fit range: only its present rows are read) and `apply(x, present, state) -> Processed`.
Statistics are taken in float64 and the result cast back to x's dtype (Qlib on a float32 frame reduces in float32,
which can be off far more where a cross section holds near-equal values); they work on CPU and CUDA tensors.
The fitted ones (ZScoreNorm, RobustZScoreNorm) and the Pipeline are in fit.py.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch

from kline_store.errors import InputError

from .cross_section import nanmean, nanstd, rank_pct  # noqa: F401  (fit.py and users import them from here)

State = dict[str, torch.Tensor]
NAN = float("nan")


class Processed(NamedTuple):
    """A processor's output: the values, and the rows still present (a dropping processor clears rows)."""

    x: torch.Tensor
    present: torch.Tensor


# ---------------------------------------------------------------- pandas / numpy reductions, NaN-skipping


def nanmedian(v: torch.Tensor, dim: int) -> torch.Tensor:
    """numpy's nanmedian: the mean of the two middle values for an even count (torch.nanmedian takes the lower
    one), NaN for an all-NaN slice (keeps dim)."""
    if v.shape[dim] == 0:
        return v.new_full(v.shape[:dim] + (1,) + v.shape[dim + 1:], NAN)
    if dim % v.ndim != v.ndim - 1:   # sorted along contiguous memory: several times faster than across it
        return nanmedian(v.movedim(dim, -1).contiguous(), -1).movedim(-1, dim)
    ordered = torch.sort(v, dim=dim).values  # NaN sorts last
    n = (~torch.isnan(v)).sum(dim, keepdim=True)
    lo = ((n - 1) // 2).clamp(min=0)
    hi = (n // 2).clamp(max=v.shape[dim] - 1)
    mid = (ordered.gather(dim, lo) + ordered.gather(dim, hi)) / 2
    return torch.where(n > 0, mid, NAN)


# ---------------------------------------------------------------- inputs


def as_panel(x: torch.Tensor | np.ndarray, present: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """x and present as tensors on x's device, checked for shape: [dates, symbols, columns] and [dates, symbols]."""
    x = torch.as_tensor(x)
    present = torch.as_tensor(present, device=x.device)
    if x.ndim != 3 or not x.is_floating_point():
        raise InputError(f"panel: x must be a float [dates, symbols, columns] array, got {x.dtype} {tuple(x.shape)}")
    if present.dtype != torch.bool or tuple(present.shape) != tuple(x.shape[:2]):
        raise InputError(f"panel: present must be bool {tuple(x.shape[:2])}, got {present.dtype} "
                         f"{tuple(present.shape)}")
    return x, present


def as_train(train: torch.Tensor | np.ndarray, x: torch.Tensor) -> torch.Tensor:
    """The fit range as a bool [dates] mask on x's device."""
    train = torch.as_tensor(train, device=x.device)
    if train.dtype != torch.bool or tuple(train.shape) != (x.shape[0],):
        raise InputError(f"train must be a bool [dates] mask of {x.shape[0]} dates, got {train.dtype} "
                         f"{tuple(train.shape)}")
    return train


def resolve_fields(fields: Sequence[int] | None, x: torch.Tensor) -> list[int]:
    """Column indices a processor works on (Qlib's fields_group): None is every column, as in Qlib."""
    n = x.shape[-1]
    if fields is None:
        return list(range(n))
    out = [int(f) for f in fields]
    bad = [f for f in out if not -n <= f < n]
    if bad:
        raise InputError(f"fields {bad} out of range for a panel of {n} columns")
    return [f % n for f in out]


# Cells of one block of dates the vectorised processors work on at once: the block's copies stay in cache, and a
# long panel costs per cell what a short one does (a column at a time strides through the whole panel).
BLOCK_CELLS = 1 << 20


def columns(fields: list[int]) -> slice | torch.Tensor:
    """The fields as an index of x's last dim: a slice when they are a run (a view), else an index tensor."""
    if fields and fields == list(range(fields[0], fields[0] + len(fields))):
        return slice(fields[0], fields[0] + len(fields))
    return torch.tensor(fields, dtype=torch.long)


def by_dates(x: torch.Tensor, present: torch.Tensor, fields: list[int], fn) -> torch.Tensor:
    """x with the columns in fields replaced, on present rows, by fn(values [dates, symbols, k], present), a
    block of dates at a time (every column at once: no pass per column). fn works cell by cell."""
    out = x.clone()
    if not fields:
        return out
    cols = columns(fields)
    step = max(1, BLOCK_CELLS // max(1, x.shape[1] * len(fields)))
    for lo in range(0, x.shape[0], step):
        block = x[lo: lo + step][..., cols]
        here = present[lo: lo + step, :, None]
        out[lo: lo + step, :, cols] = torch.where(here, fn(block, here), block)
    return out


def per_column(x: torch.Tensor, present: torch.Tensor, fields: list[int], fn) -> torch.Tensor:
    """x with each column in fields replaced by fn(column) on present rows. fn gets a float64 [dates, symbols]
    column whose absent rows are NaN (so no statistic sees them); one column at a time bounds the memory."""
    out = x.clone()
    for f in fields:
        col = x[..., f].double().masked_fill(~present, NAN)
        out[..., f] = torch.where(present, fn(col).to(x.dtype), x[..., f])
    return out


# ---------------------------------------------------------------- processors


class Processor:
    """Base of every processor, as qlib's Processor: fit learns a state (nothing here), apply transforms."""

    for_infer: bool = True  # Qlib's is_for_infer(): whether it may run in infer_processors

    def fit(self, x: torch.Tensor, present: torch.Tensor, train: torch.Tensor) -> State:
        """Nothing to learn: the stateless processors work per date or per cell."""
        return {}

    def apply(self, x: torch.Tensor, present: torch.Tensor, state: State) -> Processed:
        raise NotImplementedError


class CSZScoreNorm(Processor):
    """qlib CSZScoreNorm: per date, across present symbols, per column.

    method="zscore": (x - mean) / std, pandas' std (ddof=1): NaN for a single value or a constant column.
    method="robust": qlib.utils.data.robust_zscore: (x - median) / MAD / 1.4826 clipped to [-3, 3], with no
    epsilon (MAD 0 makes ±3, and NaN for values at the median, as Qlib)."""

    def __init__(self, fields: Sequence[int] | None = None, method: str = "zscore") -> None:
        if method not in ("zscore", "robust"):
            raise InputError(f"CSZScoreNorm: method must be 'zscore' or 'robust', got {method!r}")
        self.fields, self.method = fields, method

    def apply(self, x: torch.Tensor, present: torch.Tensor, state: State) -> Processed:
        x, present = as_panel(x, present)
        fn = _robust_zscore if self.method == "robust" else _zscore
        return Processed(per_column(x, present, resolve_fields(self.fields, x), fn), present)


def _zscore(col: torch.Tensor) -> torch.Tensor:
    return (col - nanmean(col, 1)) / nanstd(col, 1, ddof=1)


def _robust_zscore(col: torch.Tensor) -> torch.Tensor:
    dev = col - nanmedian(col, 1)
    mad = nanmedian(dev.abs(), 1)
    return (dev / mad / 1.4826).clamp(-3, 3)  # two divisions in Qlib's order; clamp keeps NaN


class CSRankNorm(Processor):
    """qlib CSRankNorm: per date, (rank(pct=True) - 0.5) * 3.46 across present symbols, ties averaged,
    NaN kept; the percentage divides by the count of non-NaN values that date."""

    def __init__(self, fields: Sequence[int] | None = None) -> None:
        self.fields = fields

    def apply(self, x: torch.Tensor, present: torch.Tensor, state: State) -> Processed:
        x, present = as_panel(x, present)
        out = per_column(x, present, resolve_fields(self.fields, x), lambda col: (rank_pct(col) - 0.5) * 3.46)
        return Processed(out, present)


class ProcessInf(Processor):
    """qlib ProcessInf: per date and column, +inf and -inf alike become the mean of that date's non-inf values
    (NaN skipped; NaN when none is left). Qlib runs it on every column; fields narrows it."""

    def __init__(self, fields: Sequence[int] | None = None) -> None:
        self.fields = fields

    def apply(self, x: torch.Tensor, present: torch.Tensor, state: State) -> Processed:
        x, present = as_panel(x, present)

        def replace(col: torch.Tensor) -> torch.Tensor:
            inf = torch.isinf(col)
            return torch.where(inf, nanmean(col.masked_fill(inf, NAN), 1), col)

        return Processed(per_column(x, present, resolve_fields(self.fields, x), replace), present)


class Fillna(Processor):
    """qlib Fillna: NaN becomes fill_value (infinities stay) in the fields, on present rows."""

    def __init__(self, fields: Sequence[int] | None = None, fill_value: float = 0.0) -> None:
        self.fields, self.fill_value = fields, float(fill_value)

    def apply(self, x: torch.Tensor, present: torch.Tensor, state: State) -> Processed:
        x, present = as_panel(x, present)
        fill = self.fill_value
        out = by_dates(x, present, resolve_fields(self.fields, x),
                       lambda v, _here: torch.where(torch.isnan(v), fill, v))
        return Processed(out, present)


class DropnaProcessor(Processor):
    """qlib DropnaProcessor: drops the rows with a NaN in any of the fields (not inf), by clearing them from
    `present`; x is unchanged. With fields = the feature columns it is what Qlib's docs call DropnaFeature
    (0.9.7 has no class of that name)."""

    def __init__(self, fields: Sequence[int] | None = None) -> None:
        self.fields = fields

    def apply(self, x: torch.Tensor, present: torch.Tensor, state: State) -> Processed:
        x, present = as_panel(x, present)
        nan = torch.isnan(x[..., resolve_fields(self.fields, x)]).any(-1)
        return Processed(x, present & ~nan)


class DropnaLabel(DropnaProcessor):
    """qlib DropnaLabel: DropnaProcessor on the label columns (required here: the panel has no column groups).
    Not usable for inference (for_infer False): Qlib only allows it in learn_processors."""

    for_infer = False

    def __init__(self, fields: Sequence[int]) -> None:
        super().__init__(fields)
