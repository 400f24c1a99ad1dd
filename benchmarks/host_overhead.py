#!/usr/bin/env python
"""Host (Python) cost of the decode path: stock ``ROCM_ATTN`` against this plugin, one run.

Runs on any machine: vLLM takes its real ROCm code path on the CPU (the stand-ins of
``tests/``), and only the device launches are replaced by no-op functions of the same
signature (the HIP ``paged_attention_rocm`` op, the Triton prefill
``context_attention_fwd`` and ``aiter.pa_fwd_asm``; the Triton decode kernel is not
reached by these batches). Every line of Python above them runs:
stock ``RocmAttentionImpl.forward`` with its per-call eligibility checks and scratch
allocations, and the plugin's ``forward``; plus the metadata builders' ``build()``.

Timing is interleaved (stock, plugin, stock, ...) and reported as medians of per-call
microseconds. Also counted per call, with a TorchDispatchMode: tensor allocations and
ops that read a device value on the host (a GPU sync on real hardware).

Batches: 64 decodes (above the cut), 8 decodes (below it), and a mixed step of 63
decodes and one 512-token prefill chunk (the plugin splits it: decodes on asm).

Targets: on the asm path the plugin's forward costs at most half of stock decode's; a
split mixed step no more than stock's; below the cut (stock path) at most 1.05x stock.

Then the cost in ``build()`` of following a weight reload: a 40-layer builder whose
layers' scales come from the checkpoint (each step compares their host floats with the
scales their tables hold) against the same builder with fixed scales (nothing to
compare). Target: at most 2 µs per step.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import rocm_emulation  # noqa: E402

ARCH = rocm_emulation.activate()

import torch  # noqa: E402

from op_audit import OpRecorder  # noqa: E402

PRESETS = {"qwen3-14b": (40, 8), "llama-3.1-8b": (32, 8)}
#: (label, seq_lens, query_lens): the seed's concurrency 64 (above the cut), a batch below
#: it, and a mixed step of 63 decodes beside one 512-token prefill chunk.
BATCHES = (
    ("64", [256] * 64, [1] * 64),
    ("8", [256] * 8, [1] * 8),
    ("63+512", [256] * 63 + [1024], [1] * 63 + [512]),
)


def noop_paged_attention_rocm(*args, **kwargs) -> None:
    return None


def noop_context_attention_fwd(*args, **kwargs) -> None:
    return None


def noop_pa_fwd_asm(*args, **kwargs):
    """Returns ``out_`` at once; carries ``pa_fwd_asm``'s signature (set in main)."""
    return kwargs.get("out_")


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls / 1e3


def measure(stock, plugin, repeats: int, calls: int) -> tuple[float, float]:
    """Medians of per-call µs, stock and plugin timed in alternation."""
    for _ in range(20):  # warm-up
        stock()
        plugin()
    s, p = [], []
    for _ in range(repeats):
        s.append(per_call_us(stock, calls))
        p.append(per_call_us(plugin, calls))
    return statistics.median(s), statistics.median(p)


def counts(fn) -> tuple[int, int]:
    """Tensor allocations and host reads of device values in one call."""
    with OpRecorder() as recorder:
        fn()
    return len(recorder.allocations), len(recorder.host_reads)


def install_noop_kernels() -> None:
    import aiter
    from vllm import _custom_ops

    from vllm_rocm_asm_decode.tools.contract_model import PagedAttentionAsmModel

    signature = inspect.signature(PagedAttentionAsmModel.__call__)
    noop_pa_fwd_asm.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=list(signature.parameters.values())[1:]
    )
    from vllm.v1.attention.ops import chunked_prefill_paged_decode

    aiter.pa_fwd_asm = noop_pa_fwd_asm
    _custom_ops.paged_attention_rocm = noop_paged_attention_rocm
    chunked_prefill_paged_decode.context_attention_fwd = noop_context_attention_fwd


def run(repeats: int, calls: int) -> list[tuple]:
    from vllm.v1.attention.backends.rocm_attn import (
        RocmAttentionImpl,
        RocmAttentionMetadataBuilder,
    )

    import harness

    rows = []
    for preset, (heads, kvh) in PRESETS.items():
        model = harness.build_model(
            num_layers=1,
            num_heads=heads,
            num_kv_heads=kvh,
            num_blocks=2048,
        )
        name = model.names[0]
        layer = model.layers[name]
        stock_impl = RocmAttentionImpl(heads, 128, 128**-0.5, kvh, None, None, "fp8")
        stock_builder = RocmAttentionMetadataBuilder(
            model.spec, [name], model.vllm_config, torch.device("cpu")
        )
        for label, seq_lens, query_lens in BATCHES:
            batch = harness.make_batch(model, seq_lens, query_lens, contexts=False)
            md_plugin = model.builder.build(0, batch.common)
            md_stock = stock_builder.build(0, batch.common)
            out = torch.empty_like(batch.query)
            call = (layer, batch.query, batch.key, batch.value, layer.kv_cache)
            kernel = (
                "asm"
                if md_plugin.use_asm_decode
                else "asm+prefill"
                if md_plugin.asm_split is not None
                else "hip"
            )
            cases = [
                (
                    "forward",
                    kernel,
                    partial(stock_impl.forward, *call, md_stock, out),
                    partial(layer.impl.forward, *call, md_plugin, out),
                ),
                (
                    "build()",
                    "-",
                    partial(stock_builder.build, 0, batch.common),
                    partial(model.builder.build, 0, batch.common),
                ),
            ]
            for what, kern, fs, fp in cases:
                s, p = measure(fs, fp, repeats, calls)
                rows.append(
                    (preset, f"{heads}/{kvh}", label, what, kern, s, p, counts(fs), counts(fp))
                )
    return rows


def reload_check(repeats: int, calls: int) -> tuple[float, float]:
    """What build() spends following a weight reload: the check a 40-layer, 40/8-head
    builder makes each step (its layers' scales come from the checkpoint, so each owns
    its tables and its host floats are compared with what the tables hold), timed
    against an empty call; returns (empty call, check) in µs."""
    import harness

    model = harness.build_model(num_layers=40, num_blocks=64)
    for i, layer in enumerate(model.layers.values()):
        harness.load_checkpoint_scales(layer, 0.5 + i / 128, 0.25 + i / 128)
    batch = harness.make_batch(model, [16] * 40, contexts=False)
    assert model.builder.build(0, batch.common).use_asm_decode
    tables = model.builder.asm_bindings.tables
    assert len(tables.owners) == 40
    return measure(lambda: None, tables.follow_reload, repeats, calls)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="interleaved rounds (median)")
    parser.add_argument("--calls", type=int, default=300, help="calls per timed round")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args()

    rocm_emulation.patch_compute_units(ARCH)
    install_noop_kernels()
    from vllm_rocm_asm_decode.plugin import register

    register()
    rows = run(args.repeats, args.calls)
    cut = 2 * rocm_emulation.COMPUTE_UNITS[ARCH]
    print(
        f"host overhead per call, CPU, stand-in {ARCH} (cut {cut} query heads), "
        f"no-op device kernels; medians of {args.repeats} interleaved rounds x "
        f"{args.calls} calls\n"
    )
    print(
        "| model | heads | seqs | what | plugin kernel | stock µs | plugin µs | ratio "
        "| allocs stock/plugin | host reads stock/plugin |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    missed = []
    for preset, hk, n, what, kernel, s, p, cs, cp in rows:
        ratio = p / s
        print(
            f"| {preset} | {hk} | {n} | {what} | {kernel} | {s:.1f} | {p:.1f} | {ratio:.2f} "
            f"| {cs[0]}/{cp[0]} | {cs[1]}/{cp[1]} |"
        )
        limit = {"asm": 0.5, "asm+prefill": 1.0, "hip": 1.05}.get(kernel)
        limit = limit if what == "forward" else None
        if limit is not None and ratio > limit:
            missed.append(f"{preset} {n} seqs {kernel}: {ratio:.2f} > {limit}")
    empty, check = reload_check(args.repeats, args.calls)
    added = check - empty
    print(
        f"\nbuild(), 40 layers with checkpoint scales: the reload check takes {check:.2f} µs "
        f"against {empty:.2f} µs for an empty call: following a weight reload adds "
        f"{added:.2f} µs per step"
    )
    if added > 2.0:
        missed.append(f"reload check {added:.2f} µs > 2 µs")
    print(
        "\ntargets: asm-path forward <= 0.50x stock, split mixed step <= 1.00x stock, "
        "below-cut forward <= 1.05x stock, reload check <= 2 µs a step: "
        + ("met" if not missed else "MISSED: " + "; ".join(missed))
    )
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
