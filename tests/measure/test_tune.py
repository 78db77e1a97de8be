"""Tuner: the search policy as a pure function over throughputs, config storage, and one real search."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kline_store.measure import tune as tn
from kline_store.feed.config import load_config
from kline_store.errors import InputError


def run_policy(speed, *, cores: int, cuda: bool):
    """Drive next_trial with a fake throughput function; return the trials (no timing involved)."""
    trials: list[tn.Trial] = []
    while (p := tn.next_trial(trials, cores=cores, cuda=cuda)) is not None:
        stage, cfg = p
        trials.append(tn.Trial(stage, cfg, speed(cfg)))
        assert len(trials) < 50
    return trials


def test_worker_ladder():
    assert tn.worker_ladder(1) == [0, 1]
    assert tn.worker_ladder(2) == [0, 1, 2]
    assert tn.worker_ladder(6) == [0, 1, 2, 4, 6]
    assert tn.worker_ladder(8) == [0, 1, 2, 4, 8]


def test_ladder_stops_at_first_step_below_threshold():
    # processes: 0 -> 100, 1 -> 180, 2 -> 185 (+2.8 %: stop), 4 would be 400 but is never tried
    table = {0: 100.0, 1: 180.0, 2: 185.0, 4: 400.0, 8: 900.0, 16: 1.0}

    def speed(cfg):
        if cfg["backend"] == "processes":
            return table[cfg["num_workers"]]
        return 50.0 * cfg["num_workers"]

    trials = run_policy(speed, cores=16, cuda=False)
    workers = [t.config["num_workers"] for t in trials if t.stage == "workers"]
    assert workers == [0, 1, 2]
    threads = [t.config["num_workers"] for t in trials if t.stage == "threads"]
    assert threads == [1, 2, 4, 8, 16]  # 50, 100, 200, 400, 800: each step > 5 %
    best = tn.recommend(trials)
    assert best.config["backend"] == "threads" and best.config["num_workers"] == 16
    assert {t.stage for t in trials} == {"workers", "threads", "prefetch"}  # no CUDA: no pinned stage


def test_prefetch_and_pinned_stages_and_tie_break():
    def speed(cfg):
        base = {0: 100.0, 1: 200.0, 2: 300.0}[cfg["num_workers"]]
        if cfg["backend"] == "threads":
            base *= 1.02  # within noise of processes: the cheaper backend (threads) wins the tie
        base *= {2: 1.0, 4: 1.3, 8: 1.31}[cfg["prefetch"]]  # 8 is within 5 % of 4: 4 is chosen
        return base * (1.2 if cfg["pin_memory"] else 1.0)

    trials = run_policy(speed, cores=2, cuda=True)
    stages = [t.stage for t in trials]
    assert stages == ["workers"] * 3 + ["threads"] * 2 + ["prefetch"] * 2 + ["pinned"]
    assert trials[0].config["pin_memory"] is True  # with CUDA the ladders start pinned
    assert trials[-1].config["pin_memory"] is False
    best = tn.recommend(trials).config
    assert best == {"backend": "threads", "num_workers": 2, "prefetch": 4, "pin_memory": True}
    # every proposal is distinct: nothing measured twice
    assert len({json.dumps(t.config, sort_keys=True) for t in trials}) == len(trials)


def test_flat_throughput_prefers_zero_workers():
    trials = run_policy(lambda cfg: 1000.0, cores=4, cuda=False)
    assert [t.stage for t in trials] == ["workers", "workers", "threads", "threads"]  # no prefetch at 0 workers
    assert tn.recommend(trials).config["num_workers"] == 0


def test_recommend_rejects_empty():
    with pytest.raises(InputError):
        tn.recommend([])


def test_tune_driver_with_injected_measure(tmp_path):
    store = tmp_path / "st"
    store.mkdir()
    seen = []
    res = tn.tune(store, 16, 32, cores=2, measure=lambda c: 10.0 + c["num_workers"], progress=seen.append)
    assert len(seen) == len(res.trials) and res.saved_to == store / "tune.json"
    assert load_config(store, 16, 32, "cpu") == res.best.config
    d = res.as_dict()
    assert d["recommended"] == res.best.config and sum(r["chosen"] for r in d["trials"]) == 1
    with pytest.raises(InputError):
        tn.tune(store, 0, 32, measure=lambda c: 1.0)


def test_measure_throughput_counts_samples_with_fake_clock():
    t = [0.0]

    def clock():
        return t[0]

    def make():
        def gen():
            for _ in range(20):
                t[0] += 0.5
                yield np.zeros((4, 2))
        return gen()

    # 3 warm-up batches (clock starts at t=1.5), then 4 samples per 0.5 s until 2 s have passed
    assert tn.measure_throughput(make, seconds=2.0, clock=clock) == pytest.approx(8.0)
    assert tn.measure_throughput(lambda: iter([]), seconds=1.0, clock=clock) == 0.0


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    from kline_store.store import create_store

    rng = np.random.default_rng(1)
    n_sym, n_dates = 4, 150
    fields = ["open", "high", "low", "close", "volume"]
    panel = rng.uniform(1, 2, (n_sym, n_dates, len(fields))).astype(np.float32)
    dates = np.arange(np.datetime64("2022-01-01"), np.datetime64("2022-01-01") + n_dates)
    path = tmp_path_factory.mktemp("tune") / "st"
    create_store(path, panel, [f"S{i}" for i in range(n_sym)], dates, fields)
    return path


def test_real_search_on_small_store(small_store):
    res = tn.tune(small_store, 8, 32, seconds=0.05, cores=2)
    stages = [t.stage for t in res.trials]
    assert stages[0] == "workers" and "threads" in stages  # the ladder ran, then threads were tried
    assert all(t.samples_per_s > 0 for t in res.trials)
    assert res.best in res.trials and res.saved_to == small_store / "tune.json"
    from kline_store import KlineDataset

    ds = KlineDataset(small_store, window=8)
    assert ds.loader(batch_size=32, config="auto").config == res.best.config


def test_cli_tune_prints_table_and_json(small_store):
    from conftest import run_cli

    r = run_cli("tune", str(small_store), "--window", "8", "--batch-size", "16", "--seconds", "0.05",
                "--no-save", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    chosen = [t for t in data["trials"] if t["chosen"]]
    assert data["saved_to"] is None and len(chosen) == 1 and len(data["trials"]) >= 3
    assert {k: chosen[0][k] for k in data["recommended"]} == data["recommended"]
    r = run_cli("tune", str(small_store), "--window", "0", "--batch-size", "16")
    assert r.returncode == 1 and "window and batch size must be >= 1" in r.stderr


def test_cli_tune_measures_every_symbol_and_says_which_field_it_left_out(tmp_path, monkeypatch):
    """Issue 25: in an 11-symbol store where one file had amount, tune measured the 683 windows of that one
    symbol. The default fields now keep every symbol, and the CLI says which field it left out, on one line."""
    from conftest import run_cli
    from kline_store import KlineDataset
    from kline_store.store import create_store

    rng = np.random.default_rng(0)
    close = 10 * np.exp(np.cumsum(rng.normal(0, 0.02, (11, 200)), axis=1))
    panel = np.stack([close, close * 1.01, close * 0.99, close, np.full_like(close, 1e3), np.full_like(close, np.nan)],
                     axis=2).astype(np.float32)
    panel[0, :, 5] = 1e6
    days = np.datetime64("2020-01-01") + np.arange(200)
    path = create_store(tmp_path / "s", panel, [f"S{i}" for i in range(11)], days,
                        ["open", "high", "low", "close", "volume", "amount"])
    monkeypatch.setenv("KLINE_STORE_CACHE", str(tmp_path / "cache"))
    r = run_cli("tune", str(path), "--window", "32", "--batch-size", "16", "--seconds", "0.05", "--no-save", "--json")
    assert r.returncode == 0, r.stderr
    note = [line for line in r.stderr.splitlines() if "amount" in line]
    assert note == [f"kline-store: {path}: amount: 1 of 11 symbols; left out of the default fields (open, high, low, "
                    f"close, volume); pass fields=[...] to use it"]
    with pytest.warns(RuntimeWarning):
        assert len(KlineDataset(path, window=32)) == 11 * (200 - 32)   # what tune measured on
