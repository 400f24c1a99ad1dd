"""Whether a layer can decode on ``pa_fwd_asm``: one clause per hard fact of the kernel.

Decided once per layer, when its KV cache is bound and its scales are final. A rejected
layer keeps the stock HIP/Triton decode; each reason is a sentence for the log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .aiter_version import AiterBuild
from .kernel_table import ULTRA_PRECISION, KernelTable, dtype_name

#: The launcher passes the kernel no other head size.
ASM_HEAD_SIZE = 128
#: The shipped fp8 ultra-precision kernels exist for 16-token blocks only. At fp8 and 16
#: tokens, vLLM's V page ``[head_size, 16]`` and the interleaved V page the fused RoPE +
#: cache writer stores after ``set_interleaved_v_cache()`` (``[16/16, head_size, 16]``)
#: are both byte for byte AITER's shuffled V, so no relayout is needed either way; at
#: any other block size or element width the plain V page is not, and is refused here.
ASM_BLOCK_SIZE = 16
#: Longest model context the replaced HIP kernel serves
#: (``use_rocm_custom_paged_attention``).
MAX_MODEL_LEN = 131072
#: Longest context validated on hardware (passkey retrieval); longer ones are
#: unvalidated.
VALIDATED_CONTEXT = 32768
#: KV cache dtypes stored as the platform's e4m3 (``fp8_e5m2`` would be misread as
#: e4m3).
E4M3_CACHE_DTYPES = ("fp8", "fp8_e4m3")
#: Relative tolerance for the softmax scale: Llama/Qwen3 pass ``128 ** -0.5``, which
#: differs from the launcher's ``1 / sqrt(128)`` in the last bit.
SCALE_RTOL = 1e-6


@dataclass(frozen=True)
class LayerFacts:
    """What the rule needs to know about one attention layer."""

    kv_cache_dtype: str
    block_size: int
    head_size: int
    num_heads: int
    num_kv_heads: int
    query_dtype: torch.dtype
    scale: float
    sliding_window: bool
    alibi: bool
    logits_soft_cap: float
    sinks: bool
    decoder_self_attention: bool
    native_kv_layout: bool
    max_model_len: int
    #: Blocks in the layer's KV cache; None where not known yet (``plan`` without
    #: ``--num-gpu-blocks``), which leaves the block-id clause undecided.
    num_blocks: int | None = None
    #: Bytes from one K page to the next (the block stride the launcher passes).
    kv_page_bytes: int | None = None


def hardcoded_softmax_scale(head_size: int) -> float:
    """The scale the launcher bakes in: ``1 / sqrt(head_size)`` in float32."""
    return float(torch.tensor(1.0 / math.sqrt(head_size), dtype=torch.float32))


def rejection_reasons(
    facts: LayerFacts, kernels: KernelTable, aiter: AiterBuild
) -> list[str]:
    """Why this layer cannot run the asm decode; empty when it can."""
    f = facts
    reasons: list[str] = []
    # The ultra-precision kernels read an fp8 e4m3 cache.
    if f.kv_cache_dtype not in E4M3_CACHE_DTYPES:
        reasons.append(
            f"{f.kv_cache_dtype} KV cache (the asm decode reads fp8 e4m3 only)"
        )
    # Launcher: AITER_CHECK(head_size == 128).
    if f.head_size != ASM_HEAD_SIZE:
        reasons.append(f"head size {f.head_size} (the asm kernel takes 128 only)")
    # Launcher: Q must be fp16 or bf16.
    q_type = dtype_name(f.query_dtype)
    q_ok = q_type in ("bf16", "fp16")
    if not q_ok:
        reasons.append(f"{f.query_dtype} query (the asm kernel takes bf16/fp16 only)")
    if f.block_size != ASM_BLOCK_SIZE:
        reasons.append(f"block size {f.block_size} (asm decode needs 16-token blocks)")
    if f.num_kv_heads <= 0 or f.num_heads % f.num_kv_heads:
        reasons.append(f"{f.num_heads} query heads over {f.num_kv_heads} KV heads")
    elif not kernels.arch:
        # The launcher picks from the table of the arch it runs on; none is known here.
        reasons.append("an unknown GPU architecture (neither vLLM nor torch names it)")
    elif q_ok and q_type is not None and f.block_size == ASM_BLOCK_SIZE:
        # Launcher: no table row -> hard error. Asked for exactly as the call will ask.
        gqa = f.num_heads // f.num_kv_heads
        row = kernels.find(
            q_type=q_type,
            kv_type="fp8",
            gqa=gqa,
            block_size=f.block_size,
            high_precision=ULTRA_PRECISION,
        )
        if row is None:
            reasons.append(
                f"GQA {gqa} has no ultra-precision asm kernel on {kernels.arch}"
            )
        elif (missing := kernels.missing_file(row)) is not None:
            # Launcher: loads the row's .co file at the first call -> hard error if
            # absent.
            reasons.append(
                f"kernel file {missing} not installed (listed in pa_asm.csv)"
            )
    # Launcher: the softmax scale is hardcoded to 1/sqrt(head_size).
    expected = hardcoded_softmax_scale(f.head_size)
    if not math.isclose(f.scale, expected, rel_tol=SCALE_RTOL):
        reasons.append(f"softmax scale {f.scale:g} != 1/sqrt({f.head_size})")
    # The kernel has no arguments for any of these.
    if f.sliding_window:
        reasons.append("sliding window (not supported by the asm kernel)")
    if f.alibi:
        reasons.append("ALiBi (not supported by the asm kernel)")
    if f.logits_soft_cap:
        reasons.append("logits soft cap (not supported by the asm kernel)")
    if f.sinks:
        reasons.append("attention sinks (not supported by the asm kernel)")
    # Causal decode over the layer's own cache only.
    if not f.decoder_self_attention:
        reasons.append("not decoder self-attention")
    # The kernel steps between pages by a whole dense page.
    if not f.native_kv_layout:
        reasons.append("KV cache pages are not dense (needs vLLM's LHBNC layout)")
    # Envelope of the HIP kernel it replaces.
    if f.max_model_len > MAX_MODEL_LEN:
        reasons.append(f"max_model_len {f.max_model_len} > {MAX_MODEL_LEN}")
    # AITER before 0.1.17 misaddresses blocks >= 65536 or past 2 GiB, silently.
    if f.num_blocks is not None and (
        problem := aiter.block_id_problem(f.num_blocks, f.kv_page_bytes)
    ):
        reasons.append(problem)
    return reasons
