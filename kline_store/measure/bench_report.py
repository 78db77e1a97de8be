"""The report of `kline-store bench`: the rows' dataclasses, the text table and the bar chart."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from ..errors import InputError
from .bench_rows import CLASSIC
from .footprint import Footprint, describe

@dataclasses.dataclass
class BenchRow:
    """One line of the table.

    Attributes:
        name: variant id (see ``VARIANTS``) or "memcpy".
        label: what was run.
        samples_per_s: windows per second (the best round).
        spread: (slowest, fastest) round.
        samples_measured: windows timed per round.
        extrapolated: timed on fewer windows than the target.
        seconds_per_target: seconds for the target window count at this rate.
        of_ceiling: the median over rounds of this row's rate / the ceiling measured in the same round (rows
            measured once: their rate / the best ceiling). Per-round ratios keep a machine whose speed drifts
            between rounds from skewing the comparison.
        x_best_classic: ``samples_per_s`` / that of the fastest classic recipe.
        note: how (the ceiling's method, the per-call median of ``ds[i]``, why a row was skipped).
        skipped: not measured (e.g. pyqlib missing).
    """

    name: str
    label: str
    samples_per_s: float = 0.0
    spread: tuple[float, float] = (0.0, 0.0)
    samples_measured: int = 0
    extrapolated: bool = False
    seconds_per_target: float = 0.0
    of_ceiling: float = 0.0
    x_best_classic: float = 0.0
    note: str = ""
    skipped: bool = False


@dataclasses.dataclass
class BenchResult:
    """The table and how it was measured (store, sizes, machine)."""

    rows: list[BenchRow]
    settings: dict[str, Any]

    def row(self, name: str) -> BenchRow:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)

    def as_dict(self) -> dict[str, Any]:
        return {"settings": self.settings, "rows": [dataclasses.asdict(r) for r in self.rows]}


def format_table(result: BenchResult) -> str:
    """The table as text, with the store, cache and machine it was measured on."""
    s = result.settings
    m = s["samples"]
    head = (f"{'variant':<20}{'windows/s':>13}{'spread':>20}{f's/{_short(m)}':>9}{'of ceiling':>12}"
            f"{'x classic':>11}  how")
    lines = [head, "-" * len(head)]
    for r in result.rows:
        if r.skipped:
            lines.append(f"{r.name:<20}{'-':>13}{'':>20}{'':>9}{'':>12}{'':>11}  {r.label} [{r.note}]")
            continue
        spread = f"{r.spread[0]:,.0f}-{r.spread[1]:,.0f}" if r.spread[0] != r.spread[1] else ""
        secs = f"{r.seconds_per_target:.2f}" + ("*" if r.extrapolated else "")
        ratio = f"{r.x_best_classic:.1f}x" if r.x_best_classic and r.name != "memcpy" else "-"
        note = f" [{r.note}]" if r.note else ""
        lines.append(f"{r.name:<20}{r.samples_per_s:>13,.0f}{spread:>20}{secs:>9}{100 * r.of_ceiling:>11.0f}%"
                     f"{ratio:>11}  {r.label}{note}")
    store = (f"synthetic store {s['store_bytes'] / 2**20:.0f} MiB (yours: {s['user_store_bytes'] / 2**20:.1f} MiB)"
             if s.get("synthetic") else f"store {s['store_bytes'] / 2**20:.0f} MiB")
    lines += ["", f"{store}, {s['store_bytes'] / s['l3_bytes']:.1f} x L3 ({s['l3_bytes'] / 2**20:.0f} MiB); "
                  f"{s['windows_in_store']:,} windows of {s['window']} days x {len(s['fields'])} fields; batch "
                  f"{s['batch_size']}; {s['cpus']} cpus; best of {s['rounds']} rounds (spread shown); "
                  f"load {s['load_before']:.2f} -> {s['load_after']:.2f}",
              f"kline-store loader defaults here: {s['loader']}",
              f"* timed on fewer windows ({s['classic_samples']:,} per-sample, or half for slow loaders) and "
              f"extrapolated to {m:,}"]
    if s.get("memory"):
        lines += [""] + describe(Footprint.from_dict(s["memory"]))
    return "\n".join(lines)


def _short(n: int) -> str:
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def plot(result: BenchResult, path: str | os.PathLike) -> Path:
    """A horizontal bar chart of windows/s (log scale) to a PNG.

    Raises:
        InputError: matplotlib is not installed (``pip install 'kline-store[plot]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install 'kline-store[plot]'") from None
    rows = [r for r in result.rows if not r.skipped]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.5))
    colors = ["#888888" if r.name in CLASSIC or r.name.startswith("qlib") else
              "#2ca02c" if r.name.startswith("ceiling") or r.name == "memcpy" else "#1f77b4" for r in rows]
    ax.barh([r.name for r in rows], [r.samples_per_s for r in rows], color=colors)
    ax.set_xscale("log")
    ax.invert_yaxis()
    for i, r in enumerate(rows):
        ax.text(r.samples_per_s, i, f" {r.samples_per_s:,.0f}/s ({100 * r.of_ceiling:.0f}% of ceiling)",
                va="center", fontsize=8)
    s = result.settings
    ax.set_xlabel("windows per second (log scale)")
    ax.set_title(f"window {s['window']} x {len(s['fields'])} fields, batch {s['batch_size']}, {s['cpus']} cpus, "
                 f"store {s['store_bytes'] / 2**20:.0f} MiB")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


__all__ = ["BenchResult", "BenchRow", "format_table", "plot"]
