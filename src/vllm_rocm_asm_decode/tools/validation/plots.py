"""PNG plots for the benchmarks (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit(
            "--plot needs matplotlib: pip install 'vllm-rocm-asm-decode[bench]'"
        ) from exc
    return plt


def _save(plt, fig, path) -> None:
    """The figure as a PNG at ``path`` exactly (whatever its suffix), then closed."""
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)


def plot_serve(rows: Sequence[Any], baseline: str, model: str, path: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [r.concurrency for r in rows]
    ax.plot(xs, [r.baseline_tok_s for r in rows], "o-", label=baseline)
    ax.plot(xs, [r.candidate_tok_s for r in rows], "s-", label="asm-decode")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("max concurrency")
    ax.set_ylabel("output tok/s")
    ax.set_title(model)
    ax.legend()
    _save(plt, fig, path)


def plot_kernel(timings: Sequence[Any], cut: int | None, path: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    groups: dict[tuple[int, int, int], list[Any]] = {}
    for t in timings:
        groups.setdefault((t.num_heads, t.num_kv_heads, t.context), []).append(t)
    for (h, kvh, ctx), ts in sorted(groups.items()):
        ts = sorted(ts, key=lambda t: t.num_seqs)
        xs = [t.num_seqs for t in ts]
        ax.plot(xs, [t.hip_us for t in ts], "o-", label=f"HIP {h}/{kvh} ctx {ctx}")
        ax.plot(xs, [t.asm_us for t in ts], "s--", label=f"asm {h}/{kvh} ctx {ctx}")
        if cut is not None:
            ax.axvline(cut / h, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequences (grey: the cut)")
    ax.set_ylabel("µs per impl.forward (CUDA graph)")
    ax.legend(fontsize=7)
    _save(plt, fig, path)


def plot_skew(timings: Sequence[Any], path: str) -> None:
    """µs per call against the long sequence's length, one line per kernel."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ts = sorted(timings, key=lambda t: t.long)
    xs = [t.long for t in ts]
    ax.plot(xs, [t.hip_us for t in ts], "o-", label="HIP")
    ax.plot(xs, [t.asm_us for t in ts], "s--", label="asm")
    ax.set_xscale("log", base=2)
    first = ts[0]
    ax.set_xlabel(f"tokens of the one long sequence (beside {first.count} of {first.short})")
    ax.set_ylabel("µs per impl.forward (CUDA graph)")
    ax.set_title(f"{first.num_heads}/{first.num_kv_heads} heads")
    ax.legend()
    _save(plt, fig, path)
