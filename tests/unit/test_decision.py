"""The rule, as a property: asm runs if and only if every condition of the SPEC holds.

The oracle below restates the SPEC's conditions independently of the code under test."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_rocm_asm_decode.aiter_version import AiterBuild
from vllm_rocm_asm_decode.decision import call_uses_asm, step_uses_asm
from vllm_rocm_asm_decode.eligibility import LayerFacts, rejection_reasons
from vllm_rocm_asm_decode.kernel_table import fallback_table, load_table

HSA = Path(__file__).resolve().parents[1] / "standins" / "kernels" / "aiter" / "hsa"
TABLES = {arch: load_table(HSA, arch)[0] for arch in ("gfx942", "gfx950")}
TABLES["gfx1250"] = fallback_table("gfx1250")
TABLES[""] = fallback_table("")  # neither vLLM nor torch named the arch
#: gfx950's table as an AITER built for other GPUs installs it: rows, but no .co files.
TABLES["gfx950-no-files"] = dataclasses.replace(
    TABLES["gfx950"], missing_files=frozenset(r.co_name for r in TABLES["gfx950"].rows)
)
#: The versions sampled, and whether each carries the block-id fix (AITER 0.1.17, PR 3211).
AITER_VERSIONS = {
    None: False,  # unknown counts as unfixed
    "0.1.0": False,  # a build without git metadata
    "0.1.7.post2.dev18": False,  # the only amd-aiter release on PyPI
    "0.1.16.post5": False,
    "0.1.17rc0": False,  # pre-releases sort before 0.1.17
    "0.1.17": True,
    "0.1.20": True,
    "0.1.27": True,
    "not-a-version": False,
}

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
    num_blocks=st.sampled_from([None, 256, 65536, 65537, 183104]),
)
aiter_strategy = st.builds(
    AiterBuild, version=st.sampled_from(list(AITER_VERSIONS)), trusted=st.booleans()
)


def oracle_layer_ok(f: LayerFacts, arch: str, aiter: AiterBuild) -> bool:
    gqa = f.num_heads / f.num_kv_heads
    return (
        f.kv_cache_dtype in ("fp8", "fp8_e4m3")
        and f.block_size == 16
        and f.head_size == 128
        and f.query_dtype in (torch.bfloat16, torch.float16)
        and gqa == int(gqa)
        and 1 <= gqa <= 8
        and arch in ("gfx942", "gfx950")  # with the kernel files installed
        and abs(f.scale - 1 / math.sqrt(128)) < 1e-6 * 0.0884
        and not (f.sliding_window or f.alibi or f.logits_soft_cap or f.sinks)
        and f.decoder_self_attention
        and f.native_kv_layout
        and f.max_model_len <= 131072
        and (
            f.num_blocks is None
            or f.num_blocks <= 65536
            or aiter.trusted
            or AITER_VERSIONS[aiter.version]
        )
    )


@settings(max_examples=400, deadline=None)
@given(
    facts=facts_strategy,
    arch=st.sampled_from(sorted(TABLES)),
    aiter=aiter_strategy,
    max_query_len=st.integers(1, 4),
    num_tokens=st.integers(1, 600),
    padding_reqs=st.integers(0, 2),
    cut=st.sampled_from([512, 608, 1000]),
    output_quant=st.booleans(),
    call_query_fp8=st.booleans(),
)
def test_asm_iff_every_condition_holds(
    facts, arch, aiter, max_query_len, num_tokens, padding_reqs, cut, output_quant, call_query_fp8
):
    num_reqs = num_tokens + padding_reqs if max_query_len == 1 else max(1, num_tokens // 2)
    layer_ok = not rejection_reasons(facts, TABLES[arch], aiter)
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
        oracle_layer_ok(facts, arch, aiter)
        and max_query_len == 1
        and num_reqs == num_tokens
        and num_tokens * facts.num_heads > cut
        and not output_quant
        and not call_query_fp8
    )
    assert chosen == expected
    assert layer_ok == oracle_layer_ok(facts, arch, aiter)


UNFIXED = AiterBuild("0.1.16.post5")


@given(facts=facts_strategy)
def test_every_rejection_names_its_reason(facts):
    reasons = rejection_reasons(facts, TABLES["gfx950"], UNFIXED)
    assert all(isinstance(r, str) and r for r in reasons)
    if facts.kv_cache_dtype == "fp8_e5m2":
        assert any("fp8_e5m2" in r for r in reasons)
    if facts.sinks:
        assert any("sinks" in r for r in reasons)
    if not facts.decoder_self_attention:
        assert any("decoder self-attention" in r for r in reasons)
    if facts.num_blocks is not None and facts.num_blocks > 65536:
        assert f"this cache has {facts.num_blocks} blocks" in reasons[-1]


LLAMA = LayerFacts(
    "fp8", 16, 128, 32, 8, torch.bfloat16, 128**-0.5, False, False, 0.0, False, True, True, 8192
)


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
    assert rejection_reasons(base, TABLES["gfx950"], UNFIXED) == []
    gemma = LayerFacts(**{**base.__dict__, "scale": 256**-0.5})
    assert rejection_reasons(gemma, TABLES["gfx950"], UNFIXED) == [
        "softmax scale 0.0625 != 1/sqrt(128)"
    ]


def test_step_cut_is_strictly_above():
    kw = dict(max_query_len=1, num_heads=32, cut=512)
    assert not step_uses_asm(num_tokens=16, num_reqs=16, **kw)  # 512 is not above 512
    assert step_uses_asm(num_tokens=17, num_reqs=17, **kw)
    # More requests than rows: Model Runner V2's trailing all-padding microbatch and a
    # drafter descriptor downgraded to eager build such steps; never asm.
    assert not step_uses_asm(num_tokens=17, num_reqs=18, **kw)


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
    reasons = rejection_reasons(facts, TABLES["gfx950"], UNFIXED)
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


@pytest.mark.parametrize(
    ("version", "num_blocks", "expected"),
    [
        (
            "0.1.16.post5",
            183104,
            "AITER 0.1.16.post5 misreads KV blocks >= 65536 (fixed in 0.1.17); "
            "this cache has 183104 blocks",
        ),
        (
            None,
            65537,
            "AITER of unknown version may misread KV blocks >= 65536 (fixed in 0.1.17); "
            "this cache has 65537 blocks",
        ),
        (
            "0.1.0",
            70000,
            "AITER 0.1.0 misreads KV blocks >= 65536 (fixed in 0.1.17; 0.1.0 is what a "
            "build without git metadata reports); this cache has 70000 blocks",
        ),
        ("0.1.16.post5", 65536, None),  # ids 0..65535 all read right
        ("0.1.20", 183104, None),
    ],
    ids=["old", "unknown", "scm-fallback", "small-pool", "fixed"],
)
def test_block_id_clause_names_version_bug_fix_and_block_count(version, num_blocks, expected):
    facts = dataclasses.replace(LLAMA, num_blocks=num_blocks)
    reasons = rejection_reasons(facts, TABLES["gfx950"], AiterBuild(version))
    assert reasons == ([expected] if expected else [])
    trusted = rejection_reasons(facts, TABLES["gfx950"], AiterBuild(version, trusted=True))
    assert trusted == []


def test_missing_kernel_file_is_named():
    reasons = rejection_reasons(LLAMA, TABLES["gfx950-no-files"], UNFIXED)
    hsa = HSA / "gfx950" / "pa"
    assert reasons == [
        f"kernel file {hsa / 'standin_bf16_fp8_gqa8_hp2.co'} not installed (listed in pa_asm.csv)"
    ]


def test_unknown_arch_says_so_instead_of_naming_an_empty_one():
    reasons = rejection_reasons(LLAMA, TABLES[""], UNFIXED)
    assert reasons == ["an unknown GPU architecture (neither vLLM nor torch names it)"]


@given(query_lens=st.lists(st.integers(0, 5), min_size=1, max_size=12))
def test_leading_decodes_is_the_whole_decode_set_or_none(query_lens):
    from vllm_rocm_asm_decode.decision import leading_decodes

    ones = [i for i, q in enumerate(query_lens) if q == 1]
    run = next((i for i, q in enumerate(query_lens) if q != 1), len(query_lens))
    expected = run if all(i < run for i in ones) else None
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    assert leading_decodes(starts) == expected


@given(
    max_query_len=st.integers(1, 4),
    num_decodes=st.one_of(st.none(), st.integers(0, 40)),
    num_heads=st.sampled_from([8, 32, 40]),
    cut=st.sampled_from([512, 608]),
    split_allowed=st.booleans(),
    capturing=st.booleans(),
)
def test_mixed_split_iff_every_condition_holds(
    max_query_len, num_decodes, num_heads, cut, split_allowed, capturing
):
    from vllm_rocm_asm_decode.decision import mixed_step_uses_asm

    expected = (
        max_query_len >= 2
        and num_decodes is not None
        and num_decodes * num_heads > cut
        and split_allowed
        and not capturing
    )
    assert (
        mixed_step_uses_asm(
            max_query_len=max_query_len,
            num_decodes=num_decodes,
            num_heads=num_heads,
            cut=cut,
            split_allowed=split_allowed,
            capturing=capturing,
        )
        is expected
    )


@given(num_decodes=st.integers(0, 600))
def test_prefill_views_start_aligned_at_or_before_the_first_prefill(num_decodes):
    from vllm_rocm_asm_decode.decision import prefill_view_start

    start = prefill_view_start(num_decodes)
    assert start <= num_decodes < start + 4
    assert (start * 4) % 16 == 0  # int32 elements: a 16-byte aligned view
