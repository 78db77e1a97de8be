"""Lightning DDP on the CPU (2 processes, gloo): each rank records the windows of its training epoch, and the
validation windows it counts (those not marked ``padded``).

Usage: python helpers_lightning_ddp.py STORE OUT_DIR [EVAL_TAIL]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning.pytorch as lp
import torch

from kline_store.lightning import KlineDataModule


class Recorder(lp.LightningModule):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(10 * 6, 1)
        self.out = out
        self.seen: list[list[int]] = []
        self.val: list[list[int]] = []
        self.val_flag: list[bool] = []

    def validation_step(self, batch, _):
        keep = ~batch["padded"] if "padded" in batch else torch.ones(len(batch["t"]), dtype=torch.bool)
        self.val_flag.append("padded" in batch)
        self.val += [[int(s), int(t)] for s, t in zip(batch["symbol"][keep], batch["t"][keep])]

    def training_step(self, batch, _):
        self.seen += [[int(s), int(t)] for s, t in zip(batch["symbol"], batch["t"])]
        return self.lin(batch["x"].nan_to_num().flatten(1)).squeeze(-1).sub(batch["y"]).square().mean()

    def on_train_epoch_end(self) -> None:
        Path(self.out, f"rank-{self.global_rank}.json").write_text(
            json.dumps({"rank": self.global_rank, "world": self.trainer.world_size, "seen": self.seen,
                        "val": self.val, "val_flag": self.val_flag}))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    store, out = sys.argv[1:3]
    tail = sys.argv[3] if len(sys.argv) > 3 else "pad"
    dm = KlineDataModule(store, window=10, splits={"train": ("2020-01-01", "2020-04-10"),
                                                   "val": ("2020-04-15", None)}, batch_size=32, eval_tail=tail)
    trainer = lp.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    trainer.fit(Recorder(out), datamodule=dm)
