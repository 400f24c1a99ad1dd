"""The report's plots, drawn with ``validation/plots.py`` where it has the chart:
throughput and median TPOT by concurrency, kernel time by batch and context, and the
crossover of the batch-size sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..validation import plots
from ..validation import serve_bench as sb
from ..validation.kernel_bench import Timing
from .steps import BASELINE, CANDIDATE


def _timings(data: list[dict[str, Any]]) -> list[Timing]:
    keys = ("num_heads", "num_kv_heads", "context", "num_seqs", "hip_us", "asm_us")
    return [Timing(**{k: t[k] for k in keys}) for t in data]


def plot_tpot(rows: list[sb.Row], model: str, path: Path) -> None:
    plt = plots._pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [r.concurrency for r in rows]
    ax.plot(xs, [r.baseline_tpot_ms for r in rows], "o-", label=BASELINE)
    ax.plot(xs, [r.candidate_tpot_ms for r in rows], "s-", label=CANDIDATE)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("max concurrency")
    ax.set_ylabel("median TPOT, ms")
    ax.set_title(model)
    ax.legend()
    plots._save(plt, fig, path)


def draw(results: dict[str, dict[str, Any] | None], model: str, root: Path) -> dict[str, str]:
    """Every plot there are figures for, into ``root/plots``; ``{title: relative path}``.
    Raises SystemExit (matplotlib missing) or OSError."""
    out = root / "plots"
    out.mkdir(parents=True, exist_ok=True)
    made: dict[str, str] = {}
    serve = results.get("serve-random") or {}
    rows = [sb.Row(**r) for r in serve.get("summary") or []]
    rows = [r for r in rows if r.baseline_tok_s and r.candidate_tok_s]
    if rows:
        plots.plot_serve(rows, BASELINE, model, str(out / "serve-throughput.png"))
        made["output throughput by concurrency"] = "plots/serve-throughput.png"
        plot_tpot(rows, model, out / "serve-tpot.png")
        made["median TPOT by concurrency"] = "plots/serve-tpot.png"
    table = results.get("kernel-table") or {}
    if table.get("timings"):
        plots.plot_kernel(_timings(table["timings"]), table.get("cut"), str(out / "kernel.png"))
        made["kernel time by batch and context"] = "plots/kernel.png"
    sweep = results.get("kernel-sweep") or {}
    if sweep.get("timings"):
        plots.plot_kernel(_timings(sweep["timings"]), sweep.get("cut"), str(out / "crossover.png"))
        made["the crossover: kernel time by batch size"] = "plots/crossover.png"
    return made
