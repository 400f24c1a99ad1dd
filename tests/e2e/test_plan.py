"""``plan``: answers from the backend's own rule, read through vLLM's ModelConfig."""

from __future__ import annotations

import json

import pytest
import torch

import background
import harness
from conftest import ARCH
from vllm_rocm_asm_decode.tools.cli import main
from vllm_rocm_asm_decode.tools.plan import PlanError, make_plan

SESSION_GPU = {"gfx950": "mi355x", "gfx942": "mi300x"}[ARCH]


def assert_one_line_exit_2(argv, message, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def asm_sizes(plan):
    return [b["num_seqs"] for b in plan.batches if b["kernel"] == "asm"]


@pytest.mark.parametrize(("gpu", "cut"), [("mi355x", 512), ("mi300x", 608), ("mi325x", 608)])
def test_cut_follows_the_gpu(gpu, cut):
    assert make_plan(gpu=gpu).cut_query_heads == cut


def test_qwen3_14b_tp1_runs_asm_from_16_sequences():
    plan = make_plan(model="qwen3-14b-fp8", gpu="mi355x")
    assert plan.eligible and plan.eligible_layers == plan.num_layers == 40
    assert (plan.num_heads_per_rank, plan.num_kv_heads_per_rank) == (40, 8)
    assert min(asm_sizes(plan)) == 16  # 16 x 40 = 640 > 512; 8 x 40 = 320 is not
    assert plan.reasons == []


def test_llama_runs_asm_from_24_sequences_because_512_is_not_above_512():
    plan = make_plan(model="llama-3.1-8b-instruct", gpu="mi355x", max_model_len=40960)
    assert min(asm_sizes(plan)) == 24
    assert {b["num_seqs"]: b["kernel"] for b in plan.batches}[16] == "hip"
    assert plan.max_model_len == 40960 and plan.eligible
    assert any("not validated" in n for n in plan.notes)


def test_a_max_model_len_past_the_validated_40960_keeps_hip():
    """Llama-3.1's own 131072: asm splits no context, and the original change served
    40960."""
    plan = make_plan(model="llama-3.1-8b-instruct", gpu="mi355x")
    assert plan.max_model_len == 131072 and not plan.eligible
    assert plan.reasons == ["max_model_len 131072 > 40960"]
    assert any("with --max-model-len 40960 or less" in n for n in plan.notes)


def test_max_model_len_and_an_old_aiter_are_both_named_and_no_note_says_only_one():
    """(trial 16) Lowering max_model_len would not be enough: AITER of unknown version
    misreads a cache of 200000 blocks, so the layers' line names both and no note says
    that max_model_len alone keeps HIP."""
    plan = make_plan(
        model="llama-3.1-8b-instruct", gpu="mi300x", tensor_parallel_size=2,
        aiter_version=None, num_gpu_blocks=200000,
    )  # fmt: skip
    assert not plan.eligible and len(plan.reasons) == 2
    assert "max_model_len 131072 > 40960" in plan.reasons
    assert any("misread KV blocks >= 65536" in r for r in plan.reasons)
    assert not any("40960 or less" in n for n in plan.notes)
    fp16 = make_plan(
        model="llama-3.1-8b-instruct", gpu="mi300x", tensor_parallel_size=2,
        aiter_version=None, num_gpu_blocks=200000, dtype="float16",
    )  # fmt: skip
    assert any("misread KV blocks >= 65536" in r for r in fp16.reasons)  # fp16's beside


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e5m2"])
def test_a_kv_cache_the_kernel_cannot_read_says_which_one_it_reads(kv_cache_dtype):
    """(trial 12) The plan says how to get asm, not only that every layer keeps HIP."""
    plan = make_plan(model="qwen3-8b", gpu="mi355x", kv_cache_dtype=kv_cache_dtype)
    assert not plan.eligible and plan.reasons == [f"{kv_cache_dtype} KV cache"]
    assert f"--kv-cache-dtype {kv_cache_dtype} keeps every layer on HIP" in plan.notes[-1]
    assert plan.notes[-1].endswith("reads an fp8 e4m3 cache (--kv-cache-dtype fp8)")
    fp8 = make_plan(model="qwen3-8b", gpu="mi355x", kv_cache_dtype="fp8")
    assert fp8.eligible and not any("--kv-cache-dtype" in n for n in fp8.notes)


def test_tp2_halves_the_heads_and_moves_the_crossover():
    tp1 = make_plan(model="qwen3-8b", gpu="mi355x")
    tp2 = make_plan(model="qwen3-8b", gpu="mi355x", tensor_parallel_size=2)
    assert (tp2.num_heads_per_rank, tp2.num_kv_heads_per_rank) == (16, 4)
    assert tp1.num_heads_per_rank == 2 * tp2.num_heads_per_rank
    assert min(asm_sizes(tp1)) == 24 and min(asm_sizes(tp2)) == 40  # 32 x 16 = 512


def test_batches_cover_vllms_capture_sizes_up_to_512():
    sizes = [b["num_seqs"] for b in make_plan().batches]
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 512 and 256 in sizes and 264 not in sizes


@pytest.mark.parametrize("label", ["unquantized", "fp8-at-1.0", "per-layer"])
def test_scale_table_share_is_what_the_backend_allocates(tmp_path, label):
    """plan's figures against the bytes the real backend allocates (on the CPU: in full)
    for a model of the same shape (40 layers, 40/8 heads): a bf16 checkpoint (one K and
    one V table for all), an fp8 one without KV scales (its layers load scales, so each
    gets tables of its own at 1.0), and per-layer calibrated scales."""
    from vllm_rocm_asm_decode.tools.choices import PRESETS_DIR

    per_layer = [(0.5 + i / 128, 0.25 + i / 128) for i in range(40)]
    model = harness.build_model(tmp_path / "built", num_layers=40, num_blocks=40)
    if label != "unquantized":
        scales = per_layer if label == "per-layer" else [(1.0, 1.0)] * 40
        for layer, (k, v) in zip(model.layers.values(), scales, strict=True):
            harness.load_checkpoint_scales(layer, k, v)
    model.builder.build(0, harness.make_batch(model, [20] * 16).common)
    tables = [t.tensor for t in model.builder.asm_bindings.tables.tables()]
    allocated = sum(t.numel() * t.element_size() for t in tables)
    kv = sum(layer.kv_cache.numel() for layer in model.layers.values())  # fp8: 1 byte
    if label == "per-layer":
        plan = make_plan(model=write_checkpoint(tmp_path / "ckpt", per_layer, layers=40))
    else:  # the qwen3-14b-fp8 preset (40 layers, 40/8 heads), with its fp8 config or not
        config = json.loads((PRESETS_DIR / "qwen3-14b-fp8" / "config.json").read_text())
        if label == "unquantized":
            del config["quantization_config"]
        (tmp_path / "preset").mkdir()
        (tmp_path / "preset" / "config.json").write_text(json.dumps(config))
        plan = make_plan(model=str(tmp_path / "preset"), gpu="mi355x")
    assert len(tables) == {"unquantized": 2, "fp8-at-1.0": 80, "per-layer": 80}[label]
    assert plan.scale_tables == len(tables)
    assert plan.scale_table_fraction == pytest.approx(allocated / kv)
    assert plan.scale_table_aliased_bytes == len(tables) * 2 * 1024**2


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        (dict(kv_cache_dtype="fp8_e5m2"), "fp8_e5m2 KV cache"),
        (dict(kv_cache_dtype="auto"), "auto KV cache"),
        (dict(block_size=32), "block size 32"),
        (dict(dtype="float32"), "torch.float32 query"),
    ],
    ids=["e5m2", "bf16-cache", "block32", "fp32"],
)
def test_ineligible_configs_print_their_reasons(kwargs, reason, capsys):
    plan = make_plan(model="qwen3-8b", gpu="mi355x", **kwargs)  # fp8 weights refuse fp32
    assert not plan.eligible and any(reason in r for r in plan.reasons)
    assert all(b["kernel"] == "hip" for b in plan.batches)
    args = ["plan", "--model", "qwen3-8b", "--gpu", "mi355x"]
    for k, v in kwargs.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "no layer is eligible" in out and reason in out


def write_config(tmp_path, **overrides):
    harness.write_model_dir(tmp_path, num_heads=32, num_kv_heads=8, num_layers=6, extra=overrides)
    return str(tmp_path)


def test_mixed_sliding_window_model_reports_layer_groups(tmp_path, capsys):
    model = write_config(
        tmp_path,
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        sliding_window=4096,
        use_sliding_window=True,
        max_window_layers=6,
        layer_types=["sliding_attention", "full_attention"] * 3,
    )
    plan = make_plan(model=model, gpu="mi355x")
    groups = {tuple(g.layers): (g.eligible, g.reasons) for g in plan.layer_groups}
    assert groups[(1, 3, 5)] == (True, [])
    assert groups[(0, 2, 4)][0] is False and "sliding window" in groups[(0, 2, 4)][1][0]
    assert plan.eligible and plan.eligible_layers == 3
    assert main(["plan", "--model", model, "--gpu", "mi355x"]) == 0
    out = capsys.readouterr().out
    assert "layers 0, 2, 4: HIP: sliding window" in out and "layers 1, 3, 5: asm" in out


def test_qwen3_with_sliding_window_turned_off_is_eligible(tmp_path):
    model = write_config(
        tmp_path,
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        sliding_window=4096,
        use_sliding_window=False,
    )
    assert make_plan(model=model, gpu="mi355x").eligible_layers == 6


def test_gemma_style_query_scaling_is_refused(tmp_path):
    model = write_config(tmp_path, query_pre_attn_scalar=256)
    plan = make_plan(model=model, gpu="mi355x")
    assert not plan.eligible and plan.reasons == ["softmax scale 0.0625 != 1/sqrt(128)"]


@pytest.mark.parametrize(
    ("model", "heads", "kvh"), [("qwen3-14b-fp8", 40, 8), ("llama-3.1-8b-instruct", 32, 8)]
)
def test_plan_equals_the_backends_own_decision(tmp_path, model, heads, kvh):
    """One test drives both: the plan, and the real builder on a model of the same shape."""
    plan = make_plan(model=model, gpu=SESSION_GPU, max_model_len=40960)
    backend = harness.build_model(
        tmp_path, num_layers=1, num_heads=heads, num_kv_heads=kvh, num_blocks=600
    )
    kernels = {b["num_seqs"]: b["kernel"] for b in plan.batches}
    for n in [1, 8, 16, 24, 32, 64, 128]:
        metadata = backend.builder.build(0, harness.make_batch(backend, [5] * n).common)
        assert ("asm" if metadata.use_asm_decode else "hip") == kernels[n], n


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "/no/such/dir"], "does not exist"),
        (["--model", "/tmp"], "cannot read /tmp/config.json"),
        (["--model", "no-such-preset"], "unknown model preset"),
        (["--gpu", "h100"], "unknown GPU 'h100'"),
        (["--tensor-parallel-size", "3"], "does not divide the 40 attention heads"),
        (["--kv-cache-dtype", "int4"], "argument --kv-cache-dtype: 'int4' is not one of"),
        (["--dtype", "fp64"], "argument --dtype: 'fp64' is not one of"),
        (["--block-size", "0"], "argument --block-size: 0 must be at least 1"),
        (["--max-model-len", "9" * 20], f"{'9' * 20} is more than 2147483647 tokens"),
        (
            ["--max-model-len", "50000"],
            "--max-model-len 50000 is more than preset qwen3-14b-fp8's context length, "
            "40960 (max_position_embeddings in its config.json, as vLLM derives it); give "
            "--max-model-len 40960 or less",
        ),
    ],
    ids=[
        "missing-dir",
        "dir-without-config",
        "unknown-preset",
        "unknown-gpu",
        "tp-not-dividing",
        "kv-dtype",
        "dtype",
        "block-size",
        "max-model-len-absurd",
        "max-model-len-above-the-models",
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    assert_one_line_exit_2(["plan", *args], message, capsys)


def test_config_without_attention_fields(tmp_path, capsys):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    )
    assert main(["plan", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no attention fields" in err[0] and str(tmp_path) in err[0]


background.declare(
    "plan-plain",
    __file__,
    ["test_console_script_on_a_machine_without_rocm"],
    lambda env: harness.run_console("plan", "--json", env=env),
    seconds=12,
    slow=True,  # a whole command in a fresh process
)


@pytest.mark.slow
def test_console_script_on_a_machine_without_rocm():
    """Installed command, plain environment (no stand-ins): default preset on MI355X."""
    proc = background.result("plan-plain")
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads(proc.stdout)
    assert plan["gpu"] == "MI355X" and plan["cut_query_heads"] == 512 and plan["eligible"]
    assert {
        "gpu",
        "compute_units",
        "cut_query_heads",
        "num_heads_per_rank",
        "num_kv_heads_per_rank",
        "eligible",
        "reasons",
        "batches",
        "scale_table_fraction",
    } <= set(plan)


# --------------------------------------------------------------------------------------
# AITER version, block count, checkpoint scales

OLD_AITER_REASON = (
    "AITER 0.1.16.post5 misreads KV blocks >= 65536 (fixed in 0.1.17); this cache has 183104 blocks"
)


@pytest.mark.parametrize(
    ("version", "blocks", "eligible"),
    [
        ("0.1.16.post5", 183104, False),
        ("unknown", 183104, False),
        ("0.1.20", 183104, True),
        ("0.1.16.post5", 65536, True),
        ("0.1.16.post5", None, True),
    ],
    ids=["old-large", "unknown-large", "fixed-large", "old-at-limit", "old-no-count"],
)
def test_aiter_version_and_block_count_decide_the_block_id_clause(
    version, blocks, eligible, monkeypatch, capsys
):
    monkeypatch.delenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", raising=False)
    args = ["plan", "--gpu", "mi355x", "--aiter-version", version, "--json"]
    if blocks is not None:
        args += ["--num-gpu-blocks", str(blocks)]
    assert main(args) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["eligible"] is eligible
    assert plan["aiter_version"] == (None if version == "unknown" else version)
    assert plan["block_id_fix"] == {"0.1.20": True, "unknown": None}.get(version, False)
    assert plan["num_gpu_blocks"] == blocks
    if version == "0.1.16.post5" and blocks == 183104:
        assert plan["reasons"] == [OLD_AITER_REASON]
    if blocks is None:
        assert "the block count decides (--num-gpu-blocks N)" in plan["block_id_clause"]
    elif not eligible:
        assert plan["block_id_clause"].endswith(f"{blocks} blocks > 65536: every layer keeps HIP")


def test_trust_switch_applies_in_plan_as_in_vllm(monkeypatch):
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", "1")
    plan = make_plan(gpu="mi355x", aiter_version="0.1.16.post5", num_gpu_blocks=183104)
    assert plan.eligible and "trusted" in plan.block_id_clause


def write_checkpoint(path, scales, *, quantized=True, layers=6):
    """A config.json and a safetensors file with per-layer KV scales beside a weight."""
    from safetensors.torch import save_file

    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    extra = {"quantization_config": fp8} if quantized else {}
    harness.write_model_dir(path, num_heads=32, num_kv_heads=8, num_layers=layers, extra=extra)
    tensors = {"model.embed_tokens.weight": torch.zeros(16, 8)}
    for i, (k, v) in enumerate(scales):
        tensors[f"model.layers.{i}.self_attn.k_proj.output_scale"] = torch.tensor([k])
        tensors[f"model.layers.{i}.self_attn.v_proj.output_scale"] = torch.tensor([v])
    save_file(tensors, str(path / "model.safetensors"))
    return str(path)


def test_calibrated_per_layer_scales_cost_two_tables_per_layer(tmp_path):
    scales = [(0.5 + i / 64, 0.25 + i / 64) for i in range(6)]  # all 12 values distinct
    model = write_checkpoint(tmp_path, scales)
    plan = make_plan(model=model, gpu="mi355x", num_gpu_blocks=1000, max_model_len=4096)
    assert plan.kv_scales == "checkpoint" and plan.scale_tables == 12
    # Per block: 12 tables x 8 KV heads x 16 slots x 4 bytes, over 6 layers x K+V x 8 KV
    # heads x 128 dims x 16 slots x 1 byte: 4/128 of the KV cache.
    assert plan.scale_table_fraction == pytest.approx(4 / 128)
    assert plan.scale_table_bytes == 12 * 1000 * 8 * 16 * 4


def test_equal_checkpoint_scales_still_own_their_tables(tmp_path):
    """A reload may change them layer by layer: each layer's tables are its own."""
    plan = make_plan(model=write_checkpoint(tmp_path, [(0.5, 0.25)] * 6), gpu="mi355x")
    assert plan.kv_scales == "checkpoint" and plan.scale_tables == 12
    assert plan.scale_table_fraction == pytest.approx(4 / 128)
    assert plan.scale_table_aliased_bytes == 12 * 2 * 1024**2


def test_a_quantized_checkpoint_without_scales_owns_tables_an_unquantized_one_shares(tmp_path):
    """vLLM gives a quantized checkpoint's layers a KV-cache method even where the
    checkpoint holds no scales (they stay 1.0 until a reload brings some): the backend
    gives each its own K and V table, as for calibrated scales. An unquantized
    checkpoint's layers share one K and one V table."""
    none = make_plan(model=write_checkpoint(tmp_path / "a", []), gpu="mi355x")
    assert none.kv_scales == "1.0 (none in the checkpoint)" and none.scale_tables == 2 * 6
    scales = [(0.5 + i / 64, 0.25) for i in range(6)]
    unused = make_plan(model=write_checkpoint(tmp_path / "b", scales, quantized=False))
    assert unused.scale_tables == 2 and "no quantization_config" in unused.kv_scales


def test_plan_text_names_tables_scales_and_the_aiter_clause(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", raising=False)
    model = write_checkpoint(tmp_path, [(0.5 + i / 64, 0.25 + i / 64) for i in range(6)])
    args = ["plan", "--model", model, "--aiter-version", "0.1.22", "--num-gpu-blocks", "1000"]
    args += ["--max-model-len", "4096"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "aiter      AITER 0.1.22: reads every KV block right (fixed in 0.1.17)" in out
    assert "12 scale table(s): aliased, about 24 MiB of device memory" in out
    assert "3.125 % of the KV cache, 5.9 MiB at 1000 blocks" in out
    assert "; KV scales: checkpoint" in out


def test_a_kv_cache_vllm_would_not_start_with_is_refused(capsys):
    """vLLM holds the null block back and refuses to start unless the other blocks hold
    one request at max_model_len (its admission check in kv_cache_planning)."""
    assert main(["plan", "--max-model-len", "4096", "--num-gpu-blocks", "257", "--json"]) == 0
    capsys.readouterr()
    assert main(["plan", "--max-model-len", "4096", "--num-gpu-blocks", "256"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "--num-gpu-blocks 256: one request at max_model_len 4096 needs 257 blocks" in err
    )


@pytest.mark.parametrize(
    ("blocks", "says"),
    [
        (3, "--num-gpu-blocks 3: that KV cache takes 600 GiB per rank, more than the MI300X's"),
        (None, "--block-size 2621440: one block takes 200 GiB per rank, more than the MI300X's"),
    ],
    ids=["cache", "one-block"],
)
def test_plans_own_reading_refuses_a_cache_past_the_gpu(blocks, says):
    """The check after vLLM's reading (the one before it reads config.json alone): the
    cache, or without --num-gpu-blocks one block, larger than the GPU. Qwen3-14B: 40
    layers x K and V x 8 KV heads x 128 x 1 byte = 80 KiB a token; 2.5 Mi tokens a block."""
    with pytest.raises(PlanError, match=says):
        make_plan(gpu="mi300x", block_size=2_621_440, num_gpu_blocks=blocks)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--aiter-version", "banana"], {}, "argument --aiter-version: 'banana' is not a version"),
        (["--num-gpu-blocks", "0"], {}, "argument --num-gpu-blocks: 0 must be at least 1"),
        (["--num-gpu-blocks", "many"], {}, "--num-gpu-blocks: 'many' is not a whole number"),
        ([], {"VLLM_ROCM_ASM_DECODE_TRUST_AITER": "perhaps"}, "VLLM_ROCM_ASM_DECODE_TRUST"),
        ([], {"VLLM_ROCM_ASM_DECODE_CUT": "lots"}, "VLLM_ROCM_ASM_DECODE_CUT='lots'"),
    ],
    ids=["aiter-version", "blocks-zero", "blocks-word", "trust-env", "cut-env"],
)
def test_bad_new_input_is_one_line_and_exit_2(args, env, message, monkeypatch, capsys):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert_one_line_exit_2(["plan", *args], message, capsys)


def test_corrupt_checkpoint_is_one_line(tmp_path, capsys):
    write_checkpoint(tmp_path, [(0.5, 0.25)])
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    assert main(["plan", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.safetensors" in err[0]


def test_aiter_line_uses_the_page_size_limit(tmp_path, monkeypatch):
    """32 KV heads: 64 KiB fp8 pages, so an old AITER is safe only below 32768 blocks
    (pages ending by 2 GiB), and plan's line says the same as the rule."""
    monkeypatch.delenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", raising=False)
    harness.write_model_dir(tmp_path, num_heads=32, num_kv_heads=32, num_layers=2)
    plan = make_plan(model=str(tmp_path), aiter_version="0.1.16", num_gpu_blocks=40000)
    assert not plan.eligible
    assert plan.block_id_clause.endswith("40000 blocks > 32768: every layer keeps HIP")
    assert plan.reasons == [
        "AITER 0.1.16 misreads KV blocks >= 32768 (pages past 2 GiB at 65536 bytes a page) "
        "(fixed in 0.1.17); this cache has 40000 blocks"
    ]
    assert make_plan(model=str(tmp_path), aiter_version="0.1.16", num_gpu_blocks=32768).eligible


def test_config_that_is_not_an_object_is_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text("[1, 2]")
    assert main(["plan", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"vllm-rocm-asm-decode plan: error: {tmp_path}/config.json is not a JSON object"]


@pytest.mark.parametrize(("level", "code"), [("debug", 0), ("Info", 0), ("loud", 2)])
def test_logging_level_is_read_as_vllm_reads_it(level, code, monkeypatch, capsys):
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", level)
    assert main(["plan", "--gpu", "mi355x", "--json"]) == code
    if code:
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "VLLM_LOGGING_LEVEL='loud' is not a logging level" in err[0]


def test_an_mla_model_is_said_not_to_use_rocm_attn(tmp_path, capsys):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["DeepseekV2ForCausalLM"],
                "model_type": "deepseek_v2",
                "hidden_size": 1024,
                "num_attention_heads": 16,
                "num_key_value_heads": 16,
                "num_hidden_layers": 2,
                "kv_lora_rank": 512,
                "q_lora_rank": None,
                "qk_rope_head_dim": 64,
                "qk_nope_head_dim": 128,
                "v_head_dim": 128,
                "vocab_size": 1000,
                "intermediate_size": 1024,
                "moe_intermediate_size": 256,
                "max_position_embeddings": 4096,
                "torch_dtype": "bfloat16",
            }
        )
    )
    assert main(["plan", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "multi-head latent attention" in err[0] and "ROCM_ATTN" in err[0]


def test_heads_not_a_multiple_of_kv_heads_is_an_error(tmp_path, capsys):
    harness.write_model_dir(tmp_path, num_heads=40, num_kv_heads=6)
    assert main(["plan", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "num_attention_heads 40 is not a multiple of num_key" in err[0], err


def test_vllms_config_error_keeps_the_line_that_says_what_is_wrong():
    from vllm.config import ModelConfig

    from vllm_rocm_asm_decode.tools import choices, plan

    with pytest.raises(Exception) as raised:  # pydantic's ValidationError, as vLLM raises it
        ModelConfig(str(choices.PRESETS_DIR / "qwen3-8b"), max_model_len=999999)
    said = plan._what_is_wrong(raised.value)
    assert said.startswith("User-specified max_model_len (999999) is greater than"), said
    assert "validation error" not in said and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" not in said


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"VLLM_ROCM_ASM_DECODE": "0"}, "VLLM_ROCM_ASM_DECODE=0 (the asm decode is off)"),
        ({"VLLM_ROCM_USE_AITER_MHA": "0"}, "VLLM_ROCM_USE_AITER_MHA=0 (the asm decode is off)"),
        ({"VLLM_ROCM_USE_AITER": "0"}, "VLLM_ROCM_USE_AITER=0 (the asm decode is off)"),
        ({"VLLM_PLUGINS": "x"}, "VLLM_PLUGINS='x' leaves the plugin out"),
    ],
    ids=["switch", "mha", "aiter", "plugins"],
)
def test_plan_applies_the_switches_as_vllm_would(env, reason, monkeypatch):
    for key in ("VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MHA", "VLLM_PLUGINS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plan = make_plan(gpu="mi355x")
    assert not plan.eligible and plan.reasons == [reason]
    assert all(b["kernel"] == "hip" for b in plan.batches)


def test_vllms_dtype_aliases_are_accepted(capsys):
    assert main(["plan", "--gpu", "mi355x", "--dtype", "half", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == "float16"


#: Configs of real model families (their field names and attention values; sizes cut
#: down), with what vLLM's model classes do with them: Gemma 2 scales queries by
#: query_pre_attn_scalar ** -0.5 and soft-caps logits, Granite scales by
#: attention_multiplier, Bloom uses ALiBi.
FAMILIES = {
    "gemma-2-27b": (
        {
            "architectures": ["Gemma2ForCausalLM"],
            "model_type": "gemma2",
            "hidden_size": 4608,
            "head_dim": 128,
            "num_attention_heads": 32,
            "num_key_value_heads": 16,
            "query_pre_attn_scalar": 144,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "sliding_window": 4096,
        },
        [
            "logits soft cap",
            "sliding window",
            "softmax scale 0.0833333 != 1/sqrt(128)",
        ],
    ),
    "granite-3-8b": (
        {
            "architectures": ["GraniteForCausalLM"],
            "model_type": "granite",
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "attention_multiplier": 0.0078125,
            "embedding_multiplier": 12.0,
            "residual_multiplier": 0.22,
            "logits_scaling": 16.0,
        },
        ["softmax scale 0.0078125 != 1/sqrt(128)"],
    ),
    "bloom-7b": (
        {
            "architectures": ["BloomForCausalLM"],
            "model_type": "bloom",
            "hidden_size": 4096,
            "n_head": 32,
            "n_layer": 4,
        },
        ["ALiBi"],
    ),
}


@pytest.mark.parametrize("family", list(FAMILIES), ids=list(FAMILIES))
def test_real_model_families_are_refused_for_what_their_attention_does(tmp_path, family):
    config, reasons = FAMILIES[family]
    base = {
        "num_hidden_layers": 4,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(base | config))
    plan = make_plan(model=str(tmp_path), gpu="mi355x")
    assert plan.reasons == reasons


@pytest.mark.parametrize(
    ("mode", "first_asm", "mixed_from"),
    [
        ("FULL_AND_PIECEWISE", 16, 13),
        ("FULL_DECODE_ONLY", 16, 13),
        ("PIECEWISE", 16, 13),
        ("NONE", 16, 13),
        ("FULL", None, None),
    ],
)
def test_cudagraph_mode_decides_what_the_captured_graphs_hold(mode, first_asm, mixed_from):
    """Qwen3-14B on MI355X: 40 heads, cut 512. FULL captures no graph on asm and keeps
    mixed steps whole; every other mode runs asm from 16 sequences and splits mixed
    steps from 13 leading decodes (13 x 40 = 520 > 512)."""
    plan = make_plan(model="qwen3-14b-fp8", gpu="mi355x", cudagraph_mode=mode)
    sizes = asm_sizes(plan)
    assert (sizes[0] if sizes else None) == first_asm
    assert plan.mixed_asm_from_decodes == mixed_from
    full_note = [n for n in plan.notes if n.startswith("cudagraph_mode FULL")]
    assert len(full_note) == (mode == "FULL")


def test_full_mode_in_text_and_json(capsys):
    assert main(["plan", "--gpu", "mi355x", "--cudagraph-mode", "full"]) == 0
    text = capsys.readouterr().out
    assert "(cudagraph_mode FULL)" in text
    assert "prefill+decode steps stay whole on HIP under cudagraph_mode FULL" in text
    assert "asm runs only on eager pure-decode steps of more than 512 sequences" in text
    assert main(["plan", "--gpu", "mi355x", "--cudagraph-mode", "FULL", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cudagraph_mode"] == "FULL"
    assert {b["kernel"] for b in out["batches"]} == {"hip"}
    assert out["mixed_asm_from_decodes"] is None


def test_the_dtype_defaults_to_the_checkpoints_as_vllm_does(tmp_path):
    """vLLM's --dtype auto takes the checkpoint's torch_dtype: an fp16 checkpoint plans
    fp16 (HIP until proven) unless --dtype says otherwise."""
    from vllm_rocm_asm_decode.eligibility import FP16_UNPROVEN

    model = str(
        harness.write_model_dir(
            tmp_path, num_heads=32, num_kv_heads=8, extra={"torch_dtype": "float16"}
        )
    )
    plan = make_plan(model=model, gpu="mi355x", aiter_version="0.1.22")
    assert plan.dtype == "float16" and plan.reasons == [FP16_UNPROVEN]
    assert make_plan(model=model, gpu="mi355x", dtype="bfloat16").eligible


def test_a_page_past_2_gib_is_said_plainly(capsys):
    # 2 Mi + 16 tokens a block at 1 KiB a token: a K page 16 KiB past 2 GiB; one block of
    # every layer, K and V, 160 GiB (under the MI355X's 288 GiB)
    argv = ["plan", "--gpu", "mi355x", "--block-size", "2097168", "--aiter-version", "0.1.16"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "a KV page of 2147500032 bytes ends past 2 GiB: every layer keeps HIP" in out


def table_rows(text: str) -> dict[int, list[str]]:
    """The batch table's rows of a text plan, by sequence count."""
    start = text.index("  seqs  query heads")
    rows = [line.split() for line in text[start:].splitlines()[1:] if line.strip()]
    return {int(row[0]): row[1:] for row in rows}


#: The batch table's header where each step is decided on its lengths.
PER_STEP_HEADERS = {
    "PIECEWISE": "decode kernel at vLLM's capture sizes, for short contexts (cudagraph_mode "
    "PIECEWISE: no graph holds the attention; each step is decided on its lengths);",
    "NONE": "decode kernel at these batch sizes, for short contexts (cudagraph_mode NONE: no "
    "graph holds the attention; each step is decided on its lengths);",
}


@pytest.mark.parametrize("mode", ["PIECEWISE", "NONE"])
def test_without_full_decode_graphs_the_skew_clause_decides_the_worst_case(
    mode, monkeypatch, capsys
):
    """Qwen3-14B on MI355X (8 KV heads, max_model_len 40960): no graph holds the
    attention, so the worst-case step (one request at 40960 among one-token ones) is
    decided on its lengths, and the skew clause sends it to HIP at every size: 67 x
    40960 passes 8 x (40960 + 511) + 19500. Steps of short contexts run asm from 16."""
    monkeypatch.delenv("VLLM_ROCM_ASM_DECODE_SKEW", raising=False)
    plan = make_plan(model="qwen3-14b-fp8", gpu="mi355x", cudagraph_mode=mode)
    assert min(asm_sizes(plan)) == 16
    assert {b["worst_kernel"] for b in plan.batches} == {"hip"}
    assert main(["plan", "--gpu", "mi355x", "--cudagraph-mode", mode]) == 0
    text = capsys.readouterr().out
    assert "captured graphs hold" not in text
    skew = next(line for line in text.splitlines() if line.startswith("skew "))
    assert skew.endswith("each step is decided on its lengths (worst case below)"), skew
    assert PER_STEP_HEADERS[mode] in text.splitlines()
    assert "CUDA-graph" not in text  # NONE has no graphs, PIECEWISE none of the attention
    rows = table_rows(text)
    assert rows[16][1] == "asm" and rows[16][-1] == "hip"  # kernel, worst runs
    assert {row[-1] for row in rows.values()} == {"hip"}
    assert main(["plan", "--gpu", "mi355x", "--cudagraph-mode", mode, "--json"]) == 0
    batches = json.loads(capsys.readouterr().out)["batches"]
    assert {b["worst_kernel"] for b in batches} == {"hip"}
    assert {b["num_seqs"]: b["kernel"] for b in batches}[16] == "asm"


@pytest.mark.parametrize(
    ("mode", "env", "worst_16"),
    [
        pytest.param("FULL_AND_PIECEWISE", None, "asm", id="full-decode-graphs-hold-asm"),
        pytest.param("FULL_DECODE_ONLY", None, "asm", id="decode-only-graphs-hold-asm"),
        pytest.param("FULL", None, "hip", id="full-graphs-hold-hip"),
        pytest.param("NONE", "0", "asm", id="eager-with-skew-off-runs-asm"),
        pytest.param("PIECEWISE", "0", "asm", id="piecewise-with-skew-off-runs-asm"),
    ],
)
def test_the_worst_case_runs_what_holds_it(mode, env, worst_16, monkeypatch, capsys):
    """Captured graphs replay their kernel for any lengths, and with the skew clause off
    (its ratio 0) nothing sends a step of asm's size back to HIP: the worst case runs
    the kernel column's kernel."""
    if env is None:
        monkeypatch.delenv("VLLM_ROCM_ASM_DECODE_SKEW", raising=False)
    else:
        monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_SKEW", env)
    plan = make_plan(model="qwen3-14b-fp8", gpu="mi355x", cudagraph_mode=mode)
    assert all(b["worst_kernel"] == b["kernel"] for b in plan.batches)
    assert {b["num_seqs"]: b["worst_kernel"] for b in plan.batches}[16] == worst_16
    assert main(["plan", "--gpu", "mi355x", "--cudagraph-mode", mode]) == 0
    text = capsys.readouterr().out
    assert table_rows(text)[16][-1] == worst_16
    if env is None:
        assert "captured graphs hold their kernel for any lengths (worst case below)" in text
        header = f"decode kernel at vLLM's CUDA-graph batch sizes (cudagraph_mode {mode});"
        assert header in text.splitlines()


@pytest.mark.parametrize("mode", ["PIECEWISE", "NONE"])
@pytest.mark.parametrize(
    ("max_model_len", "worst"),
    [
        # 67 x 332 = 22244 does not pass 8 KV heads x (332 + 15) + 19500 = 22276 at 16
        # sequences, nor more at more: the worst step runs the kernel column's.
        pytest.param(332, {8: "hip", 16: "asm", 24: "asm", 512: "asm"}, id="not-skewed"),
        # 67 x 333 = 22311 passes 8 x (333 + 15) + 19500 = 22284 at 16, not 8 x (333 +
        # 23) + 19500 = 22348 at 24.
        pytest.param(333, {8: "hip", 16: "hip", 24: "asm", 512: "asm"}, id="skewed-at-16"),
    ],
)
def test_the_skew_clause_decides_the_worst_case_at_its_edge(
    mode, max_model_len, worst, monkeypatch, capsys
):
    """Qwen3-14B on MI355X (8 KV heads, asm from 16 sequences of short contexts): at
    max_model_len 332 the worst step is not skewed and runs asm; at 333 it is at 16
    sequences only. Query heads (40) or the sequence count in the KV heads' place would
    keep 333's worst step at 16 on asm."""
    monkeypatch.delenv("VLLM_ROCM_ASM_DECODE_SKEW", raising=False)
    plan = make_plan(
        model="qwen3-14b-fp8", gpu="mi355x", cudagraph_mode=mode, max_model_len=max_model_len
    )
    batches = {b["num_seqs"]: b for b in plan.batches}
    assert {n: batches[n]["worst_kernel"] for n in worst} == worst
    argv = ["plan", "--gpu", "mi355x", "--cudagraph-mode", mode]
    assert main([*argv, "--max-model-len", str(max_model_len)]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert {n: rows[n][-1] for n in worst} == worst


def test_a_config_only_directory_says_no_checkpoint_was_read(tmp_path, capsys):
    """A directory of config.json alone has no checkpoint to read scales from: not a
    checkpoint "without" scales, but one plan never saw, as for a preset."""
    model = str(harness.write_model_dir(tmp_path, num_heads=32, num_kv_heads=8))
    plan = make_plan(model=model, gpu="mi355x")
    assert plan.kv_scales == "1.0 (config only, no checkpoint read)"
    assert main(["plan", "--model", model, "--gpu", "mi355x"]) == 0
    assert "; KV scales: 1.0 (config only, no checkpoint read)" in capsys.readouterr().out


def test_a_vllm_that_carries_the_change_is_named_first_in_the_notes(monkeypatch, capsys):
    """Stock vLLM: no such note. One whose rocm_attn.py defines stage 1's rule (read as
    the plugin reads it, from the source): the plugin is inactive there, and plan says
    whose plan it shows."""
    from vllm_rocm_asm_decode import plugin

    assert main(["plan", "--gpu", "mi355x", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["vllm_carries_asm_decode"] is False
    assert not any("carries the asm decode" in note for note in out["notes"])
    real = plugin.module_source

    def patched(module):
        text = real(module)
        if module.endswith(".rocm_attn"):
            text += "\n\ndef _asm_decode_rejections(impl):\n    return []\n"
        return text

    monkeypatch.setattr(plugin, "module_source", patched)
    assert main(["plan", "--gpu", "mi355x"]) == 0
    notes = [x for x in capsys.readouterr().out.splitlines() if x.startswith("note: ")]
    assert notes[0].startswith(
        "note: the vLLM imported here carries the asm decode itself "
        "(vllm.v1.attention.backends.rocm_attn): the plugin stays inactive there"
    )
    assert "off by default there: --attention-config.use_aiter_asm_decode=true turns" in notes[0]


#: Compressed-tensors fp8 (weights and activations per tensor) with an fp8 KV cache
#: scheme, as llm-compressor writes it.
COMPRESSED_FP8 = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False},
            "input_activations": {
                "num_bits": 8,
                "type": "float",
                "strategy": "tensor",
                "dynamic": False,
            },
        }
    },
    "ignore": ["lm_head"],
    "kv_cache_scheme": {
        "num_bits": 8,
        "type": "float",
        "strategy": "tensor",
        "dynamic": False,
        "symmetric": True,
    },
}
MODELOPT_FP8 = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
#: Models vLLM's ROCm platform serves on another backend, as its
#: RocmAttentionBackend.validate_configuration says (gpt-oss was planned "HIP: attention
#: sinks", Gemma 3's 10 global layers of 62 as asm).
ANOTHER_BACKEND = {
    "gpt-oss-sinks": (
        {
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "hidden_size": 2880,
            "head_dim": 64,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "sliding_window": 128,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
        },
        "vLLM would not serve gpt_oss on ROCM_ATTN (attention sinks not supported)",
    ),
    "granite-with-layer-types": (  # vLLM's granite_layer_attn_params: sinks by default
        {
            "architectures": ["GraniteForCausalLM"],
            "model_type": "granite",
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "attention_multiplier": 128**-0.5,
            "layer_types": ["full_attention"] * 4,
        },
        "vLLM would not serve granite on ROCM_ATTN (attention sinks not supported)",
    ),
    "granite-swa": (  # transformers fills its layer_types: sinks on every layer
        {
            "architectures": ["GraniteSWAForCausalLM"],
            "model_type": "granite_swa",
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "attention_multiplier": 128**-0.5,
        },
        "vLLM would not serve granite_swa on ROCM_ATTN (attention sinks not supported)",
    ),
    "r-swa": (  # vLLM's selector passes use_rswa from ModelConfig.rswa_window
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "rswa_window": 128,
        },
        "vLLM would not serve llama on ROCM_ATTN (R-SWA not supported)",
    ),
    "gemma3-multimodal-prefix": (
        {
            "architectures": ["Gemma3ForConditionalGeneration"],
            "model_type": "gemma3",
            "text_config": {
                "model_type": "gemma3_text",
                "hidden_size": 2560,
                "head_dim": 128,
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
                "num_hidden_layers": 6,
                "intermediate_size": 1024,
                "vocab_size": 262208,
                "query_pre_attn_scalar": 128,
                "sliding_window": 1024,
                "max_position_embeddings": 32768,
            },
            "vision_config": {
                "model_type": "siglip_vision_model",
                "hidden_size": 1152,
                "image_size": 896,
                "intermediate_size": 4304,
                "num_attention_heads": 16,
                "num_hidden_layers": 27,
                "patch_size": 14,
            },
            "mm_tokens_per_image": 256,
        },
        "vLLM would not serve gemma3 on ROCM_ATTN (partial multimodal token full attention",
    ),
    "per-head-kv-scales": (
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "quantization_config": COMPRESSED_FP8
            | {"kv_cache_scheme": COMPRESSED_FP8["kv_cache_scheme"] | {"strategy": "attn_head"}},
        },
        "vLLM would not serve llama on ROCM_ATTN (per-head quant scales not supported)",
    ),
}
LLAMA_BASE = {
    "num_hidden_layers": 4,
    "intermediate_size": 1024,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize("model", list(ANOTHER_BACKEND), ids=list(ANOTHER_BACKEND))
def test_a_model_vllm_serves_on_another_backend_is_refused(tmp_path, model, capsys):
    config, says = ANOTHER_BACKEND[model]
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_BASE | config))
    argv = ["plan", "--model", str(tmp_path), "--gpu", "mi300x"]
    assert_one_line_exit_2(argv, says, capsys)
    assert_one_line_exit_2(argv, "), so the asm decode does not apply", capsys)


@pytest.mark.parametrize(
    ("quantization", "served"),
    [(COMPRESSED_FP8, "fp8"), (MODELOPT_FP8, "fp8_e4m3")],
    ids=["compressed-tensors", "modelopt"],
)
def test_kv_cache_dtype_auto_takes_the_checkpoints_fp8_cache_as_vllm_does(
    tmp_path, quantization, served
):
    """--kv-cache-dtype auto on a checkpoint that declares an fp8 KV cache was planned as a
    bf16 cache ("auto KV cache", every layer HIP); vLLM serves it fp8: ModelOpt's through
    the engine's resolve_kv_cache_dtype_string, compressed-tensors' through the attention
    layer. An explicit --kv-cache-dtype wins, as in vLLM."""
    llama = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    }
    config = LLAMA_BASE | llama | {"quantization_config": quantization}
    (tmp_path / "config.json").write_text(json.dumps(config))
    plan = make_plan(model=str(tmp_path), gpu="mi300x", kv_cache_dtype="auto")
    assert plan.kv_cache_dtype == served and plan.eligible
    note = "--kv-cache-dtype auto: the checkpoint's quantization_config declares its KV cache"
    assert [n for n in plan.notes if n.startswith(note)] == [
        f"{note}, so vLLM serves it as {served}"
    ]
    plan = make_plan(model=str(tmp_path), gpu="mi300x", kv_cache_dtype="bfloat16")
    assert plan.reasons == ["bfloat16 KV cache"] and not any("declares" in n for n in plan.notes)


@pytest.mark.parametrize(
    ("arch", "capability"),
    [("gfx942", (9, 4)), ("gfx950", (9, 5)), ("gfx90a", (9, 0)), ("gfx1100", (11, 0)), ("", None)],
)
def test_the_compute_capability_is_torchs_on_rocm(arch, capability):
    from vllm_rocm_asm_decode.tools.plan import device_capability

    found = device_capability(arch)
    assert (found and (found.major, found.minor)) == capability


LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}
SCHEME = COMPRESSED_FP8["kv_cache_scheme"]
#: KV-cache quantization vLLM's attention layer refuses at start-up (trial 20: each was
#: planned, 4 of 4 layers eligible).
REFUSED_KV_QUANTIZATION = {
    "scheme-a-string": (COMPRESSED_FP8 | {"kv_cache_scheme": "fp8"}, "fp8", "is a str, not an"),
    "scheme-4-bit": (
        COMPRESSED_FP8 | {"kv_cache_scheme": SCHEME | {"num_bits": 4}},
        "auto",
        "kv_cache_scheme: Currently supported kv cache quantization is num_bits=8",
    ),
    "scheme-asymmetric": (
        COMPRESSED_FP8 | {"kv_cache_scheme": SCHEME | {"symmetric": False}},
        "fp8",
        "Only support symmetric scaling factor",
    ),
    "e5m2-on-fp8": (
        {"quant_method": "fp8", "activation_scheme": "dynamic"},
        "fp8_e5m2",
        "--kv-cache-dtype fp8_e5m2: vLLM refuses it with",
    ),
    "e5m2-on-a-scheme": (COMPRESSED_FP8, "fp8_e5m2", "fp8_e5m2 kv-cache is not supported"),
}


@pytest.mark.parametrize("case", list(REFUSED_KV_QUANTIZATION), ids=list(REFUSED_KV_QUANTIZATION))
def test_kv_cache_quantization_vllm_refuses_is_one_line(tmp_path, case, capsys):
    quantization, kv_cache_dtype, says = REFUSED_KV_QUANTIZATION[case]
    config = LLAMA_BASE | LLAMA | {"quantization_config": quantization}
    (tmp_path / "config.json").write_text(json.dumps(config))
    argv = ["plan", "--model", str(tmp_path), "--kv-cache-dtype", kv_cache_dtype]
    assert_one_line_exit_2(argv, says, capsys)


def test_fp8_e5m2_stays_where_vllm_takes_it(tmp_path):
    """A compressed-tensors checkpoint declaring no KV scheme loads no KV scales: vLLM takes
    fp8_e5m2 there (the kernel does not); a Granite without layer_types has no sinks."""
    config = (
        LLAMA_BASE | LLAMA | {"quantization_config": COMPRESSED_FP8 | {"kv_cache_scheme": None}}
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    plan = make_plan(model=str(tmp_path), gpu="mi300x", kv_cache_dtype="fp8_e5m2")
    assert plan.reasons == ["fp8_e5m2 KV cache"]
    granite = ANOTHER_BACKEND["granite-with-layer-types"][0] | {"layer_types": None}
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_BASE | granite))
    assert make_plan(model=str(tmp_path), gpu="mi300x").eligible


def test_a_multimodal_prefix_model_serving_text_alone_is_planned(tmp_path, capsys):
    """vLLM turns multimodal prefix attention off for --language-model-only (the model's
    text model alone), and then serves Gemma 3 on ROCM_ATTN: the refusal names the flag,
    and plan takes it as vllm serve does."""
    config, _ = ANOTHER_BACKEND["gemma3-multimodal-prefix"]
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_BASE | config))
    argv = ["plan", "--model", str(tmp_path), "--gpu", "mi300x"]
    assert_one_line_exit_2(argv, "; with --language-model-only it serves the text model", capsys)
    plan = make_plan(model=str(tmp_path), gpu="mi300x", language_model_only=True)
    assert plan.num_layers == 6 and plan.eligible_layers == 1  # the one global layer of six
    assert [n for n in plan.notes if n.startswith("--language-model-only: planned is")]
    assert main([*argv, "--language-model-only", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["eligible_layers"] == 1
    text_only = make_plan(gpu="mi300x", language_model_only=True)  # a text model: no note
    assert not [n for n in text_only.notes if "language-model-only" in n]


def test_structural_refusals_come_before_the_checkpoints_quantization(tmp_path, capsys):
    """An MLA model with an fp8 checkpoint and --kv-cache-dtype fp8_e5m2 said "use fp8"
    first; MLA means no option makes ROCM_ATTN apply, which is the line to read."""
    mla = {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "moe_intermediate_size": 256,
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"},
    }
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_BASE | mla))
    argv = ["plan", "--model", str(tmp_path), "--kv-cache-dtype", "fp8_e5m2"]
    assert_one_line_exit_2(argv, "deepseek_v2 uses multi-head latent attention", capsys)


def test_batch_invariance_is_read_as_vllms_selector_reads_it(monkeypatch):
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    with pytest.raises(PlanError, match=r"\(batch invariance not supported\)"):
        make_plan(gpu="mi300x")


def test_a_config_without_model_type_is_told_the_key_it_lacks(tmp_path):
    """(trial 26) The first sentence alone, "Unrecognized model in DIR", left out the
    key to add."""
    from vllm.config import ModelConfig

    from vllm_rocm_asm_decode.tools import plan

    (tmp_path / "config.json").write_text('{"num_attention_heads": 32, "hidden_size": 4096}')
    with pytest.raises(Exception) as raised:
        ModelConfig(str(tmp_path))
    said = plan._what_is_wrong(raised.value)
    assert (
        said
        == f"Unrecognized model in {tmp_path}: it should have a `model_type` key in its config.json"
    ), said


@pytest.mark.parametrize(
    ("weights", "said"),
    [
        ({"model.safetensors": b"garbage-garbage-garbage"}, "cannot read {}/model.safetensors: "),
        (
            {
                "model-00002-of-00002.safetensors": b"",
                "model.safetensors.index.json": b'{"weight_map": {"a": '
                b'"model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}',
            },
            "{}/model-00001-of-00002.safetensors (listed in model.safetensors.index.json) "
            "does not exist",
        ),
    ],
    ids=["not-safetensors", "shard-missing"],
)
def test_broken_weights_without_a_dtype_in_config_json_are_named(tmp_path, capsys, weights, said):
    """(trial 26) vLLM reads the weights' headers for the dtype config.json leaves out, and
    said "MemoryError" or "unpack requires a buffer of 8 bytes", naming no file."""
    harness.write_model_dir(tmp_path, num_heads=32, num_kv_heads=8)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["torch_dtype"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    for name, data in weights.items():
        (tmp_path / name).write_bytes(data)
    assert main(["plan", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said.format(tmp_path) in err[0], err


def test_a_plan_for_the_default_gpu_says_it_is_one(monkeypatch):
    """(trial 26) Off ROCm, plan planned for MI355X without a word that it was chosen."""
    from vllm.platforms import current_platform

    note = "no ROCm GPU here: planned for MI355X, the default (--gpu mi300x, mi325x, mi355x"
    live = make_plan().notes  # the stand-in ROCm GPU: planned for it, no note
    assert not any(n.startswith("no ROCm GPU") for n in live)
    monkeypatch.setattr(current_platform, "is_rocm", lambda: False)  # as on a laptop
    assert any(n.startswith(note) for n in make_plan().notes)
    assert not any(n.startswith("no ROCm GPU") for n in make_plan(gpu="mi355x").notes)
