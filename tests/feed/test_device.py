"""device.py and the loader's device paths: side-stream copies that release ring slots with their copy event, the
GPU-resident stream, to_device for any iterable; emulated on the CPU here, for real on a GPU (those tests skip
without CUDA)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from helpers_dataset_ref import make_store, random_panel

from kline_store.feed import device as dv
from kline_store.feed import chunks, loader
from kline_store.feed.buffers import HostRing
from kline_store.samples.dataset import KlineDataset

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class FakeEvent:
    def __init__(self) -> None:
        self.recorded = False

    def record(self, stream=None) -> None:
        self.recorded = True

    def synchronize(self) -> None:
        assert self.recorded


class FakeStream:
    def __init__(self, device=None) -> None:
        self.waited: list[FakeEvent] = []

    def wait_event(self, event) -> None:
        self.waited.append(event)


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda streams and events as CPU stand-ins, so the stage's logic runs here."""
    current = FakeStream()
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: __import__("contextlib").nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: None)
    return current


def test_cuda_stage_releases_each_slot_with_its_copy_event(fake_cuda):
    ring = HostRing(2, lambda: {"x": torch.zeros(6, 2)})
    released: list[tuple[int, object]] = []
    real_release = ring.release
    ring.release = lambda k, ev=None: (released.append((k, ev)), real_release(k, ev))  # type: ignore

    def host():
        for c in range(4):
            k = ring.acquire()
            ring.buffers[k]["x"].fill_(c)
            yield {"x": ring.buffers[k]["x"][:6]}, [4, 2], (ring, k)

    got = list(dv.cuda_stage(host(), torch.device("cpu")))
    assert [n for _, n in got] == [4, 2] * 4
    assert [float(b["x"][0, 0]) for b, _ in got] == [0, 0, 1, 1, 2, 2, 3, 3]   # copies, not the reused slots
    assert [k for k, _ in released] == [0, 1, 0, 1] and all(isinstance(e, FakeEvent) for _, e in released)
    assert len(fake_cuda.waited) == 4   # the training stream waits on every copy, on the GPU


def test_resident_stream_and_to_device_on_cpu():
    data = torch.arange(40.0).reshape(20, 2)
    chunks = [(np.array([3, 1, 4]), [2, 1]), (np.array([5, 9]), [2])]
    got = list(dv.resident_stream(lambda i: {"x": data[i]}, chunks, torch.device("cpu")))
    assert [n for _, n in got] == [2, 1, 2]
    assert got[0][0]["x"].tolist() == [[6, 7], [2, 3]] and got[2][0]["x"][:, 0].tolist() == [10, 18]
    assert list(dv.resident_stream(lambda i: i, [], torch.device("cpu"))) == []
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(10.0)), batch_size=4)
    assert [b[0].tolist() for b in dv.to_device(dl, "cpu")] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    rng = np.random.default_rng(7)
    return make_store(tmp_path_factory.mktemp("device") / "s", random_panel(rng, 6, 120, holes=0.02))


def test_pinned_ring_is_freed_for_a_new_pass_after_a_break(small_store, monkeypatch):
    """A loop that breaks out mid-epoch leaves slots held; the next pass must not wait for them forever.

    The pinned (CUDA) staging path, emulated on the CPU: ring buffers are plain tensors.
    """
    real_empty = torch.empty

    def empty(*args, pin_memory=False, **kw):  # CPU build: no pinned memory
        return real_empty(*args, **kw)

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 16 * 8 * 6 * 4)
    ds = KlineDataset(small_store, window=8)
    ld = ds.loader(batch_size=16, num_workers=1, prefetch_factor=2)
    buffers = None
    for _ in range(4):
        gen = ld._host.threads(loader.chunk_plan(ld.index_batches(), 1), ld.gather_fn(), ld.num_workers, pin=True)
        chunk, sizes, (ring, k) = next(gen)
        ring.release(k)            # as the CUDA stage does once the copy is queued
        time.sleep(0.1)            # producers fill the prefetch depth, holding slots
        gen.close()                # the training loop breaks out
        ring.release(k)            # a late release of the abandoned pass: must not touch the next pass
        buffers = buffers or ring.buffers
        assert ring.buffers is buffers   # the (pinned) buffers are reused, pass after pass
    gen = ld._host.threads(loader.chunk_plan(ld.index_batches(), 1), ld.gather_fn(), ld.num_workers, pin=True)
    got = [slot for (_, _, slot), _ in zip(gen, range(3))]
    assert len(got) == 3 and len({k for _, k in got}) == 3   # a fresh pass gets distinct slots (was a hang)
    gen.close()
    assert threading.active_count() < 10


@needs_cuda
@pytest.mark.parametrize("placement", ["device", "pinned", "memmap"])
@pytest.mark.parametrize("kw", [{}, {"num_workers": 0}, {"backend": "processes", "num_workers": 1}])
def test_cuda_loader_matches_the_cpu_loader(small_store, placement, kw):
    ds = KlineDataset(small_store, window=10, fields=["close", "volume"])
    plain = list(ds.loader(batch_size=32, seed=3, num_workers=0))
    ld = ds.loader(batch_size=32, seed=3, device="cuda", placement=placement, **kw)
    got = list(ld)
    ld.close()
    assert ld.placement == placement and len(got) == len(plain)
    for g, p in zip(got, plain):
        assert g["x"].is_cuda and all(torch.equal(g[k].cpu(), p[k]) for k in p)


@needs_cuda
def test_cuda_batches_survive_later_copies(small_store, monkeypatch):
    # Slow consumer work on the default stream while later chunks are copied: values must stay intact.
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 2 * 10 * 6 * 4)
    ds = KlineDataset(small_store, window=10)
    want = list(ds.loader(batch_size=2, seed=1, num_workers=0))
    kept = []
    for b in ds.loader(batch_size=2, seed=1, device="cuda", placement="pinned", num_workers=2):
        torch.cuda._sleep(1_000_000)  # keep the default stream busy
        kept.append(b["x"] * 1)
    assert len(kept) == len(want) > 0
    for g, w in zip(kept, want, strict=True):
        assert torch.equal(g.cpu(), w["x"])


@needs_cuda
def test_auto_placement_on_cuda_is_device_for_a_small_store(small_store):
    assert KlineDataset(small_store, window=10).loader(batch_size=8, device="cuda").placement == "device"
