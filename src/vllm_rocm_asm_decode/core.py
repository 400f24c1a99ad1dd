"""The asm decode's core: the kernel's hard facts, the per-layer rule, the per-step
decision and the call. Stage 1 of ``vllm-rocm-asm-decode upstream`` writes everything
below the imports into vLLM's ``rocm_attn.py``, with every name made private (a
leading underscore), except :func:`use_asm_decode` and :func:`asm_decode`, whose
clauses and arguments it writes inline in ``build`` and ``forward``. So this module
reads as vLLM code: no plugin setting, no AITER version, no memory budget (those are
the plugin's guards, :mod:`.eligibility`, around it).

``rocm_aiter_ops`` is vLLM's (:mod:`.aiter_ops` hands the plugin vLLM's own class where
it passes ``high_precision`` on to AITER, else a subclass that does).
"""

from typing import TYPE_CHECKING

import torch
from vllm.v1.attention.backend import AttentionType, CommonAttentionMetadata
from vllm.v1.attention.ops.chunked_prefill_paged_decode import (
    has_native_kv_cache_layout,
)
from vllm.v1.attention.ops.paged_attn import PagedAttention

from .aiter_ops import rocm_aiter_ops

if TYPE_CHECKING:
    from vllm.config import ModelConfig
    from vllm.v1.attention.backends.rocm_attn import RocmAttentionImpl

ASM_KV_DTYPES = ("fp8", "fp8_e4m3")  # pa_asm.csv's uhp kernels (gfx942, gfx950)
ASM_BLOCK_SIZE = 16
ASM_HEAD_SIZE = 128  # pa_fwd's
ASM_MAX_GQA = 8  # pa_asm.csv's uhp kernels are gqa8
ASM_PRECISION = 2  # the ultra-precision kernel
ASM_HEADS_PER_CU = 2  # AITER's cut for its lower precisions (paged_attention_common)
ASM_MAX_MODEL_LEN = 40960  # the A/B's --max-model-len; the kernel splits no context


def asm_decode_rejections(
    impl: "RocmAttentionImpl", kv_cache: torch.Tensor, model: "ModelConfig", mi3xx: bool
) -> list[str]:
    """Why pa_fwd_asm cannot decode this layer; empty when it can."""
    if impl.attn_type != AttentionType.DECODER:
        return ["not decoder self-attention"]
    dtype, max_len, limit = model.dtype, model.max_model_len, ASM_MAX_MODEL_LEN
    key_cache, value_cache = PagedAttention.split_kv_cache(
        kv_cache.transpose(0, 1), impl.num_kv_heads, impl.head_size
    )
    block_size, gqa = value_cache.shape[3], impl.num_heads // impl.num_kv_heads
    scale_ok = abs(impl.scale * impl.head_size**0.5 - 1) < 1e-6  # as pa_fwd scales
    clauses = (
        (mi3xx, "a GPU other than gfx942/gfx950"),
        (impl.kv_cache_dtype in ASM_KV_DTYPES, f"{impl.kv_cache_dtype} KV cache"),
        (block_size == ASM_BLOCK_SIZE, f"block size {block_size}"),
        (impl.head_size == ASM_HEAD_SIZE, f"head size {impl.head_size}"),
        (dtype in (torch.bfloat16, torch.float16), f"{dtype} query"),
        (gqa <= ASM_MAX_GQA, f"GQA {gqa}"),
        (scale_ok, f"softmax scale {impl.scale:g} != 1/sqrt({impl.head_size})"),
        (impl.sliding_window == (-1, -1), "sliding window"),
        (impl.alibi_slopes is None, "ALiBi"),
        (not impl.logits_soft_cap, "logits soft cap"),
        (impl.sinks is None, "attention sinks"),
        (has_native_kv_cache_layout(key_cache, value_cache), "KV pages not dense"),
        (kv_cache.shape[0] * impl.num_kv_heads < 2**25, "scale tables >= 2 GiB"),
        (max_len <= limit, f"max_model_len {max_len} > {limit}"),
    )
    return [reason for ok, reason in clauses if not ok]


def use_asm_decode(common: CommonAttentionMetadata, num_heads: int, cut: int) -> bool:
    """A pure-decode step (one token per request) above the cut."""
    return (
        common.max_query_len == 1
        and common.num_reqs == common.num_actual_tokens
        and common.num_actual_tokens * num_heads > cut
    )


def asm_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scales: tuple[torch.Tensor, torch.Tensor],
    output: torch.Tensor,
) -> None:
    """pa_fwd_asm of one query token per request over the fp8 cache views."""
    rocm_aiter_ops.pa_fwd_asm(
        Q=query,
        K=key_cache,
        V=value_cache.unsqueeze(2),
        block_tables=block_table,
        context_lens=seq_lens,
        block_tables_stride0=block_table.stride(0),
        K_QScale=scales[0],
        V_QScale=scales[1],
        out_=output,
        high_precision=ASM_PRECISION,
    )
