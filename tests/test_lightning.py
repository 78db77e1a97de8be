"""lightning.py with real Lightning on the CPU: fast_dev_run, exact mid-epoch resume from a checkpoint, and DDP
(2 processes, gloo) where each rank takes its own shard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers_dataset_ref import make_store, random_panel

lp = pytest.importorskip("lightning.pytorch")

from kline_store.samples.dataset import KlineDataset  # noqa: E402
from kline_store.errors import InputError  # noqa: E402
from kline_store.lightning import KlineDataModule  # noqa: E402

HERE = Path(__file__).resolve().parent
SPLITS = {"train": ("2020-01-01", "2020-03-31"), "val": ("2020-04-05", "2020-04-20"),
          "test": ("2020-04-25", None)}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(4)
    return make_store(tmp_path_factory.mktemp("lightning") / "s", random_panel(rng, 8, 130, holes=0.02))


class Tiny(lp.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(10 * 6, 1)
        self.seen: list[tuple[str, tuple[int, int]]] = []

    def _loss(self, batch, stage):
        assert isinstance(batch, dict) and batch["x"].shape[1:] == (10, 6)
        self.seen += [(stage, (int(s), int(t))) for s, t in zip(batch["symbol"], batch["t"])]
        return self.lin(batch["x"].nan_to_num().flatten(1)).squeeze(-1).sub(batch["y"]).square().mean()

    def training_step(self, batch, _):
        return self._loss(batch, "train")

    def validation_step(self, batch, _):
        self._loss(batch, "val")

    def test_step(self, batch, _):
        self._loss(batch, "test")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def _trainer(tmp_path: Path, **kw) -> lp.Trainer:
    return lp.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path, **kw)


def test_fast_dev_run(store, tmp_path):
    dm = KlineDataModule(store, window=10, splits=SPLITS, batch_size=16, horizon=2)
    model = Tiny()
    trainer = _trainer(tmp_path, fast_dev_run=1)
    trainer.fit(model, datamodule=dm)
    trainer.test(model, datamodule=dm)
    assert [s for s, _ in model.seen].count("train") == 16 and {"val", "test"} <= {s for s, _ in model.seen}
    train_days = {t for s, (_, t) in model.seen if s == "train"}
    val_days = {t for s, (_, t) in model.seen if s == "val"}
    assert max(train_days) + 2 < min(val_days)   # the embargo between splits holds
    with pytest.raises(InputError, match="train"):
        KlineDataModule(store, splits={"val": ("2020-01-01", None)})


def test_resume_mid_epoch_from_a_checkpoint(store, tmp_path):
    def dm():
        return KlineDataModule(store, window=10, splits={"train": SPLITS["train"]}, batch_size=16, seed=5)

    full = Tiny()
    every3 = lp.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)
    _trainer(tmp_path / "a", max_steps=6, callbacks=[every3]).fit(full, datamodule=dm())
    ckpt = tmp_path / "ckpt" / "epoch=0-step=3.ckpt"                          # taken in the middle of epoch 0
    state = torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert state[0]["position"] == 3 * 16 and state[0]["epoch"] == 0      # the loader's own state was saved
    rest = Tiny()
    _trainer(tmp_path / "b", max_steps=6, enable_checkpointing=False).fit(rest, datamodule=dm(), ckpt_path=ckpt)
    seen = [k for _, k in full.seen]
    assert len(seen) == 6 * 16 and [k for _, k in rest.seen] == seen[3 * 16:]   # continues exactly


@pytest.mark.parametrize("eval_tail", ["pad", "uneven"])
def test_ddp_ranks_take_disjoint_shards(store, tmp_path, eval_tail):
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(HERE / "helpers_lightning_ddp.py"), str(store), str(tmp_path),
                           eval_tail], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert {r["world"] for r in ranks} == {2}
    seen = [{tuple(k) for k in r["seen"]} for r in ranks]
    ds = KlineDataset(store, window=10, start="2020-01-01", end="2020-04-10")
    valid = set(zip(*(a.tolist() for a in ds.locate(np.arange(len(ds))))))
    assert seen[0] | seen[1] == valid and len(seen[0] & seen[1]) <= 1        # every window, the pad aside
    assert len(ranks[0]["seen"]) == len(ranks[1]["seen"])
    # validation: every window counted exactly once over the ranks, whichever tail
    val = KlineDataset(store, window=10, start="2020-04-15")
    assert len(val) % 2                                                      # a length the ranks cannot split
    counted = sorted(tuple(k) for r in ranks for k in r["val"])
    assert counted == sorted(zip(*(a.tolist() for a in val.locate(np.arange(len(val))))))
    assert all(all(r["val_flag"]) == (eval_tail == "pad") for r in ranks)


def test_valid_is_accepted_for_val_and_symbols_reach_the_datasets(store):
    dm = KlineDataModule(store, window=10, splits={"train": SPLITS["train"], "valid": SPLITS["val"]},
                         batch_size=16, symbols=["S001", "S003"])
    dm.setup()
    assert dm.splits.val is not None and len(dm.splits.val) > 0
    s, _ = dm.splits.train.locate(np.arange(len(dm.splits.train)))
    assert set(s.tolist()) == {1, 3}
    with pytest.raises(InputError, match="'val' and 'valid' are the same split"):
        KlineDataModule(store, splits={"train": SPLITS["train"], "val": SPLITS["val"], "valid": SPLITS["val"]})
