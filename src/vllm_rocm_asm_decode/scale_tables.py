"""Per-slot scale tables for the asm kernel, shared with vLLM's ``ROCM_AITER_FA``.

The asm kernel reads fp32 dequant scales as dense ``[num_blocks, num_kv_heads,
block_size]`` tables; vLLM's fp8 cache has one scale per tensor. vLLM's
``AsmKvScaleTables`` keeps one constant table per distinct (device, shape, scale),
and this module uses the very instance ``ROCM_AITER_FA``'s builder holds, so every
layer, builder and backend with equal scales shares one allocation.
"""

from __future__ import annotations

import torch
from vllm.v1.attention.backends.rocm_aiter_fa import (
    AiterFlashAttentionMetadataBuilder,
    AsmKvScaleTables,
)


def shared_scale_tables() -> AsmKvScaleTables:
    """The process-wide table store (``ROCM_AITER_FA``'s builder's class attribute)."""
    return AiterFlashAttentionMetadataBuilder.asm_kv_scale_tables


def scale_tables(
    device: torch.device,
    num_blocks: int,
    num_kv_heads: int,
    block_size: int,
    k_scale: float,
    v_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V tables for one layer's per-tensor scales (the floats HIP receives)."""
    store = shared_scale_tables()
    return (
        store.get(device, num_blocks, num_kv_heads, block_size, k_scale),
        store.get(device, num_blocks, num_kv_heads, block_size, v_scale),
    )
