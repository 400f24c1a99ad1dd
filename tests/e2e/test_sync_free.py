"""The asm path reads no device value on the host and allocates nothing per call."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import harness

#: Ops that read a device value on the host (a GPU sync) or move data to the host.
HOST_READS = {
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


class OpRecorder(TorchDispatchMode):
    """Every aten op, and whether its outputs are new storage (an allocation)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {
            t.untyped_storage().data_ptr()
            for t in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        outputs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        allocates = any(t.untyped_storage().data_ptr() not in inputs for t in outputs)
        self.ops.append((func.overloadpacket.__name__, allocates))
        return out


def test_forward_on_the_asm_path_is_sync_free_and_allocation_free(tmp_path, monkeypatch):
    # The stand-in kernel then issues no torch op at all: the kernel boundary is excluded.
    monkeypatch.setenv("ASM_DECODE_TEST_NOOP_KERNELS", "1")
    harness.reset_asm_calls()
    model = harness.build_model(tmp_path, num_layers=2)
    batch = harness.make_batch(model, [40] * 20)
    metadata = model.builder.build(0, batch.common)  # binds the layers (once)
    assert metadata.use_asm_decode
    out = torch.empty_like(batch.query)
    with OpRecorder() as build_ops:
        metadata = model.builder.build(0, batch.common)
    with OpRecorder() as forward_ops:
        for layer in model.layers.values():
            layer.impl.forward(
                layer, batch.query, batch.key, batch.value, layer.kv_cache, metadata, out
            )
    assert len(harness.asm_calls()) == 2  # the asm path really ran
    for recorder in (build_ops, forward_ops):
        assert not [op for op, _ in recorder.ops if op in HOST_READS], recorder.ops
    assert not [op for op, alloc in forward_ops.ops if alloc], forward_ops.ops


def test_the_recorder_sees_what_stock_decode_does(tmp_path, kernels):
    """Control: stock decode allocates scratch tensors per call, and the recorder sees it
    (so the assertion above would fail if the asm path did the same)."""
    model = harness.build_model(tmp_path, num_layers=1)
    batch = harness.make_batch(model, [40] * 4)  # below the cut: stock decode
    metadata = model.builder.build(0, batch.common)
    layer = model.layers[model.names[0]]
    out = torch.empty_like(batch.query)
    with OpRecorder() as ops:
        layer.impl.forward(
            layer, batch.query, batch.key, batch.value, layer.kv_cache, metadata, out
        )
    assert sum(alloc for _, alloc in ops.ops) >= 3
    assert any(op in HOST_READS for op, _ in ops.ops)  # the torch reference reads lengths
