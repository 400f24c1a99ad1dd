"""Which aten ops a piece of Python runs: host reads of device values, and allocations.

Used by the sync-free tests and the host-overhead benchmark.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

#: Ops that read a device value on the host (a GPU sync) or move data to the host.
HOST_READS = frozenset(
    {
        "_local_scalar_dense",
        "item",
        "nonzero",
        "is_nonzero",
        "equal",
        "_to_copy",
        "copy_",
        "to",
        "tolist",
        "_pin_memory",
    }
)


class OpRecorder(TorchDispatchMode):
    """Every aten op run under it, with whether its outputs are new storage."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        allocates = any(
            t.untyped_storage().data_ptr() not in inputs
            for t in tree_leaves(out)
            if isinstance(t, torch.Tensor)
        )
        self.ops.append((func.overloadpacket.__name__, allocates))
        return out

    @property
    def allocations(self) -> list[str]:
        return [op for op, allocates in self.ops if allocates]

    @property
    def host_reads(self) -> list[str]:
        return [op for op, _ in self.ops if op in HOST_READS]
