"""Device feeding: placement choice, staging ring, ordered prefetch, and the loader wrapper on CPU (CUDA parts
skip without a GPU)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from kline_store import device as dv
from kline_store.errors import InputError

GB = 1 << 30


# --------------------------------------------------------------------------- placement


@pytest.mark.parametrize(
    "nbytes, free, avail, expect",
    [
        (3 * GB, 80 * GB, 64 * GB, "device"),      # a whole market fits on one modern GPU
        (30 * GB, 40 * GB, 256 * GB, "pinned"),    # too big for half the GPU, fits in a quarter of RAM
        (30 * GB, 40 * GB, 64 * GB, "memmap"),     # fits nowhere: stream from the memmap
        (1, None, None, "memmap"),                 # unknown sizes: be conservative
        (10 * GB, 20 * GB, 0, "device"),           # exactly half the free device memory still fits
    ],
)
def test_auto_placement_with_cuda(nbytes, free, avail, expect):
    assert dv.choose_placement(nbytes, cuda=True, device_free=free, host_available=avail) == expect


def test_placement_without_cuda_and_forced():
    assert dv.choose_placement(1, cuda=False, device_free=None, host_available=64 * GB) == "memmap"
    # CPU: a compact RAM copy only when it buys a layout (a subset of fields) and fits
    assert dv.choose_placement(GB, cuda=False, host_available=64 * GB, layout_gain=True) == "device"
    assert dv.choose_placement(20 * GB, cuda=False, host_available=64 * GB, layout_gain=True) == "memmap"
    assert dv.choose_placement(100 * GB, cuda=True, requested="device", device_free=0) == "device"
    assert dv.choose_placement(1, cuda=False, requested="device") == "device"
    assert dv.choose_placement(1, cuda=True, requested="memmap", device_free=80 * GB) == "memmap"
    with pytest.raises(InputError, match="pinned"):
        dv.choose_placement(1, cuda=False, requested="pinned")
    with pytest.raises(InputError, match="placement must be one of"):
        dv.choose_placement(1, cuda=True, requested="gpu")


def test_memory_probes():
    assert dv.host_available_bytes() > 0
    assert dv.device_free_bytes("cpu") is None


# --------------------------------------------------------------------------- staging ring


class FakeEvent:
    """A CUDA-event stand-in that completes only when the test says so."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.waited = False

    def synchronize(self) -> None:
        self.waited = True
        assert self.done.wait(5), "event never completed"


def test_ring_rotates_and_waits_for_copy_event():
    ring = dv.HostRing(3, lambda: torch.zeros(4))  # CPU tensors standing in for pinned buffers
    assert len(ring) == 3 and len({id(b) for b in ring.buffers}) == 3
    got = [ring.acquire() for _ in range(3)]
    assert got == [0, 1, 2]
    events = [FakeEvent() for _ in range(3)]
    for k, ev in zip(got, events):
        ring.release(k, ev)
    # slot 0 comes back first, but only once its copy completed
    result: list[int] = []
    th = threading.Thread(target=lambda: result.append(ring.acquire()))
    th.start()
    th.join(0.05)
    assert th.is_alive() and events[0].waited  # blocked on the copy still reading slot 0
    events[0].done.set()
    th.join(5)
    assert result == [0]
    empty = dv.HostRing(1, lambda: None)
    empty.acquire()
    with pytest.raises(TimeoutError):
        empty.acquire(timeout=0.01)
    with pytest.raises(InputError):
        dv.HostRing(0, lambda: None)


def test_recycler_reuses_only_released_buffers():
    rec = dv.Recycler({"x": ((2,), np.float32), "i": ((), np.int64)}, capacity=4, max_slots=2)
    a = rec.take(4)
    a["x"].fill_(1.0)
    ptr = a["x"].data_ptr()
    kept = a["x"][1:3]  # a view the caller keeps: slot 0 must not be handed out again
    del a
    b = rec.take(3)
    assert b["x"].data_ptr() != ptr and b["x"].shape == (3, 2) and b["i"].dtype == torch.int64
    b["x"].fill_(2.0)
    assert float(kept.sum()) == 4.0  # untouched
    c = rec.take(4)  # both kept slots busy and max_slots reached: a fresh, unkept buffer
    assert len(rec.slots) == 2 and c["x"].data_ptr() not in (ptr, b["x"].data_ptr())
    del kept, b, c
    again = rec.take(4)
    assert again["x"].data_ptr() == ptr and rec.reused == 1


# --------------------------------------------------------------------------- ordered prefetch


@pytest.mark.parametrize("n_threads", [0, 1, 2, 4])
def test_prefetch_keeps_order(n_threads):
    rng = np.random.default_rng(n_threads)
    delays = rng.uniform(0, 0.002, 60)

    def work(i: int) -> int:
        time.sleep(delays[i])  # uneven work: threads finish out of order
        return i * i

    pf = dv.OrderedPrefetcher(range(60), work, n_threads=n_threads, depth=3)
    assert list(pf) == [i * i for i in range(60)]


def test_prefetch_depth_bounds_work_ahead():
    started: list[int] = []
    lock = threading.Lock()

    def work(i: int) -> int:
        with lock:
            started.append(i)
        return i

    pf = dv.OrderedPrefetcher(range(100), work, n_threads=2, depth=4)
    first = next(pf)
    time.sleep(0.05)  # give the threads every chance to run ahead
    with lock:
        ahead = len(started)
    assert first == 0 and ahead <= 1 + 4  # the consumed item plus at most `depth` in flight
    assert list(pf) == list(range(1, 100))


def test_prefetch_raises_in_order_and_stops():
    def work(i: int) -> int:
        if i == 5:
            raise ValueError("bad item 5")
        return i

    pf = dv.OrderedPrefetcher(range(20), work, n_threads=2, depth=2)
    got = []
    with pytest.raises(ValueError, match="bad item 5"):
        for x in pf:
            got.append(x)
    assert got == [0, 1, 2, 3, 4]

    def items():
        yield 1
        raise RuntimeError("index source failed")

    pf = dv.OrderedPrefetcher(items(), lambda i: i, n_threads=1, depth=2)
    assert next(pf) == 1
    with pytest.raises(RuntimeError, match="index source"):
        next(pf)


def test_prefetch_close_stops_threads():
    pf = dv.OrderedPrefetcher(iter(range(10**9)), lambda i: i, n_threads=2, depth=2)
    assert next(pf) == 0
    pf.close()
    assert all(not th.is_alive() for th in pf._threads)
    with pytest.raises(StopIteration):
        next(pf)
    with pytest.raises(InputError):
        dv.OrderedPrefetcher([], lambda i: i, n_threads=-1)


def test_slices_and_map_keep_structure():
    x = np.arange(10)
    batch = {"x": x, "pair": (x * 2, [x * 3])}
    parts = list(dv._slices(batch, [4, 4, 2]))
    assert [n for _, n in parts] == [4, 4, 2]
    assert [len(p["x"]) for p, _ in parts] == [4, 4, 2]
    assert parts[2][0]["pair"][1][0].tolist() == [24, 27]
    flat = list(dv._slices({"x": x, "y": x + 1}, [7, 3]))  # the dict fast path
    assert flat[1][0]["y"].tolist() == [8, 9, 10] and flat[1][1] == 3
    assert len(dv._leaves(batch)) == 3


# --------------------------------------------------------------------------- wrap_loader on a stand-in dataset

torch = pytest.importorskip("torch")


class TinyDataset:
    """Stand-in with the dataset API the device pipeline uses: gather_batch(indices, out=None) -> (x, y)."""

    window = 4

    def __init__(self, n: int, path: str = ".") -> None:
        self.path = path
        self.data = torch.arange(n * 8, dtype=torch.float32).reshape(n, 4, 2)

    def __len__(self) -> int:
        return self.data.shape[0]

    def to_device(self, device, pin=False):
        copy = TinyDataset.__new__(TinyDataset)
        copy.path, copy.data = self.path, self.data.to(device)
        return copy.gather_batch

    def panel_nbytes(self) -> int:
        return self.data.numel() * 4

    def gather_batch(self, indices, out=None):
        idx = torch.as_tensor(indices, dtype=torch.int64).to(self.data.device)
        x = self.data.index_select(0, idx)
        y = x[:, -1, 0] + 1
        if out is None:
            return x, y
        out[0].copy_(x)
        out[1].copy_(y)
        return out


class TinyLoader:
    """Stand-in with the KlineLoader API the pipeline uses: index_batches(), advance(), epoch, set_epoch."""

    def __init__(self, n: int, batch_size: int, seed: int = 0) -> None:
        self.n, self.batch_size, self.seed, self.epoch, self.position = n, batch_size, seed, 0, 0
        self.advanced: list[int] = []

    def index_batches(self):
        perm = np.random.default_rng((self.seed, self.epoch)).permutation(self.n)
        return iter([perm[i : i + self.batch_size] for i in range(self.position, self.n, self.batch_size)])

    def advance(self, n: int) -> None:
        self.advanced.append(n)
        self.position += n
        if self.position >= self.n:
            self.epoch, self.position = self.epoch + 1, 0

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}


def expected(ds: TinyDataset, loader: TinyLoader):
    return [ds.gather_batch(b) for b in loader.index_batches()]


@pytest.mark.parametrize(
    "config",
    [
        {"backend": "threads", "num_workers": 0, "prefetch": 1},
        {"backend": "threads", "num_workers": 1, "prefetch": 2},
        {"backend": "threads", "num_workers": 2, "prefetch": 4},
        {"backend": "processes", "num_workers": 1, "prefetch": 2},
    ],
)
def test_wrap_loader_cpu_same_batches_in_same_order(config, monkeypatch):
    monkeypatch.setattr(dv, "CHUNK_BYTES", 2 * 5 * 36)  # two batches of 5 samples (36 bytes each) per chunk
    ds, ld = TinyDataset(23), TinyLoader(23, batch_size=5)
    wrapped = dv.wrap_loader(ld, ds, device="cpu", config=config)
    assert wrapped.placement == "memmap" and wrapped.device.type == "cpu"
    assert len(wrapped) == 5 and wrapped.state_dict()["epoch"] == 0  # passes through to the loader
    for epoch in range(2):
        want = expected(ds, ld)
        got = list(wrapped)
        assert [len(x) for x, _ in got] == [5, 5, 5, 5, 3]
        for (gx, gy), (wx, wy) in zip(got, want):
            assert torch.equal(gx, wx) and torch.equal(gy, wy)
        assert ld.epoch == epoch + 1  # the last delivered batch rolled the epoch over
    assert ld.advanced == [5, 5, 5, 5, 3] * 2


def test_chunk_plan_ramps_up_then_stays_full(monkeypatch):
    monkeypatch.setattr(dv, "CHUNK_BYTES", 4 * 5 * 36)  # full chunks of 4 batches
    ds, ld = TinyDataset(60), TinyLoader(60, batch_size=5)
    wrapped = dv.wrap_loader(ld, ds, device="cpu")
    batches = list(ld.index_batches())
    plan = list(wrapped._chunk_plan(iter(batches)))
    assert [sizes for _, sizes in plan] == [[5], [5, 5], [5] * 4, [5] * 4, [5]]  # 1, 2, 4, 4, rest
    assert np.array_equal(np.concatenate([idx for idx, _ in plan]), np.concatenate(batches))


def test_position_advances_on_delivery_not_prefetch(monkeypatch):
    monkeypatch.setattr(dv, "CHUNK_BYTES", 36)  # one batch per chunk
    ds, ld = TinyDataset(40), TinyLoader(40, batch_size=4)
    wrapped = dv.wrap_loader(ld, ds, device="cpu", config={"num_workers": 2, "prefetch": 4})
    it = iter(wrapped)
    first = [next(it) for _ in range(3)]
    time.sleep(0.05)  # prefetch threads run ahead; the position must not
    assert ld.state_dict() == {"epoch": 0, "position": 12}
    it.close()
    resumed = list(wrapped)  # a new pass starts at the saved position
    want = expected(ds, TinyLoader(40, batch_size=4))
    got = first + resumed
    assert len(got) == 10
    for (gx, _), (wx, _) in zip(got, want):
        assert torch.equal(gx, wx)


def test_device_placement_on_cpu_gathers_from_a_copy():
    ds, ld = TinyDataset(12), TinyLoader(12, batch_size=5)
    wrapped = dv.wrap_loader(ld, ds, device="cpu", placement="device")
    want = expected(ds, ld)
    got = list(wrapped)
    assert wrapped.placement == "device"
    assert all(torch.equal(g[0], w[0]) for g, w in zip(got, want)) and len(got) == 3


def test_generic_loader_passes_through_on_cpu():
    from torch.utils.data import DataLoader, TensorDataset

    dl = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4)
    wrapped = dv.wrap_loader(dl, None, device="cpu")
    assert [b[0].tolist() for b in wrapped] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_wrap_loader_rejects_bad_arguments():
    ds, ld = TinyDataset(8), TinyLoader(8, 4)
    with pytest.raises(InputError, match="pinned"):
        dv.wrap_loader(ld, ds, device="cpu", placement="pinned")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="CUDA is not available"):
            dv.wrap_loader(ld, ds, device="cuda")
    with pytest.raises(InputError, match="backend"):
        dv.wrap_loader(ld, ds, device="cpu", config={"backend": "fibers"})


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("pin", [True, False])
@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_cuda_pipeline_delivers_same_batches(pin, backend, monkeypatch):
    monkeypatch.setattr(dv, "CHUNK_BYTES", 2 * 5 * 36)
    ds, ld = TinyDataset(41), TinyLoader(41, batch_size=5)
    cfg = {"backend": backend, "num_workers": 1, "prefetch": 2, "pin_memory": pin}
    wrapped = dv.wrap_loader(ld, ds, device="cuda", placement="memmap", config=cfg)
    got = list(wrapped)
    want = expected(ds, ld)
    assert len(got) == len(want)
    for (gx, gy), (wx, wy) in zip(got, want):
        assert gx.is_cuda and gy.is_cuda
        assert torch.equal(gx.cpu(), wx) and torch.equal(gy.cpu(), wy)
    if pin and backend == "threads":
        ring = wrapped.ring
        assert ring is not None and all(b[0].is_pinned() for b in ring.buffers)
        n = len(ring)
        assert ring.acquired[: 2 * n] == list(range(n)) * 2  # one producer thread: strict rotation


@needs_cuda
def test_cuda_batches_survive_later_copies(monkeypatch):
    # Slow consumer work on the default stream while later chunks are copied: values must stay intact.
    monkeypatch.setattr(dv, "CHUNK_BYTES", 2 * 36)  # one batch of two samples per chunk
    ds, ld = TinyDataset(64), TinyLoader(64, batch_size=2)
    wrapped = dv.wrap_loader(ld, ds, device="cuda", placement="memmap",
                             config={"num_workers": 2, "prefetch": 2, "pin_memory": True})
    kept = []
    for x, _ in wrapped:
        torch.cuda._sleep(1_000_000)  # keep the default stream busy
        kept.append(x * 1)
    want = expected(ds, ld)
    assert len(kept) == len(want) > 0
    for g, (w, _) in zip(kept, want, strict=True):
        assert torch.equal(g.cpu(), w)


# --------------------------------------------------------------------------- with the real dataset and loader


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    from kline_store.store import create_store

    rng = np.random.default_rng(7)
    n_sym, n_dates, fields = 6, 120, ["open", "high", "low", "close", "volume", "amount"]
    close = 10 * np.exp(np.cumsum(rng.normal(0, 0.02, (n_sym, n_dates)), axis=1))
    panel = np.stack([close * 0.99, close * 1.01, close * 0.98, close, rng.lognormal(10, 1, close.shape),
                      rng.lognormal(14, 1, close.shape)], axis=2).astype(np.float32)
    panel[1, :30] = np.nan  # listed later
    panel[2, 50:53] = np.nan  # a suspension
    dates = np.arange(np.datetime64("2020-01-01"), np.datetime64("2020-01-01") + n_dates)
    path = tmp_path_factory.mktemp("stores") / "small"
    create_store(path, panel, [f"S{i}" for i in range(n_sym)], dates, fields)
    return path


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("placement", ["memmap", "device"])
@pytest.mark.parametrize("config", [{"num_workers": 0}, {"num_workers": 2, "prefetch": 2},
                                    {"backend": "processes", "num_workers": 1}])
def test_real_loader_on_cpu_matches_plain_loader(small_store, placement, config):
    from kline_store import KlineDataset

    ds = KlineDataset(small_store, window=10, fields=["close", "volume"])
    plain = list(ds.loader(batch_size=32, shuffle=True, seed=3))
    fed = ds.loader(batch_size=32, shuffle=True, seed=3, device="cpu", placement=placement, config=config)
    assert isinstance(fed, dv.DeviceLoader) and fed.placement == placement
    got = list(fed)
    assert len(got) == len(plain) == len(fed)
    assert all(_same(g, p) for g, p in zip(got, plain))
    assert fed.state_dict()["epoch"] == 1 and fed.state_dict()["position"] == 0


def test_real_loader_resumes_mid_epoch(small_store):
    from kline_store import KlineDataset

    ds = KlineDataset(small_store, window=10)
    want = list(ds.loader(batch_size=16, seed=1))
    fed = ds.loader(batch_size=16, seed=1, device="cpu", config={"num_workers": 2, "prefetch": 4})
    it = iter(fed)
    head = [next(it) for _ in range(5)]
    state = fed.state_dict()
    it.close()
    again = ds.loader(batch_size=16, seed=1, device="cpu", config={"num_workers": 1})
    again.load_state_dict(state)
    tail = list(again)
    assert state["position"] == 5 * 16
    assert len(head) + len(tail) == len(want)
    assert all(_same(g, w) for g, w in zip(head + tail, want))


def test_auto_config_reads_tuned_file(small_store):
    from kline_store import KlineDataset
    from kline_store.tune import save_config

    ds = KlineDataset(small_store, window=10)
    cfg = {"backend": "threads", "num_workers": 2, "prefetch": 8, "pin_memory": False}
    save_config(small_store, 10, 64, "cpu", cfg)
    try:
        assert ds.loader(batch_size=64, device="cpu", config="auto").config == cfg
        assert ds.loader(batch_size=32, device="cpu", config="auto").config["prefetch"] == 2  # other key
    finally:
        (small_store / "tune.json").unlink()


@needs_cuda
@pytest.mark.parametrize("placement", ["device", "pinned", "memmap"])
def test_real_loader_on_cuda_matches_plain_loader(small_store, placement):
    from kline_store import KlineDataset

    ds = KlineDataset(small_store, window=10, fields=["close", "volume"])
    plain = list(ds.loader(batch_size=32, shuffle=True, seed=3))
    fed = ds.loader(batch_size=32, shuffle=True, seed=3, device="cuda", placement=placement)
    got = list(fed)
    assert len(got) == len(plain)
    for g, p in zip(got, plain):
        assert g["x"].is_cuda
        assert all(torch.equal(g[k].cpu(), p[k]) for k in p)


@needs_cuda
def test_auto_placement_on_cuda_is_device_for_a_small_store(small_store):
    from kline_store import KlineDataset

    ds = KlineDataset(small_store, window=10)
    assert ds.loader(batch_size=8, device="cuda").placement == "device"


def test_prefetch_threads_leave_the_trainers_torch_threads_alone():
    import subprocess
    import sys

    # A fresh process whose main thread has not run a parallel op yet: the worst case.
    code = (
        "import torch, numpy as np\n"
        "from kline_store import device as dv\n"
        "before = torch.get_num_threads()\n"
        "seen = []\n"
        "with dv._KeepTorchThreads():\n"
        "    pf = dv.OrderedPrefetcher(range(4), lambda i: seen.append(torch.get_num_threads()) or i,\n"
        "                              n_threads=2, depth=2, thread_init=dv._single_threaded_torch)\n"
        "assert list(pf) == [0, 1, 2, 3]\n"
        "print(before, torch.get_num_threads(), set(seen))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    before, after, seen = out.stdout.split(maxsplit=2)
    assert after == before and seen.strip() == "{1}"


def test_cross_sections_are_fed_batch_by_batch(small_store):
    from kline_store import CrossSectionDataset

    cs = CrossSectionDataset(small_store, window=10, min_count=2)
    plain = list(cs.loader(batch_size=3, seed=2))
    fed = cs.loader(batch_size=3, seed=2, device="cpu", config={"num_workers": 2})
    assert fed.placement == "memmap"
    got = list(fed)
    assert len(got) == len(plain) and all(_same(g, p) for g, p in zip(got, plain))
    with pytest.raises(InputError, match="placement='device' needs"):
        cs.loader(batch_size=3, device="cpu", placement="device")


def test_ring_is_freed_for_a_new_pass_after_a_break(small_store, monkeypatch):
    """A loop that breaks out mid-epoch leaves slots held; the next pass must not wait for them forever.

    The pinned (CUDA) staging path, emulated on the CPU: ring buffers are plain tensors.
    """
    from kline_store import KlineDataset

    real_empty = torch.empty

    def empty(*args, pin_memory=False, **kw):  # CPU build: no pinned memory
        return real_empty(*args, **kw)

    monkeypatch.setattr(torch, "empty", empty)
    ds = KlineDataset(small_store, window=8)
    ld = ds.loader(batch_size=16, device="cpu", placement="memmap",
                   config={"backend": "threads", "num_workers": 1, "prefetch": 2, "pin_memory": True})
    buffers = None
    for _ in range(4):
        gen = ld._host_threads(ld._chunk_plan(ld.source.index_batches()), pin=True)
        chunk, sizes, (ring, k) = next(gen)
        ring.release(k)            # as the CUDA stage does once the copy is queued
        time.sleep(0.1)            # producers fill the prefetch depth, holding slots
        gen.close()                # the training loop breaks out
        ring.release(k)            # a late release of the abandoned pass: must not touch the next pass
        buffers = buffers or ring.buffers
        assert ring.buffers is buffers   # the (pinned) buffers are reused, pass after pass
    gen = ld._host_threads(ld._chunk_plan(ld.source.index_batches()), pin=True)
    got = [slot for (_, _, slot), _ in zip(gen, range(3))]
    assert len(got) == 3 and len({k for _, k in got}) == 3   # a fresh pass gets distinct slots (was a hang)
    gen.close()
