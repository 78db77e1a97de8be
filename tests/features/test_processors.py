"""kline_store.features.processors and fit against Qlib 0.9.7's own processor classes and DataHandlerLP.

Hypothesis draws panels (shapes, missing symbol rows, NaN, whole-NaN columns, infinities, ties, near-ties); one
long-lived process in Qlib's virtualenv (helpers_qlib_processors.py, Qlib imported once) runs every spec on each
panel as a (datetime, instrument) frame (float64 holding the float32 values: see frame() there), and ours must
agree: NaN where Qlib has NaN, the same infinity, rtol 1e-5 and atol 1e-6 elsewhere, the same rows kept. The
fitted states must not depend on anything outside the train dates.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kline_store.errors import InputError
from kline_store.features.fit import Pipeline, RobustZScoreNorm, ZScoreNorm
from kline_store.features.processors import (
    CSRankNorm, CSZScoreNorm, DropnaLabel, DropnaProcessor, Fillna, ProcessInf, Processor,
)

HERE = Path(__file__).parent
QLIB_CANDIDATES = [Path(__file__).parents[2] / ".venv-qlib" / "bin" / "python"]

# One list drives both sides: [Qlib class name, Qlib kwargs], fields_group as Qlib names it.
PROCS = {
    "cs_z_all": ["CSZScoreNorm", {"fields_group": None}],
    "cs_z_label": ["CSZScoreNorm", {"fields_group": "label"}],
    "cs_robust_feature": ["CSZScoreNorm", {"fields_group": "feature", "method": "robust"}],
    "cs_rank_all": ["CSRankNorm", {"fields_group": None}],
    "cs_rank_feature": ["CSRankNorm", {"fields_group": "feature"}],
    "z_feature": ["ZScoreNorm", {"fields_group": "feature"}],
    "z_all": ["ZScoreNorm", {"fields_group": None}],
    "robust_feature": ["RobustZScoreNorm", {"fields_group": "feature"}],
    "robust_all_noclip": ["RobustZScoreNorm", {"fields_group": None, "clip_outlier": False}],
    "inf": ["ProcessInf", {}],
    "fillna_all": ["Fillna", {}],
    "fillna_feature": ["Fillna", {"fields_group": "feature", "fill_value": -1.5}],
    "dropna_label": ["DropnaLabel", {}],
    "dropna_feature": ["DropnaProcessor", {"fields_group": "feature"}],
}
HANDLERS = {
    "h_append": {"infer": [["ProcessInf", {}], ["ZScoreNorm", {"fields_group": "feature"}],
                           ["Fillna", {"fields_group": "feature"}]],
                 "learn": [["DropnaLabel", {}], ["CSRankNorm", {"fields_group": "label"}]],
                 "process_type": "append"},
    # learn fits after DropnaLabel: the dropped rows must not count in the cross section nor in the fit
    "h_independent": {"infer": [["RobustZScoreNorm", {"fields_group": "feature"}], ["Fillna", {}]],
                      "learn": [["DropnaLabel", {}], ["CSZScoreNorm", {"fields_group": "feature"}],
                                ["ZScoreNorm", {"fields_group": None}]],
                      "process_type": "independent"},
}
OURS = {"CSZScoreNorm": CSZScoreNorm, "CSRankNorm": CSRankNorm, "ZScoreNorm": ZScoreNorm,
        "RobustZScoreNorm": RobustZScoreNorm, "ProcessInf": ProcessInf, "Fillna": Fillna,
        "DropnaLabel": DropnaLabel, "DropnaProcessor": DropnaProcessor}


def ours(spec: list, n_feat: int, n_cols: int) -> Processor:
    """Our processor for a Qlib spec: fields_group becomes an index list, DropnaLabel's default included."""
    name, kwargs = spec[0], dict(spec[1])
    group = kwargs.pop("fields_group", "label" if name == "DropnaLabel" else None)
    fields = {None: None, "feature": list(range(n_feat)), "label": list(range(n_feat, n_cols))}[group]
    return OURS[name](fields, **kwargs)


def pipeline(h: dict, n_feat: int, n_cols: int) -> Pipeline:
    return Pipeline(infer=[ours(p, n_feat, n_cols) for p in h["infer"]],
                    learn=[ours(p, n_feat, n_cols) for p in h["learn"]], process_type=h["process_type"])


def run_ours(case: dict, device: str = "cpu") -> dict[str, np.ndarray]:
    """Every spec on the case, named as the Qlib side names its outputs."""
    x = torch.as_tensor(case["x"], device=device)
    present = torch.as_tensor(case["present"], device=device)
    train = torch.zeros(x.shape[0], dtype=torch.bool, device=device)
    train[case["fit_lo"]:case["fit_hi"] + 1] = True
    n_feat, n_cols = case["n_feat"], x.shape[-1]
    out = {}
    for name, spec in PROCS.items():
        proc = ours(spec, n_feat, n_cols)
        out[name] = proc.apply(x, present, proc.fit(x, present, train))
    for name, h in HANDLERS.items():
        pipe = pipeline(h, n_feat, n_cols)
        out[name + ".infer"], out[name + ".learn"] = pipe.apply(x, present, pipe.fit(x, present, train))
    return {k: (v.x.cpu().numpy(), v.present.cpu().numpy()) for k, v in out.items()}


# ---------------------------------------------------------------- panels


@st.composite
def cases(draw) -> dict:
    """A panel with features and one label: values continuous or on a coarse grid (ties, constant columns whose
    mean is exact on both sides) or just off it (near-ties), NaN cells and whole-NaN columns, ±inf, absent
    symbol rows, a fit range."""
    d, s, n_feat = draw(st.integers(1, 12)), draw(st.integers(1, 8)), draw(st.integers(1, 3))
    p_absent, p_nan, p_inf, p_grid, jitter = (draw(st.sampled_from(ps)) for ps in (
        [0, 0.2, 0.6], [0, 0.1, 0.4], [0, 0.05, 0.25], [0, 0.5, 1.0], [0, 0, 1e-4]))
    nan_cols = draw(st.lists(st.integers(0, n_feat), max_size=2))
    lo = draw(st.integers(0, d - 1))
    hi = draw(st.integers(lo, d - 1))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = (d, s, n_feat + 1)
    grid = rng.integers(-8, 9, shape) / 4 + jitter * rng.uniform(-1, 1, shape)
    x = np.where(rng.random(shape) < p_grid, grid, rng.uniform(-5, 5, shape))
    x[rng.random(shape) < p_nan] = np.nan
    inf = rng.random(shape) < p_inf
    x[inf] = np.where(rng.random(shape) < 0.5, np.inf, -np.inf)[inf]
    x[..., nan_cols] = np.nan
    present = rng.random((d, s)) >= p_absent
    if not present.any():  # Qlib cannot process a frame without rows
        present[rng.integers(d), rng.integers(s)] = True
    return {"x": x.astype(np.float32), "present": present, "n_feat": n_feat, "fit_lo": lo, "fit_hi": hi}


# ---------------------------------------------------------------- Qlib's side


class QlibWorker:
    """helpers_qlib_processors.py running in Qlib's virtualenv: one process for the module, a request a case."""

    def __init__(self, python: Path, workdir: Path) -> None:
        self.workdir = workdir
        specs = [{"name": k, "proc": v} for k, v in PROCS.items()] + [{"name": k, "handler": v}
                                                                      for k, v in HANDLERS.items()]
        (workdir / "specs.json").write_text(json.dumps(specs))
        self.proc = subprocess.Popen([str(python), str(HERE / "helpers_qlib_processors.py"),
                                      str(workdir / "specs.json")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout.readline().strip() == "ready", "Qlib's side did not start"

    def run(self, case: dict) -> dict[str, np.ndarray]:
        path_in, path_out = self.workdir / "case.npz", self.workdir / "out.npz"
        np.savez(path_in, **case)
        self.proc.stdin.write(f"{path_in} {path_out}\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        assert reply.startswith("ok"), json.loads(reply[6:]) if reply.startswith("error") else "Qlib's side died"
        return dict(np.load(path_out))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def qlib(tmp_path_factory):
    env = os.environ.get("KLINE_QLIB_PYTHON")
    candidates = [Path(env)] if env else QLIB_CANDIDATES
    python = next((p for p in candidates if p.exists()), None)
    if python is None:
        pytest.skip(f"Qlib's python not found ({', '.join(map(str, candidates))}); set KLINE_QLIB_PYTHON")
    worker = QlibWorker(python, tmp_path_factory.mktemp("qlib_processors"))
    yield worker
    worker.close()


def assert_agrees(name: str, ours_x: np.ndarray, ours_kept: np.ndarray, theirs_x: np.ndarray,
                  theirs_kept: np.ndarray) -> None:
    """Same rows kept; on them NaN where Qlib has NaN, the same infinity, close where Qlib is finite."""
    assert np.array_equal(ours_kept, theirs_kept), f"{name}: rows kept differ"
    a, b = ours_x[theirs_kept].astype(np.float64), theirs_x[theirs_kept]
    with np.errstate(invalid="ignore"):  # inf - inf where Qlib has an infinity: decided by the a == b branch
        close = np.isfinite(a) & (np.abs(a - b) <= 1e-6 + 1e-5 * np.abs(b))
    ok = np.where(np.isfinite(b), close, np.isnan(a) & np.isnan(b) | (a == b))
    bad = np.argwhere(~ok)
    assert ok.all(), f"{name}: {len(bad)} cells differ, first {bad[0]}: ours {a[tuple(bad[0])]}, " \
                     f"Qlib {b[tuple(bad[0])]}"


@settings(max_examples=20, deadline=None)
@given(case=cases())
def test_every_processor_agrees_with_qlib(qlib, case):
    theirs = qlib.run(case)
    for name, (x, kept) in run_ours(case).items():
        assert_agrees(name, x, kept, theirs[f"{name}.x"], theirs[f"{name}.kept"])


# ---------------------------------------------------------------- no leakage, state, inputs


def fitted(case: dict, train: torch.Tensor) -> dict[str, dict]:
    """The state of every fitted spec and pipeline on the case, fitted on train."""
    x, present = torch.as_tensor(case["x"]), torch.as_tensor(case["present"])
    n_feat, n_cols = case["n_feat"], x.shape[-1]
    out = {name: ours(spec, n_feat, n_cols).fit(x, present, train) for name, spec in PROCS.items()}
    out.update({name: pipeline(h, n_feat, n_cols).fit(x, present, train) for name, h in HANDLERS.items()})
    return out


@settings(max_examples=30, deadline=None)
@given(case=cases(), data=st.data())
def test_state_depends_on_train_dates_only(case, data):
    d = case["x"].shape[0]
    train = torch.tensor(data.draw(st.lists(st.booleans(), min_size=d, max_size=d)))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    other = dict(case, x=case["x"].copy(), present=case["present"].copy())
    outside = ~train.numpy()
    noise = rng.normal(0, 100, other["x"].shape).astype(np.float32)
    noise[rng.random(noise.shape) < 0.2] = np.inf
    other["x"][outside] = np.where(rng.random(noise.shape) < 0.2, np.nan, noise)[outside]
    other["present"][outside] = rng.random(other["present"].shape)[outside] < 0.5
    torch.testing.assert_close(fitted(other, train), fitted(case, train), rtol=0, atol=0, equal_nan=True)


@settings(max_examples=15, deadline=None)
@given(case=cases())
def test_absent_rows_pass_through_and_state_round_trips(case):
    x, present = torch.as_tensor(case["x"]), torch.as_tensor(case["present"])
    train = torch.ones(x.shape[0], dtype=torch.bool)
    pipe = pipeline(HANDLERS["h_independent"], case["n_feat"], x.shape[-1])
    states = pipe.fit(x, present, train)
    assert all(isinstance(v, torch.Tensor) for s in states.values() for v in s.values())
    buf = io.BytesIO()
    torch.save(states, buf)
    buf.seek(0)
    resumed = pipe.apply(x, present, torch.load(buf))
    direct = pipe.apply(x, present, states)
    for got, want in zip(resumed, direct):
        torch.testing.assert_close(got.x, want.x, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(got.present, want.present)
    for view in direct:
        torch.testing.assert_close(view.x[~present], x[~present], rtol=0, atol=0, equal_nan=True)


def test_bad_inputs_are_input_errors():
    x, present = torch.zeros(3, 2, 2), torch.ones(3, 2, dtype=torch.bool)
    with pytest.raises(InputError, match="not usable for inference"):
        Pipeline(infer=[DropnaLabel([1])])
    with pytest.raises(InputError, match="present"):
        CSRankNorm().apply(x, present[:2], {})
    with pytest.raises(InputError, match="out of range"):
        Fillna([2]).apply(x, present, {})
    with pytest.raises(InputError, match="train"):
        ZScoreNorm().fit(x, present, torch.ones(2, dtype=torch.bool))
    with pytest.raises(InputError, match="fitted on columns"):
        ZScoreNorm([0]).apply(x, present, ZScoreNorm([1]).fit(x, present, torch.ones(3, dtype=torch.bool)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@settings(max_examples=10, deadline=None)
@given(case=cases())
def test_cuda_matches_cpu(case):
    cpu, gpu = run_ours(case), run_ours(case, "cuda")
    for name, (x, kept) in cpu.items():
        assert np.array_equal(gpu[name][1], kept), name
        np.testing.assert_allclose(gpu[name][0], x, rtol=1e-6, atol=1e-7, equal_nan=True, err_msg=name)
