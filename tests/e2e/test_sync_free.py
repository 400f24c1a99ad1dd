"""The asm path reads no device value on the host and allocates nothing per call."""

from __future__ import annotations

import torch

import harness
from op_audit import OpRecorder


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
        assert recorder.host_reads == [], recorder.ops
    assert forward_ops.allocations == [], forward_ops.ops


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
    assert len(ops.allocations) >= 3
    assert ops.host_reads  # the torch reference reads lengths
