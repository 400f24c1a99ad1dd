"""The bytes the kernel reads: vLLM's V page is AITER's shuffled V exactly when the cache
is fp8 with 16-token blocks, and a non-dense layout (LBHNC) is refused because the kernel
would read the wrong bytes there."""

from __future__ import annotations

import pytest
import torch

import harness
from vllm_rocm_asm_decode.tools.contract_model import _dense


def split(model, layer):
    from vllm.v1.attention.ops.paged_attn import PagedAttention

    return PagedAttention.split_kv_cache(
        layer.kv_cache.transpose(0, 1), model.num_kv_heads, model.head_size
    )


def shuffled_from_vllm_v(v: torch.Tensor, x: int) -> torch.Tensor:
    """AITER's shuffled V ``[nb, nkv, bs/x, hd, x]`` from vLLM's V ``[nb, nkv, hd, bs]``
    by its definition: element (b, h, s // x, d, s % x) holds token slot s, dim d."""
    nb, nkv, hd, bs = v.shape
    return v.reshape(nb, nkv, hd, bs // x, x).permute(0, 1, 3, 2, 4).contiguous()


def random_bytes(layer):
    raw = layer.kv_cache.view(torch.uint8)
    raw.copy_(torch.randint(0, 255, raw.shape, dtype=torch.uint8))


@pytest.mark.parametrize(
    ("cache_dtype", "block_size", "same"),
    [("fp8", 16, True), ("fp8", 32, False), ("auto", 16, False)],
    ids=["fp8-block16", "fp8-block32", "bf16-block16"],
)
def test_unsqueezed_v_is_aiters_shuffled_v_only_for_fp8_block16(
    tmp_path, cache_dtype, block_size, same
):
    model = harness.build_model(
        tmp_path, num_layers=1, cache_dtype=cache_dtype, block_size=block_size, num_blocks=32
    )
    layer = model.layers[model.names[0]]
    random_bytes(layer)
    _, v = split(model, layer)
    store = torch.uint8 if v.element_size() == 1 else torch.int16  # compare raw bits
    v = v.view(store)
    x = 16 // v.element_size()
    shuffled = shuffled_from_vllm_v(v, x)
    # What the kernel reads: dense pages from the base pointer of the view it is given.
    read = _dense(v.unsqueeze(2), tuple(shuffled.shape))
    assert torch.equal(read, shuffled) is same
    if same:
        assert torch.equal(v.unsqueeze(2), shuffled)


def test_lbhnc_pages_are_not_dense_and_the_kernel_would_read_wrong_bytes(tmp_path):
    """Under LBHNC the K and V pages of a block alternate: both views have the same,
    doubled block stride, so a reader honouring strides reads the right bytes and would
    hide the problem. The kernel steps by a dense page and reads the neighbour's bytes."""
    from vllm.v1.attention.ops.chunked_prefill_paged_decode import has_native_kv_cache_layout

    from vllm_rocm_asm_decode.kernel import current_arch, load_asm_kernel
    from vllm_rocm_asm_decode.tools.contract_model import PagedAttentionAsmModel

    model = harness.build_model(tmp_path, num_layers=1, layout="LBHNC", num_blocks=64)
    layer = model.layers[model.names[0]]
    k, v = split(model, layer)
    assert k.stride(0) == v.stride(0) == 2 * k.shape[1:].numel()
    assert not has_native_kv_cache_layout(k, v)

    batch = harness.make_batch(model, [40, 17, 33, 5])
    torch_writer_fill(model, layer, batch)
    kernel, _ = load_asm_kernel(current_arch())
    fp8 = layer.impl.fp8_dtype
    ones = torch.ones(k.shape[0], model.num_kv_heads, 16)
    run = PagedAttentionAsmModel(kernel.table)
    out = run(
        batch.query,
        k.view(fp8),
        v.view(fp8).unsqueeze(2),
        batch.block_table,
        batch.common.seq_lens,
        batch.block_table.stride(0),
        K_QScale=ones,
        V_QScale=ones,
        high_precision=2,
    )
    ref = harness.reference(model, batch, layer)
    assert (out.float() - ref).abs().max() > 0.1
    # The same bytes read through the views' real strides are right: the cache holds the
    # correct data, only the kernel's dense-page addressing misreads it.
    strided = torch.zeros_like(batch.query)
    harness.hip_decode_reference(
        strided,
        None,
        None,
        None,
        batch.query,
        k,
        v,
        model.num_kv_heads,
        layer.impl.scale,
        batch.block_table,
        batch.common.seq_lens,
        None,
        16,
        40,
        None,
        "fp8",
        torch.tensor(1.0),
        torch.tensor(1.0),
    )
    torch.testing.assert_close(strided.float(), ref, atol=2e-2, rtol=0)


def torch_writer_fill(model, layer, batch):
    """All tokens of every request, written through the views' real strides."""
    k, v = split(model, layer)
    for i, (kk, vv) in enumerate(batch.contexts):
        n = batch.seq_lens[i]
        pos = torch.arange(n)
        slots = batch.block_table[i, pos // 16].long() * 16 + pos % 16
        harness.cache_writer(
            kk.bfloat16(), vv.bfloat16(), k, v, slots, "fp8", torch.tensor(1.0), torch.tensor(1.0)
        )
