"""The rule, as a property: asm runs if and only if every condition of the SPEC holds.

The oracle below restates the SPEC's conditions independently of the code under test."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_rocm_asm_decode.decision import call_uses_asm, step_uses_asm
from vllm_rocm_asm_decode.eligibility import LayerFacts, rejection_reasons
from vllm_rocm_asm_decode.kernel_table import fallback_table, load_table

HSA = Path(__file__).resolve().parents[1] / "standins" / "kernels" / "aiter" / "hsa"
TABLES = {arch: load_table(HSA, arch)[0] for arch in ("gfx942", "gfx950")}
TABLES["gfx1250"] = fallback_table("gfx1250")

SCALES = [
    128**-0.5,
    1 / math.sqrt(128),
    float(torch.tensor(128**-0.5, dtype=torch.float32)),
    0.0625,
    128**-0.5 * 1.001,
    1.0,
    64**-0.5,
]

facts_strategy = st.builds(
    LayerFacts,
    kv_cache_dtype=st.sampled_from(["fp8", "fp8_e4m3", "fp8_e5m2", "auto", "bfloat16"]),
    block_size=st.sampled_from([16, 32, 64, 544]),
    head_size=st.sampled_from([64, 128, 256]),
    num_heads=st.sampled_from([8, 16, 28, 32, 40, 64, 80]),
    num_kv_heads=st.sampled_from([1, 2, 4, 5, 8, 16]),
    query_dtype=st.sampled_from(
        [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn]
    ),
    scale=st.sampled_from(SCALES),
    sliding_window=st.booleans(),
    alibi=st.booleans(),
    logits_soft_cap=st.sampled_from([0.0, 30.0]),
    sinks=st.booleans(),
    decoder_self_attention=st.booleans(),
    native_kv_layout=st.booleans(),
    max_model_len=st.sampled_from([4096, 40960, 131072, 131073, 262144]),
)


def oracle_layer_ok(f: LayerFacts, arch: str) -> bool:
    gqa = f.num_heads / f.num_kv_heads
    return (
        f.kv_cache_dtype in ("fp8", "fp8_e4m3")
        and f.block_size == 16
        and f.head_size == 128
        and f.query_dtype in (torch.bfloat16, torch.float16)
        and gqa == int(gqa)
        and 1 <= gqa <= 8
        and arch in ("gfx942", "gfx950")
        and abs(f.scale - 1 / math.sqrt(128)) < 1e-6 * 0.0884
        and not (f.sliding_window or f.alibi or f.logits_soft_cap or f.sinks)
        and f.decoder_self_attention
        and f.native_kv_layout
        and f.max_model_len <= 131072
    )


@settings(max_examples=400, deadline=None)
@given(
    facts=facts_strategy,
    arch=st.sampled_from(sorted(TABLES)),
    max_query_len=st.integers(1, 4),
    num_tokens=st.integers(1, 600),
    padding_reqs=st.integers(0, 2),
    cut=st.sampled_from([512, 608, 1000]),
    output_quant=st.booleans(),
    call_query_fp8=st.booleans(),
)
def test_asm_iff_every_condition_holds(
    facts, arch, max_query_len, num_tokens, padding_reqs, cut, output_quant, call_query_fp8
):
    num_reqs = num_tokens + padding_reqs if max_query_len == 1 else max(1, num_tokens // 2)
    layer_ok = not rejection_reasons(facts, TABLES[arch])
    step = step_uses_asm(
        max_query_len=max_query_len,
        num_tokens=num_tokens,
        num_reqs=num_reqs,
        num_heads=facts.num_heads,
        cut=cut,
    )
    chosen = call_uses_asm(
        step_asm=step,
        layer_eligible=layer_ok,
        output_quant_requested=output_quant,
        tensors_ok=not call_query_fp8,
    )
    expected = (
        oracle_layer_ok(facts, arch)
        and max_query_len == 1
        and num_reqs == num_tokens
        and num_tokens * facts.num_heads > cut
        and not output_quant
        and not call_query_fp8
    )
    assert chosen == expected
    assert layer_ok == oracle_layer_ok(facts, arch)


@given(facts=facts_strategy)
def test_every_rejection_names_its_reason(facts):
    reasons = rejection_reasons(facts, TABLES["gfx950"])
    assert all(isinstance(r, str) and r for r in reasons)
    if facts.kv_cache_dtype == "fp8_e5m2":
        assert any("fp8_e5m2" in r for r in reasons)
    if facts.sinks:
        assert any("sinks" in r for r in reasons)
    if not facts.decoder_self_attention:
        assert any("decoder self-attention" in r for r in reasons)


def test_llama_and_qwen3_scales_pass_but_gemma_does_not():
    base = LayerFacts(
        "fp8",
        16,
        128,
        40,
        8,
        torch.bfloat16,
        128**-0.5,
        False,
        False,
        0.0,
        False,
        True,
        True,
        40960,
    )
    assert 128**-0.5 != 1 / math.sqrt(128)  # the last-bit difference the rule tolerates
    assert rejection_reasons(base, TABLES["gfx950"]) == []
    gemma = LayerFacts(**{**base.__dict__, "scale": 256**-0.5})
    assert rejection_reasons(gemma, TABLES["gfx950"]) == ["softmax scale 0.0625 != 1/sqrt(128)"]


def test_step_cut_is_strictly_above():
    kw = dict(max_query_len=1, num_heads=32, cut=512)
    assert not step_uses_asm(num_tokens=16, num_reqs=16, **kw)  # 512 is not above 512
    assert step_uses_asm(num_tokens=17, num_reqs=17, **kw)
    assert not step_uses_asm(num_tokens=17, num_reqs=18, **kw)  # a request without a row


def test_every_failed_clause_is_reported_not_just_the_first():
    facts = LayerFacts(
        "fp8_e5m2",
        32,
        128,
        64,
        4,
        torch.float32,
        0.0625,
        True,
        False,
        0.0,
        False,
        True,
        False,
        262144,
    )
    reasons = rejection_reasons(facts, TABLES["gfx950"])
    for part in (
        "fp8_e5m2",
        "torch.float32 query",
        "block size 32",
        "softmax scale 0.0625",
        "sliding window",
        "not dense",
        "max_model_len 262144",
    ):
        assert any(part in r for r in reasons), (part, reasons)
    assert len(reasons) == 7
