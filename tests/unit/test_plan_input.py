"""``plan`` on inputs a new user gives (issue 21): config values vLLM's config takes but
the plan path did not, paths the OS refuses, vLLM's variables read as vLLM reads them,
layer counts in sub-configs, and vLLM's own reasons kept whole. Each is one line on
stderr and exit 2 (or the right answer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_rocm_asm_decode.tools import plan as plan_module
from vllm_rocm_asm_decode.tools.choices import PRESETS_DIR, InputError
from vllm_rocm_asm_decode.tools.cli import main
from vllm_rocm_asm_decode.tools.plan import make_plan

#: The qwen3-8b preset's config.json ("base" in issue 21).
BASE = json.loads((PRESETS_DIR / "qwen3-8b" / "config.json").read_text())
GEMMA2 = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "hidden_size": 4608,
    "head_dim": 128,
    "num_attention_heads": 32,
    "num_key_value_heads": 16,
    "num_hidden_layers": 4,
    "intermediate_size": 1024,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "query_pre_attn_scalar": 144,
    "attn_logit_softcapping": 50.0,
    "torch_dtype": "bfloat16",
}
LONG = "/tmp/" + "a" * 300


def model_dir(tmp_path: Path, config: dict) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def one_line_exit_2(argv: list[str], capsys) -> str:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, (code, err)
    assert err[0].startswith("vllm-rocm-asm-decode "), err
    return err[0]


# --------------------------------------------------------------------------------------
# 1: attention numbers a model class computes with


BAD_NUMBERS = {
    "attention-multiplier-text": (BASE | {"attention_multiplier": "x"}, "attention_multiplier"),
    "pre-attn-scalar-text": (BASE | {"query_pre_attn_scalar": "abc"}, "query_pre_attn_scalar"),
    "softcap-text": (BASE | {"attn_logit_softcapping": "x"}, "attn_logit_softcapping"),
    "pre-attn-scalar-negative": (BASE | {"query_pre_attn_scalar": -1}, "must be above 0"),
    "gemma2-pre-attn-scalar-negative": (
        GEMMA2 | {"query_pre_attn_scalar": -128},
        "query_pre_attn_scalar is -128; it must be above 0",
    ),
    "pre-attn-scalar-zero": (BASE | {"query_pre_attn_scalar": 0}, "must be above 0"),
    "softcap-negative": (GEMMA2 | {"attn_logit_softcapping": -5.0}, "0 (none) or above"),
}


@pytest.mark.parametrize("case", list(BAD_NUMBERS), ids=list(BAD_NUMBERS))
def test_attention_numbers_are_judged_before_vllm(tmp_path, case, capsys):
    config, message = BAD_NUMBERS[case]
    line = one_line_exit_2(["plan", "--model", model_dir(tmp_path, config)], capsys)
    assert message in line and "config.json" in line, line


@pytest.mark.parametrize(
    ("field", "refused"),
    [("num_attention_heads", True), ("num_hidden_layers", True), ("num_key_value_heads", False)],
)
def test_a_null_count_in_config_json_is_judged_before_vllm(tmp_path, field, refused):
    """A null head or layer count is refused at once (vLLM would refuse it only after its
    import); a null KV head count means as many as the heads, as transformers reads it."""
    from vllm_rocm_asm_decode.tools.choices import check_model_config

    model_dir(tmp_path, BASE | {field: None})
    if refused:
        with pytest.raises(InputError, match=f"{field} is null; it must be a whole number"):
            check_model_config(tmp_path)
    else:
        check_model_config(tmp_path)


@pytest.mark.parametrize(
    ("case", "field"),
    [
        ("attention-multiplier-text", "attention_multiplier"),
        ("pre-attn-scalar-negative", "query_pre_attn_scalar"),
        ("softcap-text", "attn_logit_softcapping"),
        ("softcap-negative", "attn_logit_softcapping"),
    ],
)
def test_attention_numbers_are_judged_where_plan_builds_the_layers_too(
    tmp_path, case, field, monkeypatch
):
    """The same values reaching plan_layers (the early check left out) are one line."""
    monkeypatch.setattr(plan_module, "check_config", lambda *args: None)
    config, _ = BAD_NUMBERS[case]
    with pytest.raises(InputError, match=f"config.json: {field} is"):
        make_plan(model=model_dir(tmp_path, config), gpu="mi355x")


def test_a_valid_gemma2_scalar_still_plans(tmp_path):
    plan = make_plan(model=model_dir(tmp_path, GEMMA2), gpu="mi355x")
    assert "softmax scale 0.0833333 != 1/sqrt(128)" in plan.reasons


# --------------------------------------------------------------------------------------
# 2, 3, 4, and ASCII digits: options and paths


SERVED = {  # what stock ROCM_ATTN would not serve at all is an input error, not a "HIP" row
    "head-size-8": (
        {"head_dim": 8},
        [],
        "head size 8: vLLM's ROCM_ATTN serves head sizes 32, 64, 80, 96, 128, 160, 192, 224, "
        "256 only",
    ),
    "block-size-15": (
        {},
        ["--block-size", "15"],
        "--block-size: 15: vLLM's ROCM_ATTN takes a multiple of 16",
    ),
}


def test_the_head_sizes_judged_before_vllm_are_rocm_attns(tmp_path, monkeypatch, capsys):
    from vllm.v1.attention.backends.rocm_attn import RocmAttentionBackend

    from vllm_rocm_asm_decode.tools import plan_input

    assert list(plan_input.ROCM_ATTN_HEAD_SIZES) == RocmAttentionBackend.get_supported_head_sizes()
    monkeypatch.setattr("vllm_rocm_asm_decode.tools.plan.make_plan", None)  # never reached
    model = model_dir(tmp_path, BASE | {"head_dim": 72})
    line = one_line_exit_2(["plan", "--model", model], capsys)
    assert "head size 72: vLLM's ROCM_ATTN serves head sizes 32, 64, 80" in line, line


def test_the_block_sizes_judged_before_vllm_are_rocm_attns():
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.rocm_attn import RocmAttentionBackend

    from vllm_rocm_asm_decode.tools import choices

    (kind,) = RocmAttentionBackend.get_supported_kernel_block_sizes()
    assert isinstance(kind, MultipleOf) and kind.base == choices.ROCM_ATTN_BLOCK_MULTIPLE


@pytest.mark.parametrize(("overrides", "args", "message"), SERVED.values(), ids=SERVED)
def test_what_rocm_attn_does_not_serve_is_one_line(tmp_path, overrides, args, message, capsys):
    model = model_dir(tmp_path, BASE | overrides)
    line = one_line_exit_2(["plan", "--model", model, *args], capsys)
    assert message in line and "would not serve this model" in line, line


def test_a_block_size_past_what_a_tensor_indexes_is_one_line(capsys):
    line = one_line_exit_2(
        ["plan", "--model", "qwen3-8b", "--block-size", "160000000000000000000"], capsys
    )
    # One block is past every GPU's memory long before it is past what a tensor indexes.
    assert "--block-size 160000000000000000000: one block takes " in line, line


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--model", LONG],
        ["check", "accuracy", "--json", LONG + ".json"],
        ["bench", "kernel", "--json", LONG + ".json"],
    ],
    ids=["plan-model", "accuracy-json", "kernel-json"],
)
def test_a_path_too_long_for_the_os_is_one_line(argv, capsys):
    assert "File name too long" in one_line_exit_2(argv, capsys)


def test_a_home_of_a_user_that_does_not_exist_is_one_line(capsys):
    line = one_line_exit_2(["plan", "--model", "~nosuchuser/x"], capsys)
    assert "no user 'nosuchuser'" in line, line


@pytest.mark.parametrize(
    "digit", ["\uff14", "\u0663", "\u00b2"], ids=["fullwidth", "arabic-indic", "super"]
)
def test_plan_numbers_take_ascii_digits_only(digit, capsys):
    line = one_line_exit_2(["plan", "-tp", digit], capsys)
    assert "is not a whole number (ASCII digits)" in line, line


# --------------------------------------------------------------------------------------
# 12: vLLM's variables, read by vLLM's own envs

SPELLINGS = ["1", "true", "TRUE", "True", " 1 ", "1 ", " true", "0", "false", "", "yes", "on"]


@pytest.mark.parametrize("name", ["VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MHA"])
def test_vllms_rocm_switches_are_read_as_vllm_envs_reads_them(name, monkeypatch):
    import vllm.envs as envs

    for other in ("VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MHA", "VLLM_ROCM_ASM_DECODE"):
        monkeypatch.delenv(other, raising=False)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    for spelling in SPELLINGS:
        monkeypatch.setenv(name, spelling)
        off = plan_module.switched_off()
        assert (off is None) == getattr(envs, name), (name, spelling, off)
        if off is not None:
            assert off.startswith(f"{name}=") and "(the asm decode is off)" in off


def test_a_padded_one_turns_the_asm_decode_off_as_in_vllm(monkeypatch):
    monkeypatch.delenv("VLLM_ROCM_USE_AITER_MHA", raising=False)
    monkeypatch.setenv("VLLM_ROCM_USE_AITER", " 1 ")
    plan = make_plan(gpu="mi355x")
    assert not plan.eligible
    assert plan.reasons == ["VLLM_ROCM_USE_AITER=' 1 ' (the asm decode is off)"]


# --------------------------------------------------------------------------------------
# 15: the layer bound in every section


def llava(layers: int) -> dict:
    text = {k: v for k, v in BASE.items() if k != "architectures"} | {"num_hidden_layers": layers}
    return {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,  # what the top-level check reads
        "text_config": text,
        "vision_config": {"model_type": "clip_vision_model", "num_hidden_layers": 24},
    }


@pytest.mark.parametrize("layers", [20_000, 3_000_000])
def test_layers_in_a_text_config_are_bounded(tmp_path, layers, capsys):
    line = one_line_exit_2(["plan", "--model", model_dir(tmp_path, llava(layers))], capsys)
    assert f"text_config.num_hidden_layers is {layers}" in line and "1024" in line, line


def test_the_layer_count_vllm_reads_is_bounded_too(tmp_path, monkeypatch):
    monkeypatch.setattr(plan_module, "check_config", lambda *args: None)
    model = model_dir(tmp_path, BASE | {"num_hidden_layers": 2000})
    with pytest.raises(InputError, match="vLLM reads 2000 layers"):
        make_plan(model=model, gpu="mi355x")


# --------------------------------------------------------------------------------------
# 18: vLLM's (and Transformers') reason, whole

REASONS = {
    "head-dim-fraction": (
        {"head_dim": 128.5},
        "config.json field 'head_dim': expected int, got float (value: 128.5)",
    ),
    "head-dim-text": ({"head_dim": "128"}, "field 'head_dim': expected int, got str"),
    "max-position-text": (
        {"max_position_embeddings": "4096"},
        "field 'max_position_embeddings': expected int, got str (value: '4096')",
    ),
    "sliding-window-text": (
        {"sliding_window": "4096"},
        "field 'sliding_window': value '4096' doesn't match any type in (int, NoneType)",
    ),
    "sliding-window-list": ({"sliding_window": [1, 2]}, "field 'sliding_window': value [1, 2]"),
    "rope-scaling-text": (
        {"rope_scaling": "yes"},
        "field 'rope_parameters' (rope_scaling): value 'yes' doesn't match any type in",
    ),
    "architectures-text": (
        {"architectures": "Qwen3ForCausalLM"},
        "architectures: Input should be a valid list (got str 'Qwen3ForCausalLM')",
    ),
    "fp8-torch-dtype": (
        {"torch_dtype": "float8_e4m3fn"},
        'torch_dtype is "float8_e4m3fn", not a dtype vLLM runs a model in',
    ),
}


@pytest.mark.parametrize("case", list(REASONS), ids=list(REASONS))
def test_vllms_reason_is_one_whole_line(tmp_path, case, capsys, monkeypatch):
    import types

    from vllm.transformers_utils import repo_utils

    # vLLM retries reading a config after 2 s; the answer is the same without the wait.
    monkeypatch.setattr(repo_utils, "time", types.SimpleNamespace(sleep=lambda seconds: None))
    overrides, message = REASONS[case]
    line = one_line_exit_2(["plan", "--model", model_dir(tmp_path, BASE | overrides)], capsys)
    assert message in line and not line.endswith(":"), line


def test_the_dtype_fallback_off_a_gpu_says_what_is_wrong():
    def _resolve_auto_dtype():  # the name of vLLM's function that raises it
        raise NotImplementedError

    try:
        _resolve_auto_dtype()
    except NotImplementedError as exc:
        assert plan_module._in_dtype_fallback(exc)
    assert not plan_module._in_dtype_fallback(NotImplementedError("other"))


# --------------------------------------------------------------------------------------
# 20, 22: checkpoint scales plan cannot count as vLLM would load them


def checkpoint(path: Path, tensors: dict, quantization: dict) -> str:
    import torch
    from safetensors.torch import save_file

    model = model_dir(path, BASE | {"num_hidden_layers": 2, "quantization_config": quantization})
    save_file(
        {"model.embed_tokens.weight": torch.zeros(4, 4)} | tensors, f"{model}/model.safetensors"
    )
    return model


def test_checkpoint_scales_vllm_refuses_are_one_line(tmp_path, capsys):
    import torch

    k, v = "model.layers.0.self_attn.k_scale", "model.layers.0.self_attn.v_scale"
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}  # as vLLM's Fp8Config reads
    cases = {
        "nan": ({k: torch.tensor(float("nan")), v: torch.tensor(0.5)}, fp8),
        "per-head": ({k: torch.full((8,), 0.5), v: torch.full((8,), 0.5)}, fp8),
        "v-only": ({v: torch.tensor(0.5)}, fp8),
    }
    messages = {
        "nan": "holds nan; a KV scale must be a finite number above 0",
        "per-head": "has shape [8]: vLLM loads one scale per tensor for fp8 checkpoints",
        "v-only": "layer 0 has a V scale but no K scale",
    }
    for case, (tensors, quantization) in cases.items():
        model = checkpoint(tmp_path / case, tensors, quantization)
        line = one_line_exit_2(["plan", "--model", model], capsys)
        assert messages[case] in line, (case, line)


# --------------------------------------------------------------------------------------
# What config.json and --model decide is decided before plan's vLLM path


@pytest.mark.parametrize(
    "case",
    ["attention-multiplier-text", "gemma2-pre-attn-scalar-negative", "layers", "dtype", "path"],
)
def test_what_the_input_alone_decides_never_reaches_vllm(tmp_path, case, monkeypatch, capsys):
    def vllm_path(**kwargs):
        raise AssertionError("make_plan (vLLM's ModelConfig) was reached")

    monkeypatch.setattr(plan_module, "make_plan", vllm_path)
    if case == "path":
        model = "~nosuchuser/x"
    elif case == "layers":
        model = model_dir(tmp_path, llava(20_000))
    elif case == "dtype":
        model = model_dir(tmp_path, BASE | {"torch_dtype": "int8"})
    else:
        model = model_dir(tmp_path, BAD_NUMBERS[case][0])
    one_line_exit_2(["plan", "--model", model], capsys)


# --------------------------------------------------------------------------------------
# Trial 17: models without decode steps or attention, an incomplete checkpoint, a config
# no GPU holds one block of, and a model of one KV head

#: A decoder of head size 128 every layer of which runs asm (the control), and encoders
#: and a classifier of its shape: pooling models, whose requests never decode.
DECODER = BASE | {"num_hidden_layers": 4, "num_key_value_heads": 8}
ENCODER = {
    "hidden_size": 1536,
    "num_attention_heads": 12,
    "num_hidden_layers": 4,
    "intermediate_size": 1024,
    "vocab_size": 1000,
    "position_embedding_type": "absolute",
    "torch_dtype": "bfloat16",
}
POOLING = {
    "bert": ENCODER
    | {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "type_vocab_size": 2,
        "max_position_embeddings": 512,
    },
    "roberta": ENCODER
    | {
        "architectures": ["RobertaModel"],
        "model_type": "roberta",
        "type_vocab_size": 1,
        "pad_token_id": 1,
        "max_position_embeddings": 514,
    },
    "xlm-roberta": ENCODER
    | {
        "architectures": ["XLMRobertaModel"],
        "model_type": "xlm-roberta",
        "type_vocab_size": 1,
        "pad_token_id": 1,
        "max_position_embeddings": 514,
    },
    "qwen3-classifier": DECODER | {"architectures": ["Qwen3ForSequenceClassification"]},
}


@pytest.mark.parametrize("family", list(POOLING), ids=list(POOLING))
def test_a_pooling_model_has_no_layer_on_asm(tmp_path, family, capsys):
    """A BERT-style encoder was planned as a decoder: "12 of 12 layers eligible". vLLM
    reads it as encoder-only, and any model it runs with its pooling runner as one with
    no decode step; each layer says so."""
    assert make_plan(model=model_dir(tmp_path / "control", DECODER), gpu="mi355x").eligible
    model = model_dir(tmp_path / family, POOLING[family])
    plan = make_plan(model=model, gpu="mi355x")
    encoder = family != "qwen3-classifier"
    assert not plan.eligible and plan.eligible_layers == 0
    assert plan.reasons == sorted(
        [plan_module.POOLING_MODEL, *(["not decoder self-attention"] if encoder else [])]
    )
    assert main(["plan", "--model", model, "--gpu", "mi355x"]) == 0
    out = capsys.readouterr().out
    assert "asm decode: no layer is eligible" in out and "no decode steps" in out, out
    # No decode step: no table of decode kernels by batch size (it printed one, all HIP).
    assert plan.batches == [] and "seqs  query heads" not in out
    assert out.rstrip().endswith("no decode kernel table: the model runs no decode step")


LLAMA4_TEXT = {
    "architectures": ["Llama4ForCausalLM"],
    "model_type": "llama4_text",
    "hidden_size": 5120,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 8,
    "attention_chunk_size": 8192,
    "no_rope_layers": [],  # transformers fills it in: every 4th layer without RoPE
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "num_local_experts": 16,
    "vocab_size": 202048,
    "max_position_embeddings": 10485760,
    "torch_dtype": "bfloat16",
}
JAMBA = {
    "architectures": ["JambaForCausalLM"],
    "model_type": "jamba",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "num_experts": 16,
    "intermediate_size": 14336,
    "vocab_size": 65536,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
}


def test_llama_4s_chunked_local_attention_layers_keep_hip(tmp_path):
    """Llama 4's layers with RoPE attend in chunks of 8192 tokens: vLLM builds them on a
    backend derived from ROCM_ATTN's, whose decode stays HIP. All 8 were planned eligible
    (and "only max_model_len keeps HIP" without --max-model-len)."""
    plan = make_plan(model=model_dir(tmp_path, LLAMA4_TEXT), gpu="mi355x", max_model_len=40960)
    groups = {tuple(g.layers): g.reasons for g in plan.layer_groups}
    assert groups == {(0, 1, 2, 4, 5, 6): [plan_module.CHUNKED_LOCAL_ATTENTION], (3, 7): []}
    assert plan.eligible_layers == 2
    plan = make_plan(model=model_dir(tmp_path / "long", LLAMA4_TEXT), gpu="mi355x")
    assert not any(n.startswith("only max_model_len keeps HIP") for n in plan.notes)
    # Without a chunk size (a Llama 4 served with full attention): every layer asm.
    unchunked = LLAMA4_TEXT | {"attention_chunk_size": None}
    plan = make_plan(model=model_dir(tmp_path / "full", unchunked), max_model_len=40960)
    assert plan.eligible_layers == 8


def test_a_hybrid_model_is_planned_on_its_attention_layers_at_hip(tmp_path, capsys):
    """Jamba's 32 layers hold 4 of attention (every 8th from the 5th); vLLM sizes their
    blocks to hold a Mamba state page. All 32 were planned eligible at block 16."""
    model = model_dir(tmp_path, JAMBA)
    plan = make_plan(model=model, gpu="mi355x", max_model_len=4096)
    assert plan.num_layers == 4 and not plan.eligible
    assert plan.reasons == [plan_module.HYBRID_MODEL]
    assert main(["plan", "--model", model, "--max-model-len", "4096"]) == 0
    assert "attention  4 layers; per rank 32 query / 8 KV heads" in capsys.readouterr().out


@pytest.mark.parametrize("layers", [2, -3, 0], ids=["distil", "negative", "zero"])
@pytest.mark.parametrize("d_model", [1280, 2560], ids=["head-64", "head-128"])
def test_an_encoder_decoder_is_refused_as_vllms_rocm_platform_never_picks_rocm_attn(
    tmp_path, capsys, d_model, layers
):
    """Whisper was planned on its decoder's self-attention layers (as eligible, at head
    size 128); but vLLM's ROCm platform drops ROCM_ATTN from the backends it tries for
    an encoder-decoder model (RocmPlatform.get_valid_backends), so no layer of it runs
    ROCM_ATTN's decode. A decoder_layers of -3 ended in an IndexError traceback."""
    model = model_dir(tmp_path, whisper(d_model, decoder_layers=layers))
    line = one_line_exit_2(["plan", "--model", model], capsys)
    assert "whisper is an encoder-decoder model: vLLM's ROCm platform leaves ROCM_ATTN" in line


def test_one_layer_is_said_in_the_singular(tmp_path, capsys):
    model = model_dir(tmp_path, DECODER | {"num_hidden_layers": 1})
    assert main(["plan", "--model", model]) == 0
    assert "attention  1 layer; per rank" in capsys.readouterr().out


def whisper(d_model: int, encoder_layers: int = 32, decoder_layers: int = 2) -> dict:
    """A Whisper config (distil-whisper's layer counts by default): its head counts are
    named encoder_/decoder_attention_heads, not num_attention_heads."""
    return {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "d_model": d_model,
        "encoder_attention_heads": 20,
        "decoder_attention_heads": 20,
        "encoder_layers": encoder_layers,
        "decoder_layers": decoder_layers,
        "vocab_size": 51866,
        "num_mel_bins": 128,
        "max_source_positions": 1500,
        "max_target_positions": 448,
        "torch_dtype": "bfloat16",
    }


def test_an_index_without_its_shards_plans_from_the_config_and_says_so(tmp_path, capsys):
    """A download of the *.json files alone (the index included) plans from config.json,
    and the scales line says why no checkpoint was read. (A checkpoint missing some of
    its shards is refused: test_checkpoint_scales.)"""
    model = model_dir(tmp_path, DECODER)
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert main(["plan", "--model", model]) == 0
    out = capsys.readouterr().out
    assert "1.0 (config only: no shard of model.safetensors.index.json is here" in out, out


@pytest.mark.parametrize(
    ("config", "args", "says"),
    [
        (
            DECODER | {"num_attention_heads": 10**9, "num_key_value_heads": 10**9},
            [],
            "config.json: num_key_value_heads 1000000000 gives 1000000000 KV heads per rank "
            "of head size 128 in 4 layers: one block of 16 tokens (ROCM_ATTN's smallest) "
            "takes",
        ),
        (
            DECODER | {"num_attention_heads": 10**9, "num_key_value_heads": 10**9},
            ["--block-size", "32", "--gpu", "mi300x"],
            "num_key_value_heads 1000000000 gives 1000000000 KV heads per rank",
        ),
        (  # without a KV head count: as many as the heads
            {k: v for k, v in DECODER.items() if k != "num_key_value_heads"}
            | {"num_attention_heads": 10**9},
            [],
            "config.json: num_attention_heads 1000000000 gives 1000000000 KV heads per rank",
        ),
    ],
    ids=["default-block", "block-size-given", "no-kv-head-count"],
)
def test_a_config_no_gpu_holds_a_block_of_names_its_heads_not_an_option(
    tmp_path, config, args, says, capsys
):
    line = one_line_exit_2(["plan", "--model", model_dir(tmp_path, config), *args], capsys)
    assert says in line and "--block-size" not in line, line
    # 15259 GiB per rank at 10**9 KV heads: 238 GiB at -tp 64 fits the MI355X only.
    fits = "--gpu" not in args
    assert line.endswith("; -tp 64 would fit it") is fits, line
    # 2**16 KV heads x 128 dims x K and V x 1024 layers x 16 tokens: 512 GiB per rank
    # in bf16, 256 in fp8, 128 in fp8 at -tp 2: the config was blamed, options fit it.
    wide = config | {"num_hidden_layers": 1024, "hidden_size": 2**23}
    wide |= {"num_attention_heads": 2**16} | (
        {"num_key_value_heads": 2**16} if "num_key_value_heads" in config else {}
    )
    cmd = ["plan", "--model", model_dir(tmp_path / "wide", wide), "--gpu", "mi300x", *args[:2]]
    line = one_line_exit_2([*cmd, "--kv-cache-dtype", "auto"], capsys)
    assert line.endswith("; -tp 2 with --kv-cache-dtype fp8 would fit it"), line  # 128 GiB


def test_vllms_reading_of_a_config_no_gpu_holds_a_block_of_names_its_heads(tmp_path):
    """A model type judged only from vLLM's reading (not a plain decoder) gets the same."""
    config = {
        "architectures": ["GemmaForCausalLM"],
        "model_type": "gemma",
        "hidden_size": 1024,
        "head_dim": 128,
        "num_attention_heads": 10**9,
        "num_key_value_heads": 10**9,
        "num_hidden_layers": 4,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }
    with pytest.raises(InputError) as info:
        make_plan(model=model_dir(tmp_path, config), gpu="mi300x")
    message = str(info.value)
    assert "as vLLM reads it, gives 1000000000 KV heads per rank of head size 128" in message
    assert "--block-size" not in message and "MI300X's 192 GiB" in message, message
    assert not message.endswith("would fit it"), message  # 10**9 KV heads: nothing fits
    # 2**16 KV heads x 128 x 1024 layers: one block of 16 tokens is 256 GiB per rank in
    # fp8, 512 GiB in bf16. The config was blamed where options would fit it.
    config |= {"num_attention_heads": 2**16, "num_key_value_heads": 2**16}
    config |= {"hidden_size": 2**23, "num_hidden_layers": 1024}
    for args, fix in (
        (dict(gpu="mi355x", kv_cache_dtype="auto"), "--kv-cache-dtype fp8"),  # 256 <= 288
        (dict(gpu="mi300x"), "-tp 2"),  # 128 <= 192
        (dict(gpu="mi300x", kv_cache_dtype="auto"), "-tp 2 with --kv-cache-dtype fp8"),
        (dict(gpu="mi300x", kv_cache_dtype="auto", tensor_parallel_size=2), "--kv-cache-dtype fp8"),
    ):
        with pytest.raises(InputError) as info:
            make_plan(model=model_dir(tmp_path / "wide", config), **args)
        assert str(info.value).endswith(f"GiB; {fix} would fit it"), (args, str(info.value))


@pytest.mark.parametrize(
    ("size", "heads", "kv_heads", "tp", "dtype", "fix"),
    [
        (512, 64, 64, 1, "auto", "--kv-cache-dtype fp8"),
        (512, 64, 64, 1, "fp8", "-tp 2"),
        (1024, 64, 64, 1, "fp8", "-tp 4"),
        (1024, 64, 64, 1, "auto", "-tp 2 with --kv-cache-dtype fp8"),  # not -tp 4: bf16
        (512, 48, 48, 1, "fp8", "-tp 2"),
        (768, 48, 48, 1, "fp8", "-tp 3"),  # the fewest ranks that split 48 heads
        (1280, 40, 40, 1, "fp8", "-tp 5"),  # not 3 or 4: they do not split 40 heads
        (512, 64, 1, 1, "fp8", ""),  # one KV head is replicated, never split
        (512, 64, 8, 8, "fp8", ""),  # one KV head per rank already
        (2**10 * 65, 2**10, 2**10, 1, "fp8", ""),  # past 64 ranks
    ],
)
def test_smaller_block_fix_proposes_what_fits(size, heads, kv_heads, tp, dtype, fix):
    from vllm_rocm_asm_decode.tools.choices import smaller_block_fix

    assert smaller_block_fix(size, 256, heads, kv_heads, tp, dtype) == fix


def test_a_state_space_model_is_said_to_have_no_attention_layers(tmp_path, capsys):
    mamba = {
        "architectures": ["MambaForCausalLM"],
        "model_type": "mamba",
        "hidden_size": 768,
        "state_size": 16,
        "num_hidden_layers": 4,
        "vocab_size": 1000,
        "torch_dtype": "bfloat16",
    }
    line = one_line_exit_2(["plan", "--model", model_dir(tmp_path / "mamba", mamba)], capsys)
    assert "has no attention fields (num_attention_heads) but a state size (state_size)" in line
    assert "no attention layers, so ROCM_ATTN and its asm decode do not apply" in line, line
    # Mamba2 counts its SSM heads as num_heads: vLLM's reading says it is attention-free.
    mamba2 = mamba | {
        "architectures": ["Mamba2ForCausalLM"],
        "model_type": "mamba2",
        "hidden_size": 2048,
        "num_heads": 64,
        "head_dim": 64,
        "n_groups": 1,
    }
    line = one_line_exit_2(["plan", "--model", model_dir(tmp_path / "mamba2", mamba2)], capsys)
    assert "mamba2 has no attention layers (vLLM serves it attention-free)" in line, line


def test_one_kv_head_is_one_kv_head(tmp_path, capsys):
    model = model_dir(tmp_path, DECODER | {"num_key_value_heads": 1})
    assert main(["plan", "--model", model, "--gpu", "mi355x"]) == 0
    out = capsys.readouterr().out
    assert f"per rank {DECODER['num_attention_heads']} query / 1 KV head (GQA " in out, out
