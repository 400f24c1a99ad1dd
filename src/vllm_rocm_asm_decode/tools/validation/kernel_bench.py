"""``bench kernel``: this backend's ``impl.forward`` inside a CUDA graph, µs per call.

Both decode paths on the same fp8 cache, every sequence at the given context length:
the HIP decode (stock ``ROCM_ATTN``) and the asm decode, forced either way regardless
of the cut; ``asm/HIP`` < 1 means asm is faster. The asm path runs ``high_precision=2``
as shipped, or AITER's default precision with ``--precision default`` (the precision
the original change's kernel timings used). Defaults reproduce that grid: heads 40/8
and 32/8, contexts 1024 and 4096, 16/64/256 sequences (24/64/256 for 32/8).
``--sweep`` walks the batch size up from 1 at one layout and one context (one
``--heads`` and one ``--contexts`` value if given, else the first default) and reports
where asm starts to win, next to the default cut, and the ``VLLM_ROCM_ASM_DECODE_CUT``
that crossover suggests. ``--skew`` times one long sequence among many short ones (one
layout, as for ``--sweep``; ``--seqs`` short ones, 127 by default, at one ``--contexts``
value, 1024 by default; the long one from 2K to 128K tokens) beside the time model's
figures, and reports where asm becomes the slower kernel and the
``VLLM_ROCM_ASM_DECODE_SKEW`` that crossover suggests (``--plot``: µs against the long
sequence's length). Needs a
gfx942/gfx950 GPU with AITER; elsewhere it exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .gpu import rocm_gpu_problem
from .plots import plot_kernel, plot_skew

PROG = "vllm-rocm-asm-decode bench kernel"
SEED_SEQS = {(40, 8): (16, 64, 256), (32, 8): (24, 64, 256)}
SEED_CONTEXTS = (1024, 4096)
SWEEP_SEQS = (*range(1, 17), *range(20, 65, 4), 80, 96, 128, 192, 256)
SKEW_SHORT, SKEW_COUNT = 1024, 127
SKEW_LONG = (2048, 4096, 8192, 16384, 32768, 65536, 131072)


@dataclass
class Timing:
    num_heads: int
    num_kv_heads: int
    context: int
    num_seqs: int
    hip_us: float
    asm_us: float

    @property
    def ratio(self) -> float:
        return self.asm_us / self.hip_us


@dataclass
class SkewTiming:
    """One long sequence among ``count`` short ones."""

    num_heads: int
    num_kv_heads: int
    short: int
    count: int
    long: int
    hip_us: float
    asm_us: float

    @property
    def contexts(self) -> list[int]:
        return [self.long] + [self.short] * self.count

    @property
    def head_tokens(self) -> int:
        return sum(self.contexts) * self.num_kv_heads

    @property
    def ratio(self) -> float:
        return self.asm_us / self.hip_us


def skew_crossover(timings: Sequence[SkewTiming]) -> tuple[SkewTiming, SkewTiming] | None:
    """The last long length at which asm was faster and the first from which it is
    slower at every longer one measured; None when asm never turns slower (or never was
    faster)."""
    ordered = sorted(timings, key=lambda t: t.long)
    for i in range(1, len(ordered)):
        if ordered[i - 1].ratio < 1 <= min(t.ratio for t in ordered[i:]):
            return ordered[i - 1], ordered[i]
    return None


def suggested_skew(timings: Sequence[SkewTiming]) -> int | None:
    """The skew clause's ratio that puts the crossover between the two lengths that
    bracket it: their head-tokens per longest-context token, geometric mean."""
    found = skew_crossover(timings)
    if found is None:
        return None
    faster, slower = found
    return round((faster.head_tokens / faster.long * slower.head_tokens / slower.long) ** 0.5)


def render_skew(timings: Sequence[SkewTiming], precision: str, built_in: int) -> str:
    """The skew table, with the time model's asm/HIP beside the measured one."""
    from ..contract_model import original_time_model

    model = original_time_model()
    first = timings[0]
    lines = [
        f"impl.forward in a CUDA graph, µs per call, fp8 cache, asm at {precision} precision: "
        f"one long sequence among {first.count} of {first.short} tokens, "
        f"{first.num_heads}/{first.num_kv_heads} heads",
        "",
        "| long | head-tokens | HIP | asm | asm / HIP | model asm / HIP |",
        "|---|---|---|---|---|---|",
    ]
    for t in sorted(timings, key=lambda t: t.long):
        predicted = model.asm_us(t.contexts, t.num_kv_heads) / model.hip_us(
            t.contexts, t.num_kv_heads
        )
        lines.append(
            f"| {t.long} | {t.head_tokens} | {t.hip_us:.2f} | {t.asm_us:.2f} | "
            f"{t.ratio:.2f} | {predicted:.2f} |"
        )
    lines.append("")
    found = skew_crossover(timings)
    if found is None:
        lines.append("crossover: asm did not turn slower within the lengths measured")
    else:
        _, slower = found
        lines.append(
            f"crossover: asm slower from one sequence of {slower.long} tokens on; "
            f"suggested VLLM_ROCM_ASM_DECODE_SKEW={suggested_skew(timings)} "
            f"(built in: {built_in})"
        )
    return "\n".join(lines)


def grid(
    heads: Sequence[tuple[int, int]] | None,
    contexts: Sequence[int] | None,
    seqs: Sequence[int] | None,
) -> list[tuple[int, int, int, int]]:
    """(heads, kv_heads, context, num_seqs) to time; the original change's grid by default."""
    cases = []
    for h, kvh in heads or list(SEED_SEQS):
        for ctx in contexts or SEED_CONTEXTS:
            for n in seqs or SEED_SEQS.get((h, kvh), (16, 64, 256)):
                cases.append((h, kvh, ctx, n))
    return cases


def skew_setup(args: argparse.Namespace) -> tuple[tuple[int, int], int, int, list[int]]:
    """``--skew``'s layout, short context, count of short sequences and long lengths."""
    heads = (args.heads or list(SEED_SEQS))[0]
    short = (args.contexts or (SKEW_SHORT,))[0]
    count = (args.seqs or (SKEW_COUNT,))[0]
    return heads, short, count, [long for long in SKEW_LONG if long > short]


def grid_cases(args: argparse.Namespace) -> list[tuple[int, int, int, int]]:
    """The cases of a grid or ``--sweep`` run, as :func:`grid` gives them."""
    if args.sweep:
        heads = (args.heads or list(SEED_SEQS))[:1]
        contexts = (args.contexts or SEED_CONTEXTS)[:1]
        return grid(heads, contexts, args.seqs or SWEEP_SEQS)
    return grid(args.heads, args.contexts, args.seqs)


def cache_bytes(kv_heads: int, contexts: Sequence[tuple[int, int]]) -> int:
    """The fp8 KV cache (K and V) :func:`time_paths` allocates for ``(context, count)``
    sequences: the blocks it asks the testbed for, 16 tokens of 128-wide heads each."""
    blocks = sum(count * (context // 16 + 2) for context, count in contexts) + 8
    return 2 * blocks * 16 * kv_heads * 128


def memory_problem(args: argparse.Namespace) -> str | None:
    """Why the largest case of this run would ask the GPU for more than
    :data:`~vllm_rocm_asm_decode.tools.choices.MAX_KERNEL_CACHE_BYTES` of KV cache;
    None when none would (judged before anything is allocated)."""
    from ..choices import MAX_KERNEL_CACHE_BYTES

    if args.skew:
        (h, kvh), short, count, longs = skew_setup(args)
        size = max((cache_bytes(kvh, [(long, 1), (short, count)]) for long in longs), default=0)
        what = f"{h}/{kvh} heads, one sequence of {max(longs, default=0)} among {count}"
    else:
        size, (h, kvh, ctx, n) = max(
            (cache_bytes(kvh, [(ctx, n)]), (h, kvh, ctx, n)) for h, kvh, ctx, n in grid_cases(args)
        )
        what = f"{h}/{kvh} heads, {n} sequences of {ctx} tokens"
    if size <= MAX_KERNEL_CACHE_BYTES:
        return None
    return (
        f"the largest case ({what}) needs a KV cache of {size / 2**30:.2f} GiB, more than "
        f"the {MAX_KERNEL_CACHE_BYTES / 2**30:.2f} GiB allowed; give fewer --seqs or shorter "
        "--contexts"
    )


def crossover(timings: Sequence[Timing]) -> int | None:
    """The smallest batch from which asm is faster at every larger batch measured."""
    ordered = sorted(timings, key=lambda t: t.num_seqs)
    first = None
    for t in ordered:
        if t.asm_us < t.hip_us:
            first = t.num_seqs if first is None else first
        else:
            first = None
    return first


def suggested_cut(timings: Sequence[Timing]) -> int | None:
    """Query heads of the largest batch below the crossover: with it as the cut, asm runs
    exactly from the crossover on. None when asm never wins; 0 when it always does."""
    n = crossover(timings)
    if n is None:
        return None
    below = [t.num_seqs for t in timings if t.num_seqs < n]
    return max(below) * timings[0].num_heads if below else 0


def render(timings: Sequence[Timing], precision: str, sweep: bool, default_cut: int | None) -> str:
    lines = [
        f"impl.forward in a CUDA graph, µs per call, fp8 cache, asm at {precision} precision",
        "",
        "| heads (q/kv) | ctx | seqs | query heads | HIP | asm | asm / HIP |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in timings:
        lines.append(
            f"| {t.num_heads}/{t.num_kv_heads} | {t.context} | {t.num_seqs} "
            f"| {t.num_seqs * t.num_heads} | {t.hip_us:.2f} | {t.asm_us:.2f} | {t.ratio:.2f} |"
        )
    if sweep and timings:
        n, cut = crossover(timings), suggested_cut(timings)
        h = timings[0].num_heads
        lines.append("")
        if n is None:
            lines.append("crossover: asm is not faster at the largest batch measured")
        else:
            lines.append(
                f"crossover: asm faster from {n} sequences ({n * h} query heads) on; "
                f"default cut {default_cut} query heads; suggested "
                f"VLLM_ROCM_ASM_DECODE_CUT={cut}"
            )
    return "\n".join(lines)


def time_forward(run, iters: int) -> float:
    """µs per call of ``run`` captured in a CUDA graph and replayed (warm)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
        run()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def measure(case: tuple[int, int, int, int], precision: int, iters: int) -> Timing:
    """Both paths of one case on one cache (GPU only)."""
    h, kvh, ctx, n = case
    return Timing(h, kvh, ctx, n, *time_paths(h, kvh, [ctx] * n, precision, iters))


def measure_skew(
    heads: tuple[int, int], short: int, count: int, long: int, precision: int, iters: int
) -> SkewTiming:
    """Both paths on one long sequence among ``count`` short ones (GPU only)."""
    contexts = [long] + [short] * count
    return SkewTiming(*heads, short, count, long, *time_paths(*heads, contexts, precision, iters))


def time_paths(
    h: int, kvh: int, contexts: list[int], precision: int, iters: int
) -> tuple[float, float]:
    """µs per call of the HIP and the asm decode on one cache of these contexts, the
    decode forced either way regardless of the cut and the skew clause (GPU only)."""
    import torch

    from .. import testbed

    model = testbed.build_model(
        num_heads=h, num_kv_heads=kvh, num_layers=1,
        num_blocks=sum(c // 16 + 2 for c in contexts) + 8, device="cuda",
        max_model_len=max(max(contexts), 2048) + 16,
    )  # fmt: skip
    layer = model.layers[model.names[0]]
    layer.kv_cache.view(torch.uint8).random_(0, 0x40)  # finite fp8 values below 2
    batch = testbed.make_batch(model, contexts, contexts=False)
    metadata = model.builder.build(0, batch.common)
    impl = layer.impl
    if model.builder.binding(model.names[0]) is None:
        raise RuntimeError(f"{h}/{kvh} is not eligible: {impl.asm_rejections}")
    out = torch.empty_like(batch.query)

    def path(use_asm: bool):
        md = replace(metadata, use_asm_decode=use_asm)
        return lambda: impl.forward(
            layer, batch.query, batch.key, batch.value, layer.kv_cache, md, out
        )

    from ... import core

    shipped = core.ASM_PRECISION
    core.ASM_PRECISION = precision  # the call reads it each time; the bench's choice
    try:
        hip_us = time_forward(path(False), iters)
        asm_us = time_forward(path(True), iters)
    finally:
        core.ASM_PRECISION = shipped
    return hip_us, asm_us


def main(args: argparse.Namespace) -> int:
    problem = rocm_gpu_problem()
    if problem is not None:
        print(f"{PROG}: error: needs a gfx942/gfx950 GPU with AITER: {problem}", file=sys.stderr)
        return 2
    precision = {"uhp": 2, "default": 1}.get(args.precision)
    if precision is None:
        print(f"{PROG}: error: --precision {args.precision!r}: use uhp or default", file=sys.stderr)
        return 2
    from vllm.utils.platform_utils import num_compute_units

    from ... import settings
    from ...eligibility import resolve_cut
    from ...plugin import register

    register()
    if args.skew:
        heads, short, count, longs = skew_setup(args)
        skews = [measure_skew(heads, short, count, long, precision, args.iters) for long in longs]
        from ...skew import ASM_SKEW_RATIO

        data = {
            "precision": args.precision,
            "skew": [asdict(t) | {"ratio": t.ratio} for t in skews],
            "suggested_skew": suggested_skew(skews),
        }
        # The file first: a reader of stdout that has gone away must not cost it.
        if not _write_json(args.json, data) or not _write_plot(args.plot, plot_skew, skews):
            return 1
        print(render_skew(skews, args.precision, ASM_SKEW_RATIO))
        return 0
    timings = [measure(case, precision, args.iters) for case in grid_cases(args)]
    cut = resolve_cut(num_compute_units(), settings.cut_override())
    data = {
        "precision": args.precision,
        "cut": cut,
        "timings": [asdict(t) | {"ratio": t.ratio} for t in timings],
        "crossover_seqs": crossover(timings) if args.sweep else None,
        "suggested_cut": suggested_cut(timings) if args.sweep else None,
    }
    if not _write_json(args.json, data) or not _write_plot(args.plot, plot_kernel, timings, cut):
        return 1
    print(render(timings, args.precision, args.sweep, cut))
    return 0


def _write_plot(path: str | None, plot: Callable[..., None], *data: object) -> bool:
    """``plot(*data, path)`` when a path was given; False (said in one line) when the
    file cannot be written after all."""
    if not path:
        return True
    try:
        plot(*data, path)
    except OSError as exc:
        print(f"{PROG}: error: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return False
    return True


def _write_json(path: str | None, data: dict) -> bool:
    """``data`` into ``path`` when one was given; False (said in one line) when it cannot
    be written after all."""
    if not path:
        return True
    try:
        Path(path).write_text(json.dumps(data, indent=2))
    except OSError as exc:
        print(f"{PROG}: error: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return False
    return True
