"""config.py: loader configurations, their defaults per machine and rank count, and the tuned-config files."""

from __future__ import annotations

import json
import os

import pytest

from kline_store.feed import config as loader_config
from kline_store.errors import InputError


def test_normalize_fills_defaults_and_validates(monkeypatch):
    cfg = loader_config.normalize_config({})
    assert cfg["backend"] == "threads" and cfg["num_workers"] == loader_config.default_workers() >= 1
    assert cfg["prefetch"] == 2 and cfg["pin_memory"] is False
    assert loader_config.normalize_config({}, device="cuda:1")["pin_memory"] is True
    assert loader_config.normalize_config({"backend": "processes", "num_workers": 0})["backend"] == "threads"
    for bad in ({"backend": "fibers"}, {"num_workers": -1}, {"prefetch": 0}, {"workers": 2}, {"prefetch": "x"}):
        with pytest.raises(InputError, match="loader config"):
            loader_config.normalize_config(bad)


def test_default_workers_share_the_cores_among_local_ranks(monkeypatch):
    monkeypatch.setattr(loader_config, "usable_cores", lambda: 16)
    assert loader_config.default_workers() == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert loader_config.default_workers() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    assert loader_config.default_workers() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "junk")
    assert loader_config.local_world_size() == 1


def test_config_key():
    assert loader_config.config_key(64, 256, "cuda:1", cpus=8) == "window=64,batch_size=256,device=cuda,cpus=8"
    assert loader_config.config_key(64, 256, None, cpus=2) == "window=64,batch_size=256,device=cpu,cpus=2"


def test_save_load_resolve(tmp_path):
    store = tmp_path / "s"
    store.mkdir()
    cfg = {"backend": "threads", "num_workers": 2, "prefetch": 4, "pin_memory": False}
    path = loader_config.save_config(store, 64, 256, "cpu", cfg, table=[{"x": 1}])
    assert path == store / loader_config.TUNE_FILE
    assert loader_config.load_config(store, 64, 256, "cpu") == cfg
    assert loader_config.load_config(store, 64, 128, "cpu") is None
    assert loader_config.resolve_config("auto", store, 64, 256, "cpu") == (cfg, "tuned")
    assert loader_config.resolve_config("auto", store, 32, 256, "cpu")[1] == "default"
    assert loader_config.resolve_config(None, store, 64, 256, "cpu")[1] == "default"
    assert loader_config.resolve_config({"num_workers": 1}, store, 64, 256, "cpu")[0]["num_workers"] == 1
    assert loader_config.resolve_config(path, store, 64, 256, "cpu") == (cfg, "given")
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"num_workers": 0}))
    assert loader_config.resolve_config(plain, store, 1, 1, "cpu")[0]["num_workers"] == 0
    with pytest.raises(InputError, match="does not exist"):
        loader_config.resolve_config(tmp_path / "nope.json", store, 64, 256, "cpu")
    with pytest.raises(InputError, match="no entry"):
        loader_config.resolve_config(path, store, 1, 1, "cpu")
    (store / loader_config.TUNE_FILE).write_text("{damaged")
    assert loader_config.load_config(store, 64, 256, "cpu") is None   # a damaged file only costs a re-tune


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write read-only directories")
def test_read_only_store_falls_back_to_user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    store = tmp_path / "ro"
    store.mkdir()
    store.chmod(0o555)
    try:
        path = loader_config.save_config(store, 64, 256, "cpu", {"num_workers": 1})
    finally:
        store.chmod(0o755)
    assert str(path).startswith(str(tmp_path / "home" / ".cache" / "kline-store"))
    assert loader_config.load_config(store, 64, 256, "cpu")["num_workers"] == 1


def test_user_cache_fallback_when_store_file_unwritable(tmp_path, monkeypatch):
    # Works as root too: make tune.json a directory, so writing the store's file fails.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    store = tmp_path / "st"
    (store / "tune.json").mkdir(parents=True)
    path = loader_config.save_config(store, 64, 256, "cpu", {"num_workers": 1})
    assert path.parent == tmp_path / "home" / ".cache" / "kline-store"
    assert loader_config.load_config(store, 64, 256, "cpu")["num_workers"] == 1


# --- a tuning file is untrusted (issue 19) -------------------------------------------------------------------

def _damage(store, how):
    f = store / loader_config.TUNE_FILE
    if how == "fifo":
        os.mkfifo(f)
    elif how == "link-dev-zero":
        f.symlink_to("/dev/zero")
    elif how == "huge":
        with open(f, "wb") as fh:
            fh.truncate(64 << 20)
    elif how == "deep":
        f.write_text("[" * 100_000 + "]" * 100_000)
    elif how == "infinity":
        key = loader_config.config_key(64, 256, "cpu")
        f.write_text('{"%s": {"config": {"num_workers": Infinity, "prefetch": 2}}}' % key)
    elif how == "overflow":
        key = loader_config.config_key(64, 256, "cpu")
        f.write_text('{"%s": {"config": {"num_workers": 1e400, "prefetch": 2}}}' % key)
    elif how in ("workers", "prefetch"):
        key = loader_config.config_key(64, 256, "cpu")
        cfg = {"num_workers": 64, "prefetch": 2} if how == "workers" else {"num_workers": 1, "prefetch": 10**9}
        f.write_text(json.dumps({key: {"config": cfg}}))


@pytest.mark.parametrize("how", ["fifo", "link-dev-zero", "huge", "deep", "infinity", "overflow", "workers",
                                 "prefetch"])
def test_a_damaged_or_unbounded_tune_file_gives_the_defaults_and_one_warning(tmp_path, monkeypatch, how):
    """Issue 19: a FIFO hung config="auto" forever, a link to /dev/zero grew to 11 GB, deep nesting or Infinity
    crashed it, and 64 workers or a prefetch of 1e9 chunks were taken as given."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    store = tmp_path / "s"
    store.mkdir()
    _damage(store, how)
    with pytest.warns(RuntimeWarning, match="kline-store: ignoring") as got:
        config, source = loader_config.resolve_config("auto", store, 64, 256, "cpu")
    assert source == "default" and config == loader_config.normalize_config({}, "cpu")
    assert len([w for w in got if "kline-store" in str(w.message)]) == 1


def test_a_linked_cache_folder_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".cache").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "home" / ".cache" / "kline-store").symlink_to(tmp_path / "elsewhere")
    store = tmp_path / "st"
    (store / "tune.json").mkdir(parents=True)          # the store's file cannot be written: the cache would be
    with pytest.raises(InputError, match="cannot save tuned config"):
        loader_config.save_config(store, 64, 256, "cpu", {"num_workers": 1})
    assert list((tmp_path / "elsewhere").iterdir()) == []
