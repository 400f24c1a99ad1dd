"""``bench kernel``: this backend's ``impl.forward`` inside a CUDA graph, µs per call.

Both decode paths on the same fp8 cache, every sequence at the given context length:
the HIP decode (stock ``ROCM_ATTN``) and the asm decode, forced either way regardless
of the cut; ``asm/HIP`` < 1 means asm is faster. The asm path runs ``high_precision=2``
as shipped, or AITER's default precision with ``--precision default`` (the precision
the original change's kernel timings used). Defaults reproduce that grid: heads 40/8
and 32/8, contexts 1024 and 4096, 16/64/256 sequences (24/64/256 for 32/8).
``--sweep`` walks the batch size up from 1 at the first layout and context and reports
where asm starts to win, next to the default cut, and the ``VLLM_ROCM_ASM_DECODE_CUT``
that crossover suggests. Needs a gfx942/gfx950 GPU with AITER; elsewhere it exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .gpu import rocm_gpu_problem

PROG = "vllm-rocm-asm-decode bench kernel"
SEED_SEQS = {(40, 8): (16, 64, 256), (32, 8): (24, 64, 256)}
SEED_CONTEXTS = (1024, 4096)
SWEEP_SEQS = (*range(1, 17), *range(20, 65, 4), 80, 96, 128, 192, 256)


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


def grid(
    heads: Sequence[tuple[int, int]] | None,
    contexts: Sequence[int] | None,
    seqs: Sequence[int] | None,
) -> list[tuple[int, int, int, int]]:
    """(heads, kv_heads, context, num_seqs) to time; the seed's grid by default."""
    cases = []
    for h, kvh in heads or list(SEED_SEQS):
        for ctx in contexts or SEED_CONTEXTS:
            for n in seqs or SEED_SEQS.get((h, kvh), (16, 64, 256)):
                cases.append((h, kvh, ctx, n))
    return cases


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
    import torch

    from .. import testbed

    h, kvh, ctx, n = case
    model = testbed.build_model(
        Path(tempfile.mkdtemp()), num_heads=h, num_kv_heads=kvh, num_layers=1,
        num_blocks=n * (ctx // 16 + 2) + 8, device="cuda",
    )  # fmt: skip
    layer = model.layers[model.names[0]]
    layer.kv_cache.view(torch.uint8).random_(0, 0x40)  # finite fp8 values below 2
    batch = testbed.make_batch(model, [ctx] * n, contexts=False)
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
    return Timing(h, kvh, ctx, n, hip_us, asm_us)


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
    if args.sweep:
        heads = (args.heads or list(SEED_SEQS))[:1]
        contexts = (args.contexts or SEED_CONTEXTS)[:1]
        cases = grid(heads, contexts, args.seqs or SWEEP_SEQS)
    else:
        cases = grid(args.heads, args.contexts, args.seqs)
    timings = [measure(case, precision, args.iters) for case in cases]
    cut = resolve_cut(num_compute_units(), settings.cut_override())
    print(render(timings, args.precision, args.sweep, cut))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "precision": args.precision,
                    "cut": cut,
                    "timings": [asdict(t) | {"ratio": t.ratio} for t in timings],
                    "crossover_seqs": crossover(timings) if args.sweep else None,
                    "suggested_cut": suggested_cut(timings) if args.sweep else None,
                },
                indent=2,
            )
        )
    if args.plot:
        from .plots import plot_kernel

        plot_kernel(timings, cut, args.plot)
    return 0
