"""Named feature sets, expression for expression as Qlib 0.9.7 defines them.

alpha158: Alpha158DL.get_feature_config() with its default config (kbar; price OPEN, HIGH, LOW, VWAP at
window 0; every rolling group at windows 5, 10, 20, 30, 60), in its order and with its names.
alpha360: Alpha360DL.get_feature_config(). label: Alpha158's default label, LABEL0.
alpha101: WorldQuant's 101 formulaic alphas (alpha101.py; not Qlib's), those that need no industry field.
"""

from __future__ import annotations

from kline_store.errors import InputError

from .alpha101 import alpha101

_WINDOWS = (5, 10, 20, 30, 60)

_KBAR = {
    "KMID": "($close-$open)/$open",
    "KLEN": "($high-$low)/$open",
    "KMID2": "($close-$open)/($high-$low+1e-12)",
    "KUP": "($high-Greater($open, $close))/$open",
    "KUP2": "($high-Greater($open, $close))/($high-$low+1e-12)",
    "KLOW": "(Less($open, $close)-$low)/$open",
    "KLOW2": "(Less($open, $close)-$low)/($high-$low+1e-12)",
    "KSFT": "(2*$close-$high-$low)/$open",
    "KSFT2": "(2*$close-$high-$low)/($high-$low+1e-12)",
}

_UP = "Greater($close-Ref($close, 1), 0)"
_DOWN = "Greater(Ref($close, 1)-$close, 0)"
_MOVE = "Abs($close-Ref($close, 1))"
_VUP = "Greater($volume-Ref($volume, 1), 0)"
_VDOWN = "Greater(Ref($volume, 1)-$volume, 0)"
_VMOVE = "Abs($volume-Ref($volume, 1))"
_TURN = "Abs($close/Ref($close, 1)-1)*$volume"

# Alpha158's rolling groups, in Qlib's order: name prefix -> expression of the window d.
_ROLLING = {
    "ROC": lambda d: f"Ref($close, {d})/$close",
    "MA": lambda d: f"Mean($close, {d})/$close",
    "STD": lambda d: f"Std($close, {d})/$close",
    "BETA": lambda d: f"Slope($close, {d})/$close",
    "RSQR": lambda d: f"Rsquare($close, {d})",
    "RESI": lambda d: f"Resi($close, {d})/$close",
    "MAX": lambda d: f"Max($high, {d})/$close",
    "MIN": lambda d: f"Min($low, {d})/$close",  # Qlib's group is called LOW, its features MIN
    "QTLU": lambda d: f"Quantile($close, {d}, 0.8)/$close",
    "QTLD": lambda d: f"Quantile($close, {d}, 0.2)/$close",
    "RANK": lambda d: f"Rank($close, {d})",
    "RSV": lambda d: f"($close-Min($low, {d}))/(Max($high, {d})-Min($low, {d})+1e-12)",
    "IMAX": lambda d: f"IdxMax($high, {d})/{d}",
    "IMIN": lambda d: f"IdxMin($low, {d})/{d}",
    "IMXD": lambda d: f"(IdxMax($high, {d})-IdxMin($low, {d}))/{d}",
    "CORR": lambda d: f"Corr($close, Log($volume+1), {d})",
    "CORD": lambda d: f"Corr($close/Ref($close,1), Log($volume/Ref($volume, 1)+1), {d})",
    "CNTP": lambda d: f"Mean($close>Ref($close, 1), {d})",
    "CNTN": lambda d: f"Mean($close<Ref($close, 1), {d})",
    "CNTD": lambda d: f"Mean($close>Ref($close, 1), {d})-Mean($close<Ref($close, 1), {d})",
    "SUMP": lambda d: f"Sum({_UP}, {d})/(Sum({_MOVE}, {d})+1e-12)",
    "SUMN": lambda d: f"Sum({_DOWN}, {d})/(Sum({_MOVE}, {d})+1e-12)",
    "SUMD": lambda d: f"(Sum({_UP}, {d})-Sum({_DOWN}, {d}))/(Sum({_MOVE}, {d})+1e-12)",
    "VMA": lambda d: f"Mean($volume, {d})/($volume+1e-12)",
    "VSTD": lambda d: f"Std($volume, {d})/($volume+1e-12)",
    "WVMA": lambda d: f"Std({_TURN}, {d})/(Mean({_TURN}, {d})+1e-12)",
    "VSUMP": lambda d: f"Sum({_VUP}, {d})/(Sum({_VMOVE}, {d})+1e-12)",
    "VSUMN": lambda d: f"Sum({_VDOWN}, {d})/(Sum({_VMOVE}, {d})+1e-12)",
    "VSUMD": lambda d: f"(Sum({_VUP}, {d})-Sum({_VDOWN}, {d}))/(Sum({_VMOVE}, {d})+1e-12)",
}


def alpha158() -> dict[str, str]:
    out = dict(_KBAR)
    for field in ("open", "high", "low", "vwap"):
        out[f"{field.upper()}0"] = f"${field}/$close"
    for prefix, make in _ROLLING.items():
        out.update({f"{prefix}{d}": make(d) for d in _WINDOWS})
    return out


def alpha360() -> dict[str, str]:
    out: dict[str, str] = {}
    for field in ("close", "open", "high", "low", "vwap"):
        out.update({f"{field.upper()}{i}": f"Ref(${field}, {i})/$close" for i in range(59, 0, -1)})
        out[f"{field.upper()}0"] = f"${field}/$close"
    out.update({f"VOLUME{i}": f"Ref($volume, {i})/($volume+1e-12)" for i in range(59, 0, -1)})
    out["VOLUME0"] = "$volume/($volume+1e-12)"
    return out


def label() -> dict[str, str]:
    return {"LABEL0": "Ref($close, -2)/Ref($close, -1) - 1"}


_SETS = {"alpha158": alpha158, "alpha360": alpha360, "alpha101": alpha101, "label": label}


def feature_set(name: str) -> dict[str, str]:
    """name -> expression of a known set; InputError naming the known sets otherwise. ``alpha101:FIELD`` is
    alpha101 with its 18 indneutralize alphas, FIELD the store's field of industry codes."""
    if isinstance(name, str) and name.lower().startswith("alpha101:"):
        return alpha101(industry=name.split(":", 1)[1])
    make = _SETS.get(name.lower()) if isinstance(name, str) else None
    if make is None:
        raise InputError(f"unknown feature set {name!r}; known sets: {', '.join(sorted(_SETS))} "
                         "(alpha101:FIELD with an industry field)")
    return make()
