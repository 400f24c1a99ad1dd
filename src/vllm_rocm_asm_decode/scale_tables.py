"""Per-slot scale tables for the asm kernel, shared with vLLM's ``ROCM_AITER_FA``.

The asm kernel reads fp32 dequant scales as dense ``[num_blocks, num_kv_heads,
block_size]`` tables; vLLM's fp8 cache has one scale per tensor. vLLM's
``AsmKvScaleTables`` keeps one constant table per distinct (device, shape, scale),
and this module uses the very instance ``ROCM_AITER_FA``'s builder holds, so every
layer, builder and backend with equal scales shares one allocation.

Tables are allocated after vLLM has sized the KV cache, so they are budgeted first
(:func:`fit_tables`) against the memory vLLM did not claim (:func:`table_memory`): with
calibrated per-layer KV scales every layer needs a K and a V table of its own (about 3 %
of the KV cache), which a high ``--gpu-memory-utilization`` may not leave room for.
Layers whose tables do not fit keep the HIP decode.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .log import logger

if TYPE_CHECKING:
    from vllm.v1.attention.backends.rocm_aiter_fa import AsmKvScaleTables

#: Device memory kept spare below the budget, for the allocator's rounding and
#: fragmentation and for other processes on the GPU.
MEMORY_MARGIN = 512 * 1024**2

#: A table as ``AsmKvScaleTables`` keys it: (device, num_blocks, num_kv_heads,
#: block_size, scale). Should vLLM change its key, existing tables are not recognised
#: and merely counted again (a conservative budget, never a missed allocation).
TableKey = tuple[str, int, int, int, float]


def shared_scale_tables() -> AsmKvScaleTables:
    """The process-wide table store (``ROCM_AITER_FA``'s builder's class attribute)."""
    from vllm.v1.attention.backends.rocm_aiter_fa import (
        AiterFlashAttentionMetadataBuilder,
    )

    return AiterFlashAttentionMetadataBuilder.asm_kv_scale_tables


def table_key(
    device: torch.device | str,
    num_blocks: int,
    num_kv_heads: int,
    block_size: int,
    scale: float,
) -> TableKey:
    return (str(device), num_blocks, num_kv_heads, block_size, scale)


def table_bytes(key: TableKey) -> int:
    _, num_blocks, num_kv_heads, block_size, _ = key
    return num_blocks * num_kv_heads * block_size * 4  # fp32


def table_memory(
    device: torch.device, claimed_fraction: float | None = None
) -> int | None:
    """Bytes the tables may take on ``device``, from one ``get_memory_info`` reading:
    the free memory, capped to the share vLLM left unclaimed (``1 -
    gpu_memory_utilization`` of the total; the rest of the free memory is headroom vLLM
    counted on for activations and CUDA graphs). None where the device reports no
    figure (the CPU)."""
    try:
        free, total = torch.accelerator.get_memory_info(device)
    except Exception as exc:  # not a GPU device, or no GPU runtime
        if device.type == "cuda":
            logger.warning_once(
                "ROCM_ATTN asm decode: no free-memory figure for %s (%s); scale tables "
                "are not budgeted",
                device,
                exc,
            )
        return None
    if claimed_fraction is None:
        return int(free)
    return int(min(free, total * (1 - claimed_fraction)))


@dataclass(frozen=True)
class TableBudget:
    """The tables a set of layers needs, and which layers get theirs."""

    #: Distinct tables the layers need (already allocated ones included).
    tables: int
    #: Their bytes.
    bytes: int
    #: Bytes of those not allocated yet.
    new_bytes: int
    #: Per requesting layer, in order: whether its tables fit.
    fits: list[bool]
    #: The memory the tables could take (see :func:`table_memory`); None when the
    #: device reports no figure.
    free: int | None
    margin: int


def fit_tables(
    requests: Sequence[tuple[TableKey, TableKey]],
    free: int | None,
    existing: Iterable[TableKey] = (),
    margin: int = MEMORY_MARGIN,
) -> TableBudget:
    """Budget each layer's (K, V) tables, in order, against ``free - margin`` bytes.

    Tables that exist already, or that an earlier layer in ``requests`` gets, cost
    nothing more; a layer fits when the tables it adds fit in what is left (a layer that
    adds none always fits). ``free=None`` (no memory figure) lets every layer fit.
    """
    have = set(existing)
    left = None if free is None else free - margin
    needed: set[TableKey] = set()
    new_bytes = 0
    fits = []
    for keys in requests:
        needed.update(keys)
        adds = {key for key in keys if key not in have}
        cost = sum(table_bytes(key) for key in adds)
        ok = left is None or cost == 0 or cost <= left
        if ok:
            have |= adds
            new_bytes += cost
            if left is not None:
                left -= cost
        fits.append(ok)
    return TableBudget(
        tables=len(needed),
        bytes=sum(table_bytes(key) for key in needed),
        new_bytes=new_bytes,
        fits=fits,
        free=free,
        margin=margin,
    )


def scale_tables(
    device: torch.device,
    num_blocks: int,
    num_kv_heads: int,
    block_size: int,
    k_scale: float,
    v_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V tables for one layer's per-tensor scales (the floats HIP
    receives)."""
    store = shared_scale_tables()
    return (
        store.get(device, num_blocks, num_kv_heads, block_size, k_scale),
        store.get(device, num_blocks, num_kv_heads, block_size, v_scale),
    )


def existing_tables() -> list[TableKey]:
    """Keys of the tables the shared store already holds."""
    return list(shared_scale_tables().tables)


def mib(num_bytes: int) -> str:
    return f"{num_bytes / 1024**2:.1f} MiB"
