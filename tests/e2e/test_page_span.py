"""The page-span guard (plugin): AITER's fixed kernels address each wave's pages as a
32-bit offset from the wave's lowest page, so pages 2 GiB or more apart may be misread.
A layer whose cache can hold such pages keeps HIP unless the probe on its own cache at
bind time (or the trust switch) says this GPU reads them right. The stand-in AITER
misreads them by default (unknown on hardware, so never kinder); ``ASM_DECODE_TEST_
AITER_SPAN=right`` makes it read them right."""

from __future__ import annotations

import pytest
import torch

import harness
from vllm_rocm_asm_decode import page_span

pytestmark = harness.plugin_only

#: GQA 8 over one KV head: 2 KiB K pages, so 2**20 blocks reach 2 GiB apart. The pool
#: (4 GiB of K and V) is never touched but for the pages a test writes.
SPAN_BLOCKS = 2**31 // 2048 + 2
HEADS, KV_HEADS = 8, 1


@pytest.fixture
def fixed_aiter(aiter_version, kernels, monkeypatch):
    """AITER 0.1.27 (past the block-id fix: the span is the only question), probe answers
    of earlier tests forgotten."""
    aiter_version("0.1.27")
    monkeypatch.setattr(page_span, "_PROVEN", {})
    return monkeypatch


def span_model(tmp_path, num_blocks=SPAN_BLOCKS):
    return harness.build_untouched_model(
        tmp_path, num_layers=2, num_heads=HEADS, num_kv_heads=KV_HEADS, num_blocks=num_blocks
    )


def step(model):
    return harness.make_batch(model, [40] * 80, contexts=False)  # 640 query heads


def probe_pages(model) -> list[torch.Tensor]:
    far, near = page_span.probe_pages(model.num_blocks)
    idx = torch.tensor(far + near)
    return [layer.kv_cache[idx].clone() for layer in model.layers.values()]


def test_pages_far_apart_keep_hip_where_the_probe_sees_them_misread(
    tmp_path, fixed_aiter, plugin_log
):
    model = span_model(tmp_path)
    first = next(iter(model.layers.values()))
    first.kv_cache[1:80].view(torch.uint8).random_(0, 0x40)  # pages the probe overwrites
    before = probe_pages(model)
    metadata = model.builder.build(0, step(model).common)
    assert not metadata.use_asm_decode and harness.asm_layers(model.builder) == set()
    (reason,) = first.impl.asm_rejections
    assert reason == (
        "AITER's asm kernel read KV pages 2.0 GiB apart unlike adjacent ones (the "
        "bind-time page-span probe)"
    )
    assert harness.kept_on_hip(plugin_log, "2.0 GiB apart unlike adjacent ones")
    assert any("VLLM_ROCM_ASM_DECODE_TRUST_AITER=1" in m for m in plugin_log)
    # One probe launch (two sequences), the pages as they were.
    (call,) = harness.asm_calls()
    assert call["context_lens"].tolist() == [512, 512]
    assert all(torch.equal(a, b) for a, b in zip(before, probe_pages(model), strict=True))


def test_a_gpu_that_reads_them_right_is_admitted_by_the_probe(tmp_path, fixed_aiter, plugin_log):
    fixed_aiter.setenv("ASM_DECODE_TEST_AITER_SPAN", "right")
    model = span_model(tmp_path)
    assert model.builder.build(0, step(model).common).use_asm_decode
    assert harness.asm_layers(model.builder) == set(model.names)
    assert len(harness.asm_calls()) == 1  # the probe, once for both layers
    assert any("pages 2.0 GiB apart read right by the bind-time probe" in m for m in plugin_log)
    again = span_model(tmp_path / "again")  # same geometry: the answer is kept
    assert again.builder.build(0, step(again).common).use_asm_decode
    assert len(harness.asm_calls()) == 1


def test_the_trust_switch_admits_without_a_probe(tmp_path, fixed_aiter, plugin_log):
    from vllm_rocm_asm_decode.kernel import load_asm_kernel

    fixed_aiter.setenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", "1")
    load_asm_kernel.cache_clear()
    model = span_model(tmp_path)
    assert model.builder.build(0, step(model).common).use_asm_decode
    assert harness.asm_calls() == []
    assert any("pages 2.0 GiB apart trusted" in m for m in plugin_log)


def test_a_cache_that_cannot_reach_2_gib_is_not_probed(tmp_path, fixed_aiter):
    model = span_model(tmp_path, num_blocks=SPAN_BLOCKS - 1)  # 2 GiB less one page
    assert model.builder.build(0, step(model).common).use_asm_decode
    assert harness.asm_calls() == []


def test_a_probe_the_kernel_refuses_keeps_hip_and_does_not_crash(tmp_path, fixed_aiter):
    import functools

    import aiter

    @functools.wraps(aiter.pa_fwd_asm)
    def refused(*args, **kwargs):
        raise RuntimeError("hipModuleLaunchKernel failed\nmore")

    fixed_aiter.setattr(aiter, "pa_fwd_asm", refused)
    model = span_model(tmp_path)
    assert not model.builder.build(0, step(model).common).use_asm_decode
    (reason,) = model.layers[model.names[0]].impl.asm_rejections
    assert reason == (
        "KV pages 2.0 GiB apart are unproven: the page-span probe failed (RuntimeError: "
        "hipModuleLaunchKernel failed)"
    )
