"""After ``set_interleaved_v_cache()`` (called by vLLM's fused qk-norm + RoPE + cache-write
pass) the cache writer stores V pages as ``[block/x, head, x]`` (x = 16 / element size).
At fp8 with 16-token blocks that is the plain ``[head, 16]`` page byte for byte, and AITER's
shuffled V too, so the asm path reads the right bytes; at 32-token blocks it is not, and
the rule refuses the layer."""

from __future__ import annotations

import torch
from vllm.v1.attention.ops.paged_attn import PagedAttention

import harness
from conftest import ARCH
from rocm_emulation import COMPUTE_UNITS

CUT = 2 * COMPUTE_UNITS[ARCH]


def interleaved_model(tmp_path, block_size: int):
    model = harness.build_model(tmp_path, num_layers=1, block_size=block_size, num_blocks=96)
    for layer in model.layers.values():
        layer.impl.set_interleaved_v_cache()  # as the fusion pass does
    return model


def test_fp8_block16_interleaved_v_is_read_right_by_the_asm_path(tmp_path, kernels):
    model = interleaved_model(tmp_path, 16)
    name = model.names[0]
    layer = model.layers[name]
    batch = harness.make_batch(model, [70, 16, 3, 40] * 5)  # 20 x 40 heads > cut
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    assert metadata.use_asm_decode and name in harness.asm_layers(model.builder)
    out = harness.run_layer(model, name, batch, metadata)
    assert len(harness.asm_calls()) == 1 and kernels.hip_decode == 0
    torch.testing.assert_close(
        out.float(), harness.reference(model, batch, layer), atol=2e-2, rtol=0
    )


def test_control_the_stock_path_reads_the_interleaved_pages_too(tmp_path, kernels):
    """Below the cut the stock decode reads the same cache through the interleaved layout:
    the writer and the readers agree on it."""
    model = interleaved_model(tmp_path, 16)
    name = model.names[0]
    batch = harness.make_batch(model, [70, 16, 3, 40])
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    assert not metadata.use_asm_decode
    out = harness.run_layer(model, name, batch, metadata)
    assert kernels.hip_decode == 1
    ref = harness.reference(model, batch, model.layers[name])
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=0)


def test_fp8_block32_interleaved_v_differs_from_the_plain_page_and_is_refused(
    tmp_path, kernels, plugin_log
):
    model = interleaved_model(tmp_path, 32)
    name = model.names[0]
    layer = model.layers[name]
    batch = harness.make_batch(model, [70, 33, 40] * 8)
    harness.fill_context(model, batch)
    _, value_cache = PagedAttention.split_kv_cache(
        layer.kv_cache.transpose(0, 1), model.num_kv_heads, model.head_size
    )
    fp8 = layer.impl.fp8_dtype
    # Read back one request's V through the plain and the interleaved layouts.
    _, v = batch.contexts[0]
    seq = batch.seq_lens[0] - 1  # tokens the writer stored before this step
    pages = batch.block_table[0, : (seq + 31) // 32].long()
    plain = value_cache.view(fp8)[pages].float().permute(1, 0, 3, 2).reshape(8, -1, 128)
    packed = harness.interleaved_v_pages(value_cache.view(fp8))[pages].float()
    packed = packed.permute(1, 0, 2, 4, 3).reshape(8, -1, 128)
    want = v[:seq].to(torch.bfloat16).float().to(fp8).float().transpose(0, 1)
    torch.testing.assert_close(packed[:, :seq], want, atol=0, rtol=0)
    assert not torch.equal(plain[:, :seq], want)
    metadata = model.builder.build(0, batch.common)
    assert not metadata.use_asm_decode and name not in harness.asm_layers(model.builder)
    assert any("block size 32" in m for m in plugin_log)
