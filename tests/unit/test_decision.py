"""The rule, as a property: asm runs if and only if every condition of the SPEC holds.

Layers are vLLM's real ``RocmAttentionImpl`` over KV caches laid out as vLLM binds them
(meta tensors: shapes and strides only). The oracle below restates the SPEC's conditions
independently of the code under test."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from vllm_rocm_asm_decode.aiter_version import AiterBuild
from vllm_rocm_asm_decode.core import asm_decode, asm_decode_rejections, use_asm_decode
from vllm_rocm_asm_decode.eligibility import FP16_UNPROVEN, call_uses_asm, rejection_reasons
from vllm_rocm_asm_decode.kernel_table import fallback_table, load_table
from vllm_rocm_asm_decode.mixed import leading_decodes, split_asm_decode
from vllm_rocm_asm_decode.skew import ASM_SKEW_RATIO, asm_decode_skewed
from vllm_rocm_asm_decode.tools.contract_model import original_time_model

HSA = Path(__file__).resolve().parents[1] / "standins" / "kernels" / "aiter" / "hsa"
#: The skew clause of the time model fitted to the original kernel table (the SPEC's).
FITTED_SKEW = round(original_time_model().skew_ratio)
FITTED_SLACK = round(original_time_model().skew_head_tokens, -2)
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
    128**-0.5 * (1 + 1e-4),  # just off: a tolerance of 1e-2 would take it
    0.0625,
    1.0,
    64**-0.5,
]


@dataclasses.dataclass(frozen=True)
class Layer:
    """What a layer is made of, as vLLM builds it."""

    kv_cache_dtype: str = "fp8"
    block_size: int = 16
    head_size: int = 128
    num_heads: int = 40
    num_kv_heads: int = 8
    query_dtype: torch.dtype = torch.bfloat16
    scale: float = 128**-0.5
    sliding_window: bool = False
    alibi: bool = False
    logits_soft_cap: float = 0.0
    sinks: bool = False
    decoder: bool = True
    dense_pages: bool = True
    num_blocks: int = 64
    max_model_len: int = 40960

    def build(self):
        """vLLM's impl, its bound KV cache view (LHBNC: K and V groups spanning every
        block; LBHNC: K and V pages alternating), and what the rule reads of the model."""
        from vllm.v1.attention.backend import AttentionType
        from vllm.v1.attention.backends.rocm_attn import RocmAttentionImpl

        impl = RocmAttentionImpl(
            self.num_heads,
            self.head_size,
            self.scale,
            self.num_kv_heads,
            [0.5] * self.num_heads if self.alibi else None,
            128 if self.sliding_window else None,
            self.kv_cache_dtype,
            self.logits_soft_cap or None,
            AttentionType.DECODER if self.decoder else AttentionType.ENCODER_DECODER,
            sinks=torch.zeros(self.num_heads) if self.sinks else None,
        )
        dtype = torch.uint8 if self.kv_cache_dtype.startswith("fp8") else torch.bfloat16
        width = self.num_kv_heads * self.head_size
        shape = (self.num_blocks, self.block_size, width)
        if self.dense_pages:
            kv_cache = torch.empty(2, *shape, dtype=dtype, device="meta").transpose(0, 1)
        else:
            kv_cache = torch.empty(shape[0], 2, *shape[1:], dtype=dtype, device="meta")
        model = SimpleNamespace(dtype=self.query_dtype, max_model_len=self.max_model_len)
        return impl, kv_cache, model

    def reasons(self, arch: str = "gfx950", aiter: AiterBuild | None = None) -> list[str]:
        impl, kv_cache, model = self.build()
        return rejection_reasons(impl, kv_cache, model, TABLES[arch], aiter or UNFIXED)


UNFIXED = AiterBuild("0.1.16.post5")

layers = st.builds(
    Layer,
    kv_cache_dtype=st.sampled_from(["fp8", "fp8_e4m3", "fp8_e5m2", "auto"]),
    block_size=st.sampled_from([16, 32, 64]),
    head_size=st.sampled_from([64, 128, 256]),
    num_heads=st.sampled_from([8, 16, 32, 40, 64, 80]),
    num_kv_heads=st.sampled_from([1, 2, 4, 5, 8, 16]),
    query_dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    scale=st.sampled_from(SCALES),
    sliding_window=st.booleans(),
    alibi=st.booleans(),
    logits_soft_cap=st.sampled_from([0.0, 30.0]),
    sinks=st.booleans(),
    decoder=st.booleans(),
    dense_pages=st.booleans(),
    num_blocks=st.sampled_from([4, 65536, 65537, 183104]),
    max_model_len=st.sampled_from([4096, 40960, 40961, 131072]),
)
aiters = st.builds(AiterBuild, version=st.sampled_from(list(AITER_VERSIONS)), trusted=st.booleans())


def oracle_layer_ok(f: Layer, arch: str, aiter: AiterBuild) -> bool:
    gqa = f.num_heads // f.num_kv_heads
    return (
        f.kv_cache_dtype in ("fp8", "fp8_e4m3")
        and f.block_size == 16
        and f.head_size == 128
        # fp16 queries wait for doctor's probe (AITER tests the uhp kernel on bf16 only).
        and (f.query_dtype == torch.bfloat16 or (f.query_dtype == torch.float16 and aiter.trusted))
        and 1 <= gqa <= 8
        and arch in ("gfx942", "gfx950")  # with the kernel files installed
        and abs(f.scale - 1 / math.sqrt(128)) < 1e-6 * 0.0884
        and not (f.sliding_window or f.alibi or f.logits_soft_cap or f.sinks)
        and f.decoder
        and f.dense_pages
        and (f.num_blocks <= 65536 or aiter.trusted or AITER_VERSIONS[aiter.version])
        # The longest the original change served; past it asm's cost is untimed.
        and f.max_model_len <= 40960
    )


@settings(max_examples=400, deadline=None)
@given(
    layer=layers,
    arch=st.sampled_from(sorted(TABLES)),
    aiter=aiters,
    max_query_len=st.integers(1, 4),
    num_tokens=st.integers(1, 600),
    padding_reqs=st.integers(0, 2),
    cut=st.sampled_from([512, 608, 1000]),
    output_quant=st.booleans(),
    call_query_fp8=st.booleans(),
    long=st.integers(1, 131072),
    short=st.integers(1, 4096),
    host_lengths=st.booleans(),
)
def test_asm_iff_every_condition_holds(
    layer,
    arch,
    aiter,
    max_query_len,
    num_tokens,
    padding_reqs,
    cut,
    output_quant,
    call_query_fp8,
    long,
    short,
    host_lengths,
):
    assume(layer.num_heads % layer.num_kv_heads == 0)  # vLLM serves no other model
    num_reqs = num_tokens + padding_reqs if max_query_len == 1 else max(1, num_tokens // 2)
    layer_ok = not layer.reasons(arch, aiter)
    contexts = [long] + [short] * (num_reqs - 1)
    step = SimpleNamespace(
        max_query_len=max_query_len,
        num_reqs=num_reqs,
        num_actual_tokens=num_tokens,
        max_seq_len=max(contexts),
        seq_lens_cpu_upper_bound=torch.tensor(contexts) if host_lengths else None,
    )
    # Without host lengths the batch counts as uniform at its longest.
    work = sum(contexts) if host_lengths else max(contexts) * num_reqs
    chosen = call_uses_asm(
        step_asm=use_asm_decode(step, layer.num_heads, cut)
        and not asm_decode_skewed(step, num_reqs, layer.num_kv_heads, ASM_SKEW_RATIO),
        layer_eligible=layer_ok,
        output_quant_requested=output_quant,
        tensors_ok=not call_query_fp8,
    )
    expected = (
        oracle_layer_ok(layer, arch, aiter)
        and max_query_len == 1
        and num_reqs == num_tokens
        and num_tokens * layer.num_heads > cut
        # The SPEC's time model: one workgroup walks the longest context.
        and max(contexts) * FITTED_SKEW <= work * layer.num_kv_heads + FITTED_SLACK
        and not output_quant
        and not call_query_fp8
    )
    assert chosen == expected
    assert layer_ok == oracle_layer_ok(layer, arch, aiter)


@given(layer=layers)
def test_every_rejection_names_its_reason(layer):
    assume(layer.num_heads % layer.num_kv_heads == 0)
    reasons = layer.reasons()
    assert all(isinstance(r, str) and r for r in reasons)
    if not layer.decoder:
        assert reasons == ["not decoder self-attention"]
        return
    for wrong, part in (
        (layer.kv_cache_dtype == "fp8_e5m2", "fp8_e5m2"),
        (layer.sinks, "sinks"),
        (layer.alibi, "ALiBi"),
        (not layer.dense_pages, "not dense"),
    ):
        assert not wrong or any(part in r for r in reasons), (part, reasons)
    # fp16 waits for doctor's probe whatever else a layer lacks (UNFIXED is not trusted):
    # fixing the rule's reasons must not reveal it only then.
    assert (FP16_UNPROVEN in reasons) == (layer.query_dtype == torch.float16)
    # The guards (AITER's block-id clause among them) speak only where the core admits:
    # then a cache past 65536 blocks on an AITER without the fix is named.
    impl, kv_cache, model = layer.build()
    if not asm_decode_rejections(impl, kv_cache, model, True) and layer.num_blocks > 65536:
        assert any(f"this cache has {layer.num_blocks} blocks" in r for r in reasons), reasons


def test_llama_and_qwen3_scales_pass_but_gemma_and_a_near_miss_do_not():
    assert 128**-0.5 != 1 / math.sqrt(128)  # the last-bit difference the rule tolerates
    assert Layer().reasons() == []
    assert Layer(scale=1 / math.sqrt(128)).reasons() == []
    assert Layer(scale=256**-0.5).reasons() == ["softmax scale 0.0625 != 1/sqrt(128)"]
    # One part in 10^4 off: the kernel's hardcoded scale would be wrong by as much.
    (near,) = Layer(scale=128**-0.5 * (1 + 1e-4)).reasons()
    assert near.startswith("softmax scale 0.0883")


def test_step_cut_is_strictly_above():
    def step(num_tokens, num_reqs, max_query_len=1):
        common = SimpleNamespace(
            max_query_len=max_query_len,
            num_reqs=num_reqs,
            num_actual_tokens=num_tokens,
            max_seq_len=1024,
            seq_lens_cpu_upper_bound=torch.full((num_reqs,), 1024),
        )
        return use_asm_decode(common, 32, 512)

    assert not step(16, 16)  # 512 is not above 512
    assert step(17, 17)
    assert not step(34, 17, max_query_len=2)  # not a pure decode
    assert not step(17, 17, max_query_len=2)  # a 2-token request beside an empty row
    # More requests than rows: Model Runner V2's trailing all-padding microbatch and a
    # drafter descriptor downgraded to eager build such steps; never asm.
    assert not step(17, 18)


def test_the_skew_clause_counts_kv_heads_and_only_the_requests_it_is_asked_about():
    def common(lens):
        return SimpleNamespace(max_seq_len=max(lens), seq_lens_cpu_upper_bound=torch.tensor(lens))

    one_long = [8192] + [1024] * 127  # contexts sum to 138,240; 67 x 8192 = 548,864
    assert asm_decode_skewed(common(one_long), 128, 1, 67)  # 138,240 + 19,500 below it
    assert not asm_decode_skewed(common(one_long), 128, 8, 67)  # x 8 KV heads above it
    # A mixed step's leading decodes: a long prefill behind them is not theirs.
    with_prefill = [1024] * 128 + [131072]
    assert not asm_decode_skewed(common(with_prefill), 128, 8, 67)
    assert asm_decode_skewed(common(with_prefill), 129, 8, 67)


def test_every_failed_clause_is_reported_not_just_the_first():
    layer = Layer(
        kv_cache_dtype="fp8_e5m2",
        block_size=32,
        num_heads=64,
        num_kv_heads=4,
        query_dtype=torch.float32,
        scale=0.0625,
        sliding_window=True,
        dense_pages=False,
    )
    reasons = layer.reasons()
    for part in (
        "fp8_e5m2",
        "torch.float32 query",
        "block size 32",
        "GQA 16",
        "softmax scale 0.0625",
        "sliding window",
        "not dense",
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
    layer = Layer(num_heads=32, num_blocks=num_blocks)
    assert layer.reasons(aiter=AiterBuild(version)) == ([expected] if expected else [])
    assert layer.reasons(aiter=AiterBuild(version, trusted=True)) == []


def test_missing_kernel_file_is_named():
    hsa = HSA / "gfx950" / "pa"
    assert Layer(num_heads=32).reasons("gfx950-no-files") == [
        f"kernel file {hsa / 'standin_bf16_fp8_gqa8_hp2.co'} not installed (listed in pa_asm.csv)"
    ]


def test_unknown_and_other_archs_are_named():
    assert Layer().reasons("") == ["a GPU other than gfx942/gfx950 (unknown)"]
    assert Layer().reasons("gfx1250") == ["a GPU other than gfx942/gfx950 (gfx1250)"]


@pytest.mark.parametrize(
    ("layer", "on_mi3xx", "ok"),
    [
        (Layer(num_kv_heads=8), True, True),
        (Layer(num_kv_heads=5), True, True),
        (Layer(num_heads=72, num_kv_heads=8), True, False),  # GQA 9: no uhp kernel
        (Layer(num_kv_heads=4), True, False),  # GQA 10
        (Layer(num_kv_heads=8), False, False),
        (Layer(head_size=256, num_heads=16, num_kv_heads=8), True, False),  # 1/sqrt(128)
    ],
    ids=["gqa-5", "gqa-8", "gqa-9", "gqa-10", "other-gpu", "head-256"],
)
def test_core_rule_alone_takes_gqa_up_to_8_and_head_size_128(layer, on_mi3xx, ok):
    """Without the plugin's guards (the in-tree rule): the constants decide."""
    impl, kv_cache, model = layer.build()
    assert (asm_decode_rejections(impl, kv_cache, model, on_mi3xx) == []) is ok


def test_the_call_passes_the_block_tables_row_stride():
    """A block table that is a column slice of a wider one (row stride above its width):
    the kernel is told the real row stride, not the width."""
    from vllm_rocm_asm_decode import aiter_ops

    seen = {}
    wide = torch.zeros(4, 32, dtype=torch.int32)
    table = wide[:, :8]
    assert table.stride(0) == 32 != table.shape[1]

    class Recorder:
        @staticmethod
        def pa_fwd_asm(**kwargs):
            seen.update(kwargs)

    values = torch.zeros(2, 8, 128, 16)
    scales = (torch.ones(1), torch.full((1,), 2.0))
    with pytest.MonkeyPatch.context() as mp:
        from vllm_rocm_asm_decode import core

        mp.setattr(core, "rocm_aiter_ops", Recorder)
        out = torch.empty(4, 40, 128)
        asm_decode(torch.zeros(4, 40, 128), "K", values, table, "lens", scales, out)
    assert seen["block_tables_stride0"] == 32 and seen["block_tables"] is table
    assert seen["V"].shape == (2, 8, 1, 128, 16) and seen["high_precision"] == 2
    assert seen["K_QScale"] is scales[0] and seen["V_QScale"] is scales[1]
    assert seen["out_"] is out
    assert aiter_ops.rocm_aiter_ops is not None


@given(query_lens=st.lists(st.integers(0, 5), min_size=1, max_size=12))
def test_leading_decodes_is_the_whole_decode_set_or_none(query_lens):
    ones = [i for i, q in enumerate(query_lens) if q == 1]
    run = next((i for i, q in enumerate(query_lens) if q != 1), len(query_lens))
    expected = run if all(i < run for i in ones) else None
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    assert leading_decodes(np.array(starts)) == expected


#: What ``asm_split_off`` reads of a VllmConfig that lets mixed steps split.
SPLITTABLE = SimpleNamespace(
    compilation_config=SimpleNamespace(
        cudagraph_mode=SimpleNamespace(mixed_mode=lambda: "PIECEWISE")
    ),
    speculative_config=None,
)


def mixed_step(query_lens: list[int]) -> SimpleNamespace:
    starts = torch.tensor([0, *np.cumsum(query_lens)], dtype=torch.int32)
    n = len(query_lens)
    return SimpleNamespace(
        num_reqs=n,
        max_query_len=max(query_lens),
        query_start_loc_cpu=starts,
        query_start_loc=starts.clone(),
        seq_lens=torch.arange(n, dtype=torch.int32) + 50,
        seq_lens_cpu_upper_bound=torch.arange(n, dtype=torch.int32) + 50,
        max_seq_len=n + 49,
        block_table_tensor=torch.zeros(n, 8, dtype=torch.int32),
    )


@given(
    num_decodes=st.integers(0, 40),
    prefills=st.lists(st.integers(2, 9), min_size=0, max_size=3),
    trailing_decode=st.booleans(),
    num_heads=st.sampled_from([8, 32, 40]),
    cut=st.sampled_from([512, 608]),
)
def test_mixed_split_iff_every_condition_holds(
    num_decodes, prefills, trailing_decode, num_heads, cut
):
    query_lens = [1] * num_decodes + prefills + ([1] if trailing_decode and prefills else [])
    assume(query_lens)
    split = split_asm_decode(mixed_step(query_lens), SPLITTABLE, num_heads, cut)
    expected = (
        bool(prefills)  # a prefill row in the step
        and not trailing_decode  # every decode leads
        and num_decodes * num_heads > cut
    )
    assert (split is not None) is expected
    if split is not None:
        assert split.num_decodes == num_decodes
        start = len(query_lens) - split.prefill_seq_lens.shape[0]
        assert start <= num_decodes < start + 4  # the prefill views start aligned...
        assert (start * 4) % 16 == 0  # ...at a 16-byte boundary of int32 elements
        assert split.decode_block_table.shape[0] == num_decodes


def test_the_signature_check_asks_for_the_keywords_the_call_passes():
    """The plugin's guard on AITER's signature and the core's call name the same
    keywords (the call is written once, in core; the guard reads it from there)."""
    import ast
    import inspect

    from vllm_rocm_asm_decode import core
    from vllm_rocm_asm_decode.kernel import REQUIRED_PARAMETERS

    call = next(
        n
        for n in ast.walk(ast.parse(inspect.getsource(core.asm_decode)))
        if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("pa_fwd_asm")
    )
    assert sorted(k.arg for k in call.keywords) == sorted(REQUIRED_PARAMETERS)
