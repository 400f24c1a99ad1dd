"""The self-test probes ``doctor`` and ``check accuracy`` run on a GPU, run here through the
backend against the contract model: they pass on a sound kernel and catch a broken one."""

from __future__ import annotations

import functools
import os

import pytest
import torch

import harness
from vllm_rocm_asm_decode.tools.validation import selftest

SMALL_POOL = dict(heads=(8, 1), pool_blocks=70000)  # GQA 8, one KV head: ~0.3 GB


@pytest.fixture
def stand_in_aiter(aiter_version, kernels, short_contexts):
    """The stand-in AITER at a version, with the torch stand-ins for the other kernels."""
    return aiter_version


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_accuracy_probe_passes_on_the_contract_model(stand_in_aiter, dtype):
    stand_in_aiter("0.1.20")
    check = selftest.accuracy_probe("cpu", dtype)
    assert check.ok, check.detail
    assert check.name == f"selftest-accuracy-{str(dtype).removeprefix('torch.')}"


def test_accuracy_probe_fails_when_the_kernel_answers_wrong(stand_in_aiter, monkeypatch):
    import aiter

    stand_in_aiter("0.1.20")
    real = aiter.pa_fwd_asm

    @functools.wraps(real)
    def off_by_a_little(*args, **kwargs):
        out = real(*args, **kwargs)
        out.add_(0.05)
        return out

    monkeypatch.setattr(aiter, "pa_fwd_asm", off_by_a_little)
    check = selftest.accuracy_probe("cpu")
    assert not check.ok and "max |error| 0.05" in check.detail


def test_block_id_probe_passes_on_a_fixed_aiter(stand_in_aiter):
    stand_in_aiter("0.1.20")
    check = selftest.block_id_probe("cpu", **SMALL_POOL)
    assert check.ok, check.detail


@harness.plugin_only  # the probe reaches the kernel through the plugin's trust switch
def test_block_id_probe_catches_the_pre_0_1_17_misread(stand_in_aiter):
    """The stand-in 0.1.16.post5 reads block b as b & 0xFFFF, as AITER did: the probe runs
    the kernel (trusting it for the probe only) and names the block it read instead."""
    stand_in_aiter("0.1.16.post5")
    check = selftest.block_id_probe("cpu", **SMALL_POOL)
    assert not check.ok
    assert check.detail.startswith("block 65537 was read as block 1 (id & 0xFFFF)")
    assert "VLLM_ROCM_ASM_DECODE_TRUST_AITER unset" in check.detail
    assert "VLLM_ROCM_ASM_DECODE_TRUST_AITER" not in os.environ  # restored after the probe


def test_padding_probe_reports_finite_rows(stand_in_aiter):
    """The stand-in writes a length-0 row NaN, as the uhp kernels do: the plugin gives
    padding rows length 1, so the kernel writes them finite."""
    stand_in_aiter("0.1.20")
    check = selftest.padding_probe("cpu")
    assert check.ok and check.detail.startswith("8 padding rows written, finite; real rows")


def test_padding_probe_fails_on_padding_rows_of_length_0(stand_in_aiter, monkeypatch):
    """A plugin passing vLLM's lengths as they are (0 for a padding row): the kernel
    writes those rows NaN, and the probe fails."""
    import aiter

    stand_in_aiter("0.1.20")
    real = aiter.pa_fwd_asm

    @functools.wraps(real)
    def unclamped(**kwargs):
        lengths = kwargs["context_lens"]
        assert int(lengths.min()) == 1  # the probe's padding rows, as the plugin passes
        return real(**kwargs | {"context_lens": torch.where(lengths == 1, 0, lengths)})

    monkeypatch.setattr(aiter, "pa_fwd_asm", unclamped)
    check = selftest.padding_probe("cpu")
    assert not check.ok and check.detail.startswith("8 of 8 padding rows written NOT finite")


def test_padding_rows_left_as_they_were_pass(stand_in_aiter, monkeypatch):
    import aiter

    stand_in_aiter("0.1.20")
    real = aiter.pa_fwd_asm

    @functools.wraps(real)
    def leaves_padding(**kwargs):
        padding = kwargs["context_lens"] == 1
        kept = kwargs["out_"][padding].clone()
        out = real(**kwargs)
        out[padding] = kept
        return out

    monkeypatch.setattr(aiter, "pa_fwd_asm", leaves_padding)
    check = selftest.padding_probe("cpu")
    assert check.ok and check.detail.startswith("8 padding rows left as they were;"), check.detail


def test_padding_probe_fails_on_a_real_row_left_unwritten(stand_in_aiter, monkeypatch):
    """A kernel that skips the last real sequence (as one reading the batch one short
    would): the NaN fill stays in its row."""
    import aiter

    stand_in_aiter("0.1.20")
    real = aiter.pa_fwd_asm

    @functools.wraps(real)
    def one_short(*args, **kwargs):
        lengths = kwargs["context_lens"]
        last = int((lengths > 1).nonzero().max())  # padding rows: length 1
        kept = kwargs["out_"][last].clone()
        out = real(*args, **kwargs)
        out[last] = kept
        return out

    monkeypatch.setattr(aiter, "pa_fwd_asm", one_short)
    check = selftest.padding_probe("cpu")
    assert not check.ok and "1 of " in check.detail and "real rows not written" in check.detail


def test_the_default_probe_reaches_past_4_gib_and_names_both_misreadings():
    """The GPU probe's blocks (arithmetic only, nothing allocated): 16 KiB fp8 pages of 8
    KV heads, a pool past 4 GiB, each high block beside what each misreading reads."""
    heads = (40, 8)
    pool = selftest.probe_pool_blocks(heads)
    assert pool * 16384 > 2**32 and pool == 2**32 // 16384 + 2
    probes = selftest._probe_blocks(pool, 16384)
    assert probes == {
        65537: [(1, "id & 0xFFFF")],
        67000: [(1464, "id & 0xFFFF")],
        131077: [(5, "id & 0xFFFF")],  # page past 2 GiB
        262145: [(1, "id & 0xFFFF, or byte offset mod 4 GiB")],  # page past 4 GiB
    }
    # At 64 KiB pages (32 KV heads) the 2 GiB boundary comes first, at block 32768.
    wide = selftest._probe_blocks(70000, 65536)
    assert min(wide) == 32773 and wide[65537] == [(1, "id & 0xFFFF, or byte offset mod 4 GiB")]


@pytest.fixture
def graph_like_replay(monkeypatch):
    """What a CUDA graph replays, on the CPU: the kernel calls of the captured step again,
    with the same tensors, and no Python of the backend in between."""
    import aiter

    def capture(run, out):
        harness.reset_asm_calls()
        run()
        calls = list(harness.asm_calls())
        assert calls, "the captured step ran no asm kernel"

        def replay():
            for call in calls:
                aiter.pa_fwd_asm(**call)

        return replay

    monkeypatch.setattr(selftest, "_replayable", capture)


def test_scale_table_probe_passes_and_sees_the_reload(stand_in_aiter, graph_like_replay):
    stand_in_aiter("0.1.20")
    check = selftest.scale_table_probe("cpu")
    assert check.ok, check.detail
    # On the CPU the tables are allocated (no virtual memory): the probe says which.
    assert "own K/V tables (allocated in full, 4 tables)" in check.detail
    assert "after a reload, the step read the refilled tables" in check.detail


def test_scale_table_probe_fails_when_a_reload_is_not_followed(
    stand_in_aiter, graph_like_replay, monkeypatch
):
    """Tables that kept the old scale after a reload make the replayed step answer wrong,
    and the probe sees it (what FULL CUDA graphs did before tables were refilled)."""
    from vllm_rocm_asm_decode.asm_scale_tables import AsmScaleTables

    stand_in_aiter("0.1.20")
    monkeypatch.setattr(AsmScaleTables, "follow_reload", lambda self: [])
    check = selftest.scale_table_probe("cpu")
    assert not check.ok and "after a reload" in check.detail, check.detail
