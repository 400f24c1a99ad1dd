"""The plugin's guards at the AITER boundary: an incompatible ``pa_fwd_asm`` or an
unreadable kernel table (in-tree, vLLM pins its AITER: neither is checked there)."""

from __future__ import annotations

import pytest

import harness
from vllm_rocm_asm_decode.kernel import load_asm_kernel, signature_problem

pytestmark = harness.plugin_only


def old_pa_fwd_asm(
    query,
    key_cache,
    value_cache,
    block_tables,
    context_lens,
    max_num_blocks,
    max_qlen=1,
    K_QScale=None,
    V_QScale=None,
    out_=None,
    qo_indptr=None,
):
    """The signature of AITER releases before ``block_tables_stride0``/``high_precision``."""
    raise AssertionError("must never be called")


@pytest.fixture
def fresh_kernel_cache():
    load_asm_kernel.cache_clear()
    yield
    load_asm_kernel.cache_clear()


def test_signature_problem_names_the_missing_keywords():
    import aiter

    assert signature_problem(aiter.pa_fwd_asm) is None
    problem = signature_problem(old_pa_fwd_asm)
    assert problem is not None
    assert "Q, K, V" in problem and "block_tables_stride0" in problem
    assert "high_precision" in problem


def test_old_aiter_keeps_every_layer_on_hip_and_says_so(
    tmp_path, kernels, plugin_log, monkeypatch, fresh_kernel_cache
):
    import aiter

    monkeypatch.setattr(aiter, "pa_fwd_asm", old_pa_fwd_asm)
    model = harness.build_model(tmp_path, num_layers=1)
    batch = harness.make_batch(model, [40] * 20)
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    assert not metadata.use_asm_decode
    harness.run_layer(model, model.names[0], batch, metadata)
    assert kernels.hip_decode == 1
    assert any("asm decode is off" in m and "block_tables_stride0" in m for m in plugin_log)


def test_unreadable_table_falls_back_to_gqa_up_to_8_and_says_so(
    tmp_path, kernels, plugin_log, monkeypatch, fresh_kernel_cache
):
    monkeypatch.setenv("AITER_ASM_DIR", str(tmp_path / "nowhere"))
    gqa8 = harness.build_model(tmp_path / "a", num_layers=1, num_heads=40, num_kv_heads=5)
    batch = harness.make_batch(gqa8, [40] * 20)
    assert gqa8.builder.build(0, batch.common).use_asm_decode
    assert any("kernel table was not read" in m and "GQA <= 8" in m for m in plugin_log)
    gqa16 = harness.build_model(tmp_path / "b", num_layers=1, num_heads=64, num_kv_heads=4)
    assert not gqa16.builder.build(0, harness.make_batch(gqa16, [40] * 20).common).use_asm_decode
