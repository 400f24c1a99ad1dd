"""The plugin's guard on scale-table memory.

The asm kernel reads fp32 per-slot dequant scales, ``[num_blocks, num_kv_heads,
block_size]``; vLLM's fp8 cache has one scale per tensor. Tables come from
:mod:`.asm_scale_tables`: aliased over one chunk of device memory where the driver
offers virtual memory (a table costs a chunk, 2 MiB on an H200), else allocated in
full. Layers whose scales come from the checkpoint own a K and a V table, so that a
weight reload refills theirs in place; layers whose scales are fixed at 1.0 share one.

Allocated tables are budgeted before they are made (:func:`fit_tables`) against memory
vLLM did not count on for itself (:func:`table_memory`); the layers whose tables do
not fit keep the HIP decode. Aliased tables need no budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from .log import logger

#: Device memory kept spare below the budget, for the allocator's rounding and
#: fragmentation.
MEMORY_MARGIN = 512 * 1024**2

#: A table: (device, num_blocks, num_kv_heads, block_size, scale, owner). ``owner`` is
#: the layer whose own table it is, or ``""`` for a table shared by every layer of that
#: fixed scale.
TableKey = tuple[str, int, int, int, float, str]


def table_key(
    device: torch.device | str,
    num_blocks: int,
    num_kv_heads: int,
    block_size: int,
    scale: float,
    owner: str = "",
) -> TableKey:
    return (str(device), num_blocks, num_kv_heads, block_size, scale, owner)


def table_bytes(key: TableKey) -> int:
    """What the table would take allocated in full."""
    _, num_blocks, num_kv_heads, block_size, _, _ = key
    return num_blocks * num_kv_heads * block_size * 4  # fp32


def table_memory(
    device: torch.device, claimed_fraction: float | None = None
) -> int | None:
    """Bytes allocated tables may take on ``device``, read once at bind time: what is
    free on the device (so never what other processes hold) less the part of vLLM's
    own share (``gpu_memory_utilization`` of the total) this process has not used yet,
    which vLLM counts on for activations and CUDA graphs. With
    ``--kv-cache-memory-bytes`` (``claimed_fraction`` None) vLLM counts on all free
    memory: none. None where the device reports no figure (the CPU)."""
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
        return 0
    try:
        ours = torch.accelerator.memory_reserved(device)
    except Exception:  # counted as nothing of vLLM's share used yet: less room
        ours = 0
    headroom = max(0, int(claimed_fraction * total) - ours)
    return max(0, int(free) - headroom)


@dataclass(frozen=True)
class TableBudget:
    """The tables a set of layers needs, and which layers get theirs."""

    #: Distinct tables the layers need (already made ones included).
    tables: int
    #: What they take allocated in full.
    bytes: int
    #: Bytes of those not made yet.
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


def mib(num_bytes: int) -> str:
    return f"{num_bytes / 1024**2:.1f} MiB"
