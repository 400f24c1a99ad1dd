"""What follows the GPU family: run this suite once per stand-in arch
(``ASM_DECODE_TEST_GFX=gfx942`` or ``gfx950``; the README's test command runs both)."""

from __future__ import annotations

import torch

import harness
from conftest import ARCH
from rocm_emulation import COMPUTE_UNITS

FP8 = {"gfx942": torch.float8_e4m3fnuz, "gfx950": torch.float8_e4m3fn}[ARCH]
CUT = 2 * COMPUTE_UNITS[ARCH]  # 608 on MI300X/MI325X, 512 on MI355X


def test_platform_is_the_stand_in_arch():
    from vllm.platforms import current_platform
    from vllm.platforms.rocm import _GCN_ARCH

    assert current_platform.is_rocm() and _GCN_ARCH == ARCH
    assert current_platform.fp8_dtype() == FP8


def test_cut_follows_the_compute_units(tmp_path, kernels, plugin_log):
    model = harness.build_model(tmp_path, num_layers=1, num_heads=32, num_kv_heads=8)
    n = CUT // 32  # exactly at the cut: stays on HIP; one more sequence crosses it
    at = model.builder.build(0, harness.make_batch(model, [20] * n).common)
    above = model.builder.build(0, harness.make_batch(model, [20] * (n + 1)).common)
    assert (model.builder._asm_cut if harness.IN_TREE else model.builder.asm_cut) == CUT
    assert not at.use_asm_decode and above.use_asm_decode
    if harness.IN_TREE:
        assert any(f"layers above {CUT} query heads" in m for m in plugin_log)
    else:
        assert any(
            f"eligible on {ARCH}" in m and f"above {CUT} query heads" in m for m in plugin_log
        )


def test_cache_dtype_and_vllm_finalized_scales_follow_the_arch(tmp_path, kernels):
    model = harness.build_model(tmp_path, num_layers=1)
    name = model.names[0]
    layer = model.layers[name]
    harness.load_checkpoint_scales(layer, 0.5, 0.25)
    expected = (1.0, 0.5) if ARCH == "gfx942" else (0.5, 0.25)  # vLLM doubles on fnuz
    assert (layer._k_scale_float, layer._v_scale_float) == expected
    batch = harness.make_batch(model, [70, 16, 3, 40] * 5)
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    out = harness.run_layer(model, name, batch, metadata)
    call = harness.asm_calls()[-1]
    assert call["K"].dtype == FP8 and call["V"].dtype == FP8
    assert float(call["K_QScale"].flatten()[0]) == expected[0]  # what HIP would get
    assert float(call["V_QScale"].flatten()[0]) == expected[1]
    ref = harness.reference(model, batch, layer)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=0)


def test_gqa_up_to_8_has_a_kernel(tmp_path):
    for kvh, ok in ((8, True), (5, True), (4, False)):
        model = harness.build_model(
            tmp_path / str(kvh), num_layers=1, num_heads=40, num_kv_heads=kvh
        )
        model.builder.build(0, harness.make_batch(model, [20] * 16).common)
        assert (model.names[0] in harness.asm_layers(model.builder)) is ok, kvh
