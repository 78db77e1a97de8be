"""The one place that picks how a rolling kernel runs: compiled (numba, compiled.py) on the CPU, torch on a
GPU and wherever numba is missing or KLINE_STORE_KERNELS=torch asks for it (the reference implementation the
compiled kernels are tested against, cell for cell).

numba compiles a kernel on its first call (a few seconds, once per kernel and dtype) and caches the machine
code across runs in $NUMBA_CACHE_DIR, which defaults here to kline-store's cache folder
($XDG_CACHE_HOME or ~/.cache)/kline-store/numba instead of a __pycache__ beside the installed package, which
may not be writable.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor

from kline_store.errors import InputError

_ENV = "KLINE_STORE_KERNELS"
_compiled = None  # the compiled module once imported; False: numba is missing


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "kline-store" / "numba")


def _load():
    global _compiled
    if _compiled is None:
        os.environ.setdefault("NUMBA_CACHE_DIR", _cache_dir())
        try:
            from . import compiled
            import numba
            if not numba.config.CACHE_DIR:  # numba imported before us, without NUMBA_CACHE_DIR
                numba.config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]
            _compiled = compiled
        except ImportError:
            _compiled = False
    return _compiled


def engine() -> str:
    """"numba" or "torch": what CPU tensors use now (KLINE_STORE_KERNELS=torch|numba, default numba when
    it imports)."""
    want = os.environ.get(_ENV, "").strip().lower()
    if want not in ("", "numba", "torch"):
        raise InputError(f"{_ENV}={want!r}: expected 'numba' or 'torch'")
    if want == "torch":
        return "torch"
    if _load():
        return "numba"
    if want == "numba":
        raise InputError(f"{_ENV}=numba but numba does not import: pip install 'numba>=0.60'")
    return "torch"


def compiled_for(*xs: Tensor):
    """The compiled module when these tensors should use it (all on the CPU, numba chosen), else None."""
    if any(x.device.type != "cpu" for x in xs) or engine() != "numba":
        return None
    return _compiled


def _array(x: Tensor):
    return x.detach().contiguous().numpy()


def _out(x: Tensor) -> Tensor:
    return torch.empty(x.shape, dtype=torch.float64)


def window_sum(kern, z: Tensor, n: int) -> Tensor:
    out = _out(z)
    kern.window_sum(_array(z.to(torch.float64)), n, out.numpy())
    return out


def window_extreme(kern, z: Tensor, n: int, largest: bool) -> Tensor:
    out = _out(z)
    fill = float("-inf") if largest else float("inf")
    kern.window_extreme(_array(z.to(torch.float64)), n, largest, fill, out.numpy())
    return out


def quantile(kern, x: Tensor, n: int, q: float) -> Tensor:
    out = _out(x)
    kern.quantile(_array(x), n, float(q), out.numpy())
    return out


def rank(kern, x: Tensor, n: int) -> Tensor:
    out = _out(x)
    kern.rank(_array(x), n, out.numpy())
    return out


def arg_extreme(kern, x: Tensor, first: Tensor, last: Tensor, n: int, largest: bool) -> Tensor:
    out = _out(x)
    kern.arg_extreme(_array(x), _array(first.to(torch.int64)), _array(last.to(torch.int64)), n, largest,
                     out.numpy())
    return out


def flat_windows(kern, x: Tensor, n: int) -> Tensor:
    """Windows whose valid values are all equal (and at least one): max == min of them, in one pass."""
    out = torch.empty(x.shape, dtype=torch.bool)
    kern.flat_windows(_array(x), n, out.numpy())
    return out


def _f64(x: Tensor):
    return _array(x.to(torch.float64))


def centred_moments(kern, raw: Tensor, v: Tensor, centre: Tensor, n: int) -> Tensor:
    """[S, T, 2]: moments.Prepared.moments, compiled."""
    out = torch.empty((*raw.shape, 2), dtype=torch.float64)
    kern.centred_moments(_f64(raw), _f64(v), _f64(centre), n, out.numpy())
    return out


def co_moment(kern, ra: Tensor, rb: Tensor, v: Tensor, ca: Tensor, cb: Tensor, n: int) -> Tensor:
    """moments._co_moment's windows of n bars, compiled."""
    ra, rb = torch.broadcast_tensors(ra, rb)
    out = _out(ra)
    kern.co_moment(_f64(ra), _f64(rb), _f64(v), _f64(ca.expand_as(ra)), _f64(cb.expand_as(ra)), n, out.numpy())
    return out


def position_sums(kern, raw: Tensor, v: Tensor, centre: Tensor, n: int) -> Tensor:
    """[S, T, 3]: moments._position_sums' (sx, sxx, sxy) over windows of n bars, compiled."""
    out = torch.empty((*raw.shape, 3), dtype=torch.float64)
    kern.position_sums(_f64(raw), _f64(v), _f64(centre), n, out.numpy())
    return out


def _view(x: Tensor):
    """x (float64 or bool, on the CPU) as a numpy view, strides kept (numba takes strided arrays)."""
    return x.detach().numpy()


def var_tail(kern, cnt: Tensor, s1: Tensor, s2: Tensor, flat: Tensor) -> Tensor:
    out = _out(cnt)
    kern.var_tail(_view(cnt), _view(s1), _view(s2), _view(flat), out.numpy())
    return out


def pair_tail(kern, cnt: Tensor, sa: Tensor, sb: Tensor, co: Tensor, s2a: Tensor, s2b: Tensor, flat_a: Tensor,
              flat_b: Tensor, corr: bool) -> tuple[Tensor, Tensor]:
    """(num, prod): see compiled.pair_tail."""
    num, prod = _out(cnt), _out(cnt)
    kern.pair_tail(_view(cnt), _view(sa), _view(sb), _view(co), _view(s2a), _view(s2b), _view(flat_a),
                   _view(flat_b), corr, num.numpy(), prod.numpy())
    return num, prod


def window_count(kern, v: Tensor, n: int) -> Tensor:
    out = _out(v)
    kern.window_count(_f64(v), n, out.numpy())
    return out


def central_sums(kern, x: Tensor, n: int, power: int) -> Tensor:
    """[S, T, 3]: rolling._central_sums (count, sum d^2, sum d^power or |d|), compiled."""
    out = torch.empty((*x.shape, 3), dtype=torch.float64)
    kern.central_sums(_f64(x), n, power, out.numpy())
    return out


def weighted_mean(kern, x: Tensor, first: Tensor, n: int) -> Tensor:
    """rolling.r_wma, compiled."""
    out = _out(x)
    kern.weighted_mean(_f64(x), _array(first.to(torch.int64)), n, out.numpy())
    return out


def weighted_window(kern, x: Tensor, weight: Tensor) -> Tensor:
    """smooth._ewm's weighted windows, compiled (the weights computed by the caller, in torch)."""
    out = _out(x)
    kern.weighted_window(_f64(x), _array(weight.to(torch.float64)), out.numpy())
    return out
