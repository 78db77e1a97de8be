"""Qlib 0.9.7's fitted processors (ZScoreNorm, RobustZScoreNorm) and DataHandlerLP's processor pipeline.

A fitted processor reads only the present rows of the train dates (Qlib's fit_start_time..fit_end_time) and keeps
what it learned in a plain dict of tensors, so a state can be saved with torch.save and applied to any dates.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from kline_store.errors import InputError
from kline_store.features.processors import (
    Processed, Processor, State, as_panel, as_train, by_dates, nanmean, nanmedian, nanstd, resolve_fields,
)

EPS = 1e-12  # qlib.constant.EPS, which RobustZScoreNorm adds to the MAD


def train_rows(x: torch.Tensor, present: torch.Tensor, train: torch.Tensor, fields: list[int]) -> torch.Tensor:
    """The rows a fit may read, [rows, len(fields)] in float64: present rows of the train dates only."""
    rows = present & train[:, None]
    return x[..., fields][rows].double()


def normalize(x: torch.Tensor, present: torch.Tensor, state: State, fields: list[int],
              clip: bool = False) -> torch.Tensor:
    """(x - mean_train) / std_train on the present rows of the fields, clipped to [-3, 3] if asked."""
    if state["fields"].tolist() != fields:
        raise InputError(f"state was fitted on columns {state['fields'].tolist()}, not {fields}")
    mean = state["mean_train"].to(x.device)
    std = state["std_train"].to(x.device)

    def scale(v: torch.Tensor, _here: torch.Tensor) -> torch.Tensor:
        z = (v.double() - mean) / std
        return (z.clamp(-3, 3) if clip else z).to(x.dtype)
    return by_dates(x, present, fields, scale)


class ZScoreNorm(Processor):
    """qlib ZScoreNorm: (x - mean) / std with numpy's nanmean and nanstd (ddof=0) of the train rows per column.
    A column whose std is 0 is left as it is (Qlib sets its mean 0 and std 1); an all-NaN column (or one with an
    inf) has NaN statistics and so comes out all NaN, as Qlib's."""

    def __init__(self, fields: Sequence[int] | None = None) -> None:
        self.fields = fields

    def fit(self, x: torch.Tensor, present: torch.Tensor, train: torch.Tensor) -> State:
        x, present = as_panel(x, present)
        fields = resolve_fields(self.fields, x)
        rows = train_rows(x, present, as_train(train, x), fields)
        mean, std = nanmean(rows, 0)[0], nanstd(rows, 0, ddof=0)[0]
        ignore = std == 0
        return {"fields": torch.tensor(fields, dtype=torch.long), "mean_train": mean.masked_fill(ignore, 0.0),
                "std_train": std.masked_fill(ignore, 1.0)}

    def apply(self, x: torch.Tensor, present: torch.Tensor, state: State) -> Processed:
        x, present = as_panel(x, present)
        return Processed(normalize(x, present, state, resolve_fields(self.fields, x)), present)


class RobustZScoreNorm(Processor):
    """qlib RobustZScoreNorm: (x - median) / ((MAD + 1e-12) * 1.4826) with numpy's nanmedian of the train rows
    per column, clipped to [-3, 3] when clip_outlier (infinities too; NaN stays NaN)."""

    def __init__(self, fields: Sequence[int] | None = None, clip_outlier: bool = True) -> None:
        self.fields, self.clip_outlier = fields, clip_outlier

    def fit(self, x: torch.Tensor, present: torch.Tensor, train: torch.Tensor) -> State:
        x, present = as_panel(x, present)
        fields = resolve_fields(self.fields, x)
        rows = train_rows(x, present, as_train(train, x), fields)
        median = nanmedian(rows, 0)
        mad = nanmedian((rows - median).abs(), 0)[0]
        return {"fields": torch.tensor(fields, dtype=torch.long), "mean_train": median[0],
                "std_train": (mad + EPS) * 1.4826}

    def apply(self, x: torch.Tensor, present: torch.Tensor, state: State) -> Processed:
        x, present = as_panel(x, present)
        fields = resolve_fields(self.fields, x)
        return Processed(normalize(x, present, state, fields, clip=self.clip_outlier), present)


class Views(NamedTuple):
    """A pipeline's two outputs, as DataHandlerLP's data keys: `infer` (DK_I, for prediction) and `learn`
    (DK_L, for training: rows a learn processor dropped are cleared from its present)."""

    infer: Processed
    learn: Processed


class Pipeline:
    """qlib DataHandlerLP's processing (process_data with fit_process_data's fit): shared processors, then
    infer processors give the infer view; learn processors run on the infer view (process_type "append",
    Qlib's default) or on the shared output ("independent") and give the learn view.

    As in Qlib, each processor is fitted on the output of the ones before it (so a ZScoreNorm after a
    DropnaLabel in learn never sees the dropped rows), infer processors must be usable for inference
    (DropnaLabel is not), and the learn processors run over all dates given: the caller takes the learn view
    of its train (and, as Qlib's models do, valid) dates and the infer view of the dates it predicts."""

    def __init__(self, infer: Sequence[Processor] = (), learn: Sequence[Processor] = (),
                 shared: Sequence[Processor] = (), process_type: str = "append") -> None:
        if process_type not in ("append", "independent"):
            raise InputError(f"Pipeline: process_type must be 'append' or 'independent', got {process_type!r}")
        for p in [*shared, *infer]:
            if not p.for_infer:
                raise InputError(f"Pipeline: {type(p).__name__} is not usable for inference; put it in learn")
        self.stages = {"shared": list(shared), "infer": list(infer), "learn": list(learn)}
        self.process_type = process_type

    def fit(self, x: torch.Tensor, present: torch.Tensor, train: torch.Tensor) -> dict[str, State]:
        """Every processor's state, keyed "stage.index" ("infer.0", ...), fitted in Qlib's order."""
        states: dict[str, State] = {}
        self._run(x, present, states, as_train(train, as_panel(x, present)[0]))
        return states

    def apply(self, x: torch.Tensor, present: torch.Tensor, states: dict[str, State]) -> Views:
        """The infer and learn views of any dates, with states from fit."""
        expected = {f"{stage}.{i}" for stage, procs in self.stages.items() for i in range(len(procs))}
        if set(states) != expected:
            raise InputError(f"Pipeline: states have keys {sorted(states)}, this pipeline needs {sorted(expected)}")
        return self._run(x, present, states, None)

    def _run(self, x: torch.Tensor, present: torch.Tensor, states: dict[str, State],
             train: torch.Tensor | None) -> Views:
        """Runs the stages; with a train mask, fits each processor on its input first and fills states."""
        x, present = as_panel(x, present)

        def stage(name: str, panel: Processed) -> Processed:
            for i, proc in enumerate(self.stages[name]):
                key = f"{name}.{i}"
                if train is not None:
                    states[key] = proc.fit(panel.x, panel.present, train)
                panel = proc.apply(panel.x, panel.present, states[key])
            return panel

        shared = stage("shared", Processed(x, present))
        infer = stage("infer", shared)
        learn = stage("learn", infer if self.process_type == "append" else shared)
        return Views(infer, learn)
