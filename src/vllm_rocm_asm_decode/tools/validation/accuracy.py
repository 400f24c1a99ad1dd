"""``check accuracy``: each decode path's error against an fp32 reference, same fp8 cache.

On a gfx942/gfx950 GPU with AITER: the HIP decode (vLLM's chunked_prefill_paged_decode,
as stock ROCM_ATTN calls it), the asm decode at AITER's default precision, and the asm
decode at high_precision=2 (the shipped path), for head layouts 40/8, 32/8, 64/8, 32/4,
bf16 and fp16 queries, seeds 0-2 and context lengths 1, 15, 16, 17, 255, 1000, 4000
(sampled, not swept). Then, through the backend, two of the probes doctor runs: high KV
blocks (a pool past 4 GiB of pages) and CUDA-graph padding rows left finite.
Every sequence is a fresh draw of fp8 K/V in vLLM's cache layout (K [blocks, kv_heads,
head/16, 16, 16], V [blocks, kv_heads, head, 16], per-tensor scales), read by every path.

Tolerance, checked on the shipped path (exit 1 when exceeded): max |error| <= 0.039 and
mean |error| <= 0.0012, 1.5x the worst the original change measured for asm
high_precision=2 (0.026 / 0.00078; HIP measured 0.0035-0.0072 / 0.00013-0.00018).

Without such a GPU it runs the project's contract model of the asm kernel instead, on
a small grid, against the same tolerance: that checks the cache layout and the kernel's
semantics (dense pages, per-slot scales, 1/sqrt(head) scale), not precision modes, and
runs no HIP kernel.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..choices import ACCURACY_CONTEXTS, ACCURACY_LAYOUTS
from ..testbed import fp32_attention, store_fp8_tokens
from .gpu import rocm_gpu_problem
from .tolerances import MAX_TOL, MEAN_TOL

PROG = "vllm-rocm-asm-decode check accuracy"
SHIPPED = "asm high_precision=2"
FULL_GRID = dict(
    layouts=list(ACCURACY_LAYOUTS),
    seeds=[0, 1, 2],
    contexts=list(ACCURACY_CONTEXTS),
    dtypes=[torch.bfloat16, torch.float16],
)
SMALL_GRID = dict(
    layouts=[(40, 8), (32, 4)], seeds=[0], contexts=[1, 15, 16, 17, 255], dtypes=[torch.bfloat16]
)
HEAD_SIZE, BLOCK = 128, 16
K_SCALE, V_SCALE = 0.5, 0.25


@dataclass
class Case:
    query: torch.Tensor  # [seqs, heads, 128] bf16 or fp16
    key_cache: torch.Tensor  # vLLM's K view, uint8
    value_cache: torch.Tensor  # vLLM's V view, uint8
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    reference: torch.Tensor  # fp32, [seqs, heads, 128], on the CPU


@dataclass
class Measurement:
    num_heads: int
    num_kv_heads: int
    seed: int
    query_dtype: str
    path: str
    max_abs: float
    mean_abs: float


def build_case(
    heads: int,
    kv_heads: int,
    seed: int,
    contexts: Sequence[int],
    device: str,
    fp8: torch.dtype,
    dtype: torch.dtype = torch.bfloat16,
) -> Case:
    """Sequences of the given lengths in a KV cache viewed exactly as ROCM_ATTN views it."""
    from vllm.v1.attention.ops.paged_attn import PagedAttention

    gen = torch.Generator().manual_seed(seed)
    pages = [math.ceil(n / BLOCK) for n in contexts]
    num_blocks = sum(pages) + 1  # block 0 stays vLLM's null block
    raw = torch.zeros(2, num_blocks, BLOCK, kv_heads * HEAD_SIZE, dtype=torch.uint8)
    key_cache, value_cache = PagedAttention.split_kv_cache(raw, kv_heads, HEAD_SIZE)
    order = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    table = torch.zeros(len(contexts), max(pages) + 1, dtype=torch.int32)
    query = torch.randn(len(contexts), heads, HEAD_SIZE, generator=gen).to(dtype)
    reference = torch.empty(len(contexts), heads, HEAD_SIZE)
    for i, n in enumerate(contexts):
        blocks = [order.pop() for _ in range(pages[i])]
        table[i, : pages[i]] = torch.tensor(blocks, dtype=torch.int32)
        k = (torch.randn(n, kv_heads, HEAD_SIZE, generator=gen) / K_SCALE).to(fp8)
        v = (torch.randn(n, kv_heads, HEAD_SIZE, generator=gen) / V_SCALE).to(fp8)
        pos = torch.arange(n)
        store_fp8_tokens(
            key_cache, value_cache, table[i, pos // BLOCK].long() * BLOCK + pos % BLOCK, k, v
        )
        reference[i] = fp32_attention(
            query[i : i + 1], k.float() * K_SCALE, v.float() * V_SCALE, 1 / math.sqrt(HEAD_SIZE)
        )[0]
    return Case(
        query.to(device),
        key_cache.to(device),
        value_cache.to(device),
        table.to(device),
        torch.tensor(list(contexts), dtype=torch.int32, device=device),
        reference,
    )


def asm_path(kernel: Callable[..., torch.Tensor], precision: int, fp8: torch.dtype):
    """The kernel as the backend calls it, on the scale tables the backend makes (aliased
    over one chunk where the GPU offers virtual memory)."""
    from ...asm_scale_tables import make_table

    def run(case: Case) -> torch.Tensor:
        kv_heads, blocks = case.key_cache.shape[1], case.key_cache.shape[0]
        dev = case.query.device
        shape = (blocks, kv_heads, BLOCK)
        k_table, v_table = make_table(dev, shape, K_SCALE), make_table(dev, shape, V_SCALE)
        out = torch.empty_like(case.query)
        kernel(
            Q=case.query, K=case.key_cache.view(fp8),
            V=case.value_cache.view(fp8).unsqueeze(2),
            block_tables=case.block_table, context_lens=case.seq_lens,
            block_tables_stride0=case.block_table.stride(0),
            K_QScale=k_table.tensor, V_QScale=v_table.tensor,
            out_=out, high_precision=precision,
        )  # fmt: skip
        return out

    return run


def hip_path(fp8: torch.dtype):
    def run(case: Case) -> torch.Tensor:
        from vllm.v1.attention.ops.chunked_prefill_paged_decode import (
            chunked_prefill_paged_decode,
        )

        dev = case.query.device
        n = case.query.shape[0]
        out = torch.empty_like(case.query)
        chunked_prefill_paged_decode(
            query=case.query, key=None, value=None, output=out, kv_cache_dtype="fp8",
            key_cache=case.key_cache.view(fp8), value_cache=case.value_cache.view(fp8),
            block_table=case.block_table,
            query_start_loc=torch.arange(n + 1, dtype=torch.int32, device=dev),
            seq_lens=case.seq_lens, max_seq_len=int(case.seq_lens.max()), max_query_len=1,
            k_scale=torch.tensor(K_SCALE, device=dev), v_scale=torch.tensor(V_SCALE, device=dev),
            sm_scale=1 / math.sqrt(HEAD_SIZE),
        )  # fmt: skip
        return out

    return run


def measure(
    paths: dict[str, Callable[[Case], torch.Tensor]],
    layouts,
    seeds,
    contexts,
    device: str,
    fp8: torch.dtype,
    dtypes: Sequence[torch.dtype] = (torch.bfloat16,),
) -> list[Measurement]:
    rows = []
    for heads, kv_heads in layouts:
        for dtype in dtypes:
            for seed in seeds:
                case = build_case(heads, kv_heads, seed, contexts, device, fp8, dtype)
                for name, run in paths.items():
                    err = (run(case).float().cpu() - case.reference).abs()
                    rows.append(
                        Measurement(
                            heads,
                            kv_heads,
                            seed,
                            _dtype_name(dtype),
                            name,
                            float(err.max()),
                            float(err.mean()),
                        )
                    )
    return rows


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def verdict(rows: Sequence[Measurement], checked: str) -> list[str]:
    """Lines naming every measurement of the checked path over the tolerance."""
    return [
        f"{r.num_heads}/{r.num_kv_heads} {r.query_dtype} seed {r.seed}: max {r.max_abs:.4f} "
        f"(<= {MAX_TOL}), mean {r.mean_abs:.5f} (<= {MEAN_TOL})"
        for r in rows
        if r.path == checked and (r.max_abs > MAX_TOL or r.mean_abs > MEAN_TOL)
    ]


def render(rows: Sequence[Measurement]) -> str:
    lines = [
        "| heads (q/kv) | query | seed | path | max abs error | mean abs error |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.num_heads}/{r.num_kv_heads} | {r.query_dtype} | {r.seed} | {r.path} "
            f"| {r.max_abs:.4f} | {r.mean_abs:.5f} |"
        )
    lines.append("")
    for path in dict.fromkeys(r.path for r in rows):
        mx = [r.max_abs for r in rows if r.path == path]
        mn = [r.mean_abs for r in rows if r.path == path]
        lines.append(f"{path}: max {_span(mx, '.4f')} / mean {_span(mn, '.5f')}")
    return "\n".join(lines)


def _span(values: list[float], spec: str) -> str:
    """``low-high`` of ``values`` as printed, or one number where they print alike."""
    low, high = format(min(values), spec), format(max(values), spec)
    return low if low == high else f"{low}-{high}"


def main(args: argparse.Namespace) -> int:
    problem = rocm_gpu_problem()
    if problem is None:
        import aiter
        from vllm.platforms import current_platform

        fp8, device = current_platform.fp8_dtype(), "cuda"
        grid = FULL_GRID
        paths = {
            "HIP": hip_path(fp8),
            "asm default precision": asm_path(aiter.pa_fwd_asm, 1, fp8),
            SHIPPED: asm_path(aiter.pa_fwd_asm, 2, fp8),
        }
        checked = SHIPPED
        header = f"{PROG}: real kernels on the GPU"
    else:
        from ...kernel_table import fallback_table
        from ..contract_model import PagedAttentionAsmModel

        fp8, device = torch.float8_e4m3fn, "cpu"
        grid = SMALL_GRID
        checked = "contract model (asm semantics)"
        paths = {checked: asm_path(PagedAttentionAsmModel(fallback_table("gfx950")), 2, fp8)}
        header = (
            f"{PROG}: contract model ({problem}): checks the cache layout and the kernel's "
            "semantics only; no precision modes, no HIP kernel"
        )
    rows = measure(
        paths,
        args.heads or grid["layouts"],
        args.seeds or grid["seeds"],
        args.contexts or grid["contexts"],
        device,
        fp8,
        grid["dtypes"],
    )
    over = verdict(rows, checked)
    probes = []
    if problem is None:
        from . import selftest

        probes = [selftest.block_id_probe("cuda"), selftest.padding_probe("cuda")]
    # The file first, then stdout: a reader of stdout that has gone away must not cost it.
    if args.json:
        data = {"rows": [asdict(r) for r in rows], "probes": [asdict(c) for c in probes]}
        try:
            Path(args.json).write_text(json.dumps(data, indent=2))
        except OSError as exc:
            print(
                f"{PROG}: error: cannot write {args.json}: {exc.strerror or exc}", file=sys.stderr
            )
            return 1
    print(header)
    print(render(rows))
    print(
        f"\n{checked}: "
        + ("within tolerance" if not over else "OVER TOLERANCE: " + "; ".join(over))
    )
    for check in probes:
        print(f"{check.name}: {'ok' if check.ok else 'FAILED'}: {check.detail}")
    return 1 if over or not all(c.ok for c in probes) else 0
