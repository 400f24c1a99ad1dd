"""Reading a checkpoint's per-layer KV-cache scales from its safetensors headers.

Every checkpoint here is written in ``tmp_path`` with ``safetensors.torch.save_file``; the
expected scales are the literals written, all exactly representable in the stored dtype.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors
import torch
from safetensors.torch import save_file

from vllm_rocm_asm_decode.tools.checkpoint_scales import (
    CheckpointError,
    KvScales,
    checkpoint_format,
    layer_scales,
    load_problem,
    read_kv_scales,
)

K = [0.5, 0.25, 0.125]  # layer 0, 1, 2
V = [0.75, 0.375, 0.1875]


def weights(layers: int = 3, prefix: str = "model.layers") -> dict[str, torch.Tensor]:
    """A weight beside the scales of every layer: the reader must leave them alone."""
    return {f"{prefix}.{i}.self_attn.k_proj.weight": torch.ones(4, 4) for i in range(layers)}


def write(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return path


def write_index(model_dir: Path, shards: dict[str, dict[str, torch.Tensor]]) -> None:
    """Write the shards and a ``model.safetensors.index.json`` mapping every name to its shard."""
    weight_map = {}
    for file, tensors in shards.items():
        write(model_dir / file, tensors)
        weight_map.update(dict.fromkeys(tensors, file))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))


def corrupt(path: Path) -> Path:
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header")
    return path


# (k name, v name) patterns of each scheme; {i} is the layer index.
SCHEMES = {
    "plain self_attn.k_scale": (
        "model.layers.{i}.self_attn.k_scale",
        "model.layers.{i}.self_attn.v_scale",
    ),
    "vllm self_attn.attn.k_scale": (
        "model.layers.{i}.self_attn.attn.k_scale",
        "model.layers.{i}.self_attn.attn.v_scale",
    ),
    "compressed-tensors/quark k_proj.output_scale": (
        "model.layers.{i}.self_attn.k_proj.output_scale",
        "model.layers.{i}.self_attn.v_proj.output_scale",
    ),
    "modelopt k_proj.k_scale": (
        "model.layers.{i}.self_attn.k_proj.k_scale",
        "model.layers.{i}.self_attn.v_proj.v_scale",
    ),
    "fused qkv_proj.k_scale": (
        "model.layers.{i}.self_attn.qkv_proj.k_scale",
        "model.layers.{i}.self_attn.qkv_proj.v_scale",
    ),
    "gpt2-style h.N.attn.k_scale": (
        "transformer.h.{i}.attn.k_scale",
        "transformer.h.{i}.attn.v_scale",
    ),
}


@pytest.mark.parametrize("shape", [(), (1,)], ids=["scalar", "one-element"])
@pytest.mark.parametrize("scheme", list(SCHEMES), ids=list(SCHEMES))
def test_each_naming_scheme_gives_distinct_per_layer_scales(tmp_path, scheme, shape):
    k_name, v_name = SCHEMES[scheme]
    tensors = weights()
    for i in range(3):
        tensors[k_name.format(i=i)] = torch.full(shape, K[i])
        tensors[v_name.format(i=i)] = torch.full(shape, V[i])
    write(tmp_path / "model.safetensors", tensors)

    scales = read_kv_scales(tmp_path)

    assert scales == KvScales(
        k={0: 0.5, 1: 0.25, 2: 0.125},
        v={0: 0.75, 1: 0.375, 2: 0.1875},
        files=("model.safetensors",),
    )


def test_scales_stored_in_bf16_are_read_as_floats(tmp_path):
    write(
        tmp_path / "model.safetensors",
        {
            "model.layers.0.self_attn.k_scale": torch.tensor(0.375, dtype=torch.bfloat16),
            "model.layers.0.self_attn.v_scale": torch.tensor(1.5, dtype=torch.bfloat16),
        },
    )
    scales = read_kv_scales(tmp_path)
    assert scales is not None
    assert scales.k == {0: 0.375}
    assert scales.v == {0: 1.5}


def test_deprecated_kv_scale_is_the_k_scale_and_vllm_copies_it_to_v(tmp_path):
    tensors = weights()
    for i in range(3):
        tensors[f"model.layers.{i}.self_attn.kv_scale"] = torch.tensor(K[i])
    write(tmp_path / "model.safetensors", tensors)

    scales = read_kv_scales(tmp_path)

    assert scales is not None
    assert scales.k == {0: 0.5, 1: 0.25, 2: 0.125}
    assert scales.v == {}
    assert layer_scales(scales, 3) == [(0.5, 0.5), (0.25, 0.25), (0.125, 0.125)]


def test_query_probability_and_zero_point_scales_are_not_kv_scales(tmp_path):
    tensors = weights(1)
    tensors["model.layers.0.self_attn.q_scale"] = torch.tensor(8.0)
    tensors["model.layers.0.self_attn.q_proj.output_scale"] = torch.tensor(8.0)
    tensors["model.layers.0.self_attn.prob_output_scale"] = torch.tensor(8.0)
    tensors["model.layers.0.self_attn.k_zero_point"] = torch.tensor(8.0)
    tensors["model.layers.0.self_attn.k_proj.input_scale"] = torch.tensor(8.0)
    tensors["model.layers.0.self_attn.k_proj.weight_scale"] = torch.tensor(8.0)
    write(tmp_path / "model.safetensors", tensors)
    assert read_kv_scales(tmp_path) is None

    tensors["model.layers.0.self_attn.k_scale"] = torch.tensor(0.5)
    tensors["model.layers.0.self_attn.v_scale"] = torch.tensor(0.75)
    write(tmp_path / "model.safetensors", tensors)
    assert read_kv_scales(tmp_path) == KvScales(
        k={0: 0.5}, v={0: 0.75}, files=("model.safetensors",)
    )


def test_a_checkpoint_without_scales_gives_none(tmp_path):
    write(tmp_path / "model.safetensors", weights())
    assert checkpoint_format(tmp_path) == "safetensors"
    assert read_kv_scales(tmp_path) is None


def test_only_the_scale_tensors_are_fetched(tmp_path, monkeypatch):
    tensors = weights()
    tensors["model.layers.0.self_attn.k_scale"] = torch.tensor(0.5)
    tensors["model.layers.0.self_attn.v_scale"] = torch.tensor(0.75)
    write(tmp_path / "model.safetensors", tensors)
    fetched: list[str] = []
    real_open = safetensors.safe_open

    class Spy:
        def __init__(self, *args, **kwargs):
            self._f = real_open(*args, **kwargs)

        def __enter__(self):
            self._inner = self._f.__enter__()
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)

        def keys(self):
            return self._inner.keys()

        def get_tensor(self, name):
            fetched.append(name)
            return self._inner.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    assert read_kv_scales(tmp_path) is not None
    assert sorted(fetched) == [
        "model.layers.0.self_attn.k_scale",
        "model.layers.0.self_attn.v_scale",
    ]


def test_sharded_without_index_names_only_the_files_with_scales(tmp_path):
    write(tmp_path / "model-00001-of-00002.safetensors", weights())
    write(
        tmp_path / "model-00002-of-00002.safetensors",
        {
            "model.layers.2.self_attn.k_scale": torch.tensor(0.125),
            "model.layers.2.self_attn.v_scale": torch.tensor(0.1875),
        },
    )
    assert read_kv_scales(tmp_path) == KvScales(
        k={2: 0.125}, v={2: 0.1875}, files=("model-00002-of-00002.safetensors",)
    )


def sharded_with_scales_in_second_shard(model_dir: Path) -> None:
    write_index(
        model_dir,
        {
            "model-00001-of-00002.safetensors": weights(),
            "model-00002-of-00002.safetensors": {
                "model.layers.0.self_attn.k_scale": torch.tensor(0.5),
                "model.layers.0.self_attn.v_scale": torch.tensor(0.75),
                "model.layers.1.self_attn.k_scale": torch.tensor(0.25),
                "model.layers.1.self_attn.v_scale": torch.tensor(0.375),
            },
        },
    )


def test_index_opens_only_the_shards_it_says_hold_scales(tmp_path):
    sharded_with_scales_in_second_shard(tmp_path)
    # Corrupt both a shard without scales and a file the index does not list: neither is
    # opened, so neither can break the read.
    corrupt(tmp_path / "model-00001-of-00002.safetensors")
    corrupt(tmp_path / "consolidated.safetensors")

    assert read_kv_scales(tmp_path) == KvScales(
        k={0: 0.5, 1: 0.25},
        v={0: 0.75, 1: 0.375},
        files=("model-00002-of-00002.safetensors",),
    )


def test_without_the_index_every_safetensors_file_is_opened(tmp_path):
    """The counterpart of the test above: the same corrupt file breaks the read here."""
    sharded_with_scales_in_second_shard(tmp_path)
    corrupt(tmp_path / "consolidated.safetensors")
    (tmp_path / "model.safetensors.index.json").unlink()
    with pytest.raises(CheckpointError, match=r"consolidated\.safetensors"):
        read_kv_scales(tmp_path)


def test_index_without_scale_names_gives_none_without_opening_shards(tmp_path):
    write_index(tmp_path, {"model.safetensors": weights()})
    corrupt(tmp_path / "model.safetensors")
    assert read_kv_scales(tmp_path) is None


def test_a_shard_named_by_the_index_but_absent_is_an_error(tmp_path):
    sharded_with_scales_in_second_shard(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(
        CheckpointError, match=r"model-00002-of-00002\.safetensors .*does not exist"
    ):
        read_kv_scales(tmp_path)


@pytest.mark.parametrize("gone", ["first", "both"], ids=["shard-without-scales", "json-only"])
def test_a_shard_the_index_names_is_needed_whether_it_holds_scales_or_not(tmp_path, gone):
    """(trial 17) vLLM loads every shard the index names: one that is not there is named,
    not passed over because it holds no scale. (Where none is there, ``plan`` never reads
    the checkpoint: a download of the *.json files alone plans from config.json.)"""
    sharded_with_scales_in_second_shard(tmp_path)
    (tmp_path / "model-00001-of-00002.safetensors").unlink()
    if gone == "both":
        (tmp_path / "model-00002-of-00002.safetensors").unlink()
    if gone == "both":  # the *.json files alone: config only
        assert checkpoint_format(tmp_path) == "none" and read_kv_scales(tmp_path) is None
        return
    assert checkpoint_format(tmp_path) == "safetensors"
    missing = tmp_path / "model-00001-of-00002.safetensors"
    with pytest.raises(CheckpointError) as info:
        read_kv_scales(tmp_path)
    assert str(info.value).startswith(
        f"{missing} (listed in model.safetensors.index.json) does not exist: the checkpoint "
        "is incomplete; download the shard, or keep only the *.json files"
    ), info.value


def test_a_corrupt_index_is_an_error_naming_it(tmp_path):
    sharded_with_scales_in_second_shard(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json"):
        read_kv_scales(tmp_path)


@pytest.mark.parametrize(
    "text",
    ['{"weight_map": 5}', '["weight_map"]', "{}", '{"weight_map": {"a": 1}}'],
    ids=["a-number", "a-list", "none", "a-file-number"],
)
def test_an_index_without_a_weight_map_says_so_in_plain_words(tmp_path, text):
    """(trial 16) It said "'int' object has no attribute 'items'"."""
    sharded_with_scales_in_second_shard(tmp_path)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(text)
    with pytest.raises(CheckpointError) as info:
        read_kv_scales(tmp_path)
    assert str(info.value) == (f"{index} holds no weight_map of tensor names to file names")


def test_a_corrupt_safetensors_file_is_a_one_line_error_naming_it(tmp_path):
    write(tmp_path / "model-00001-of-00002.safetensors", weights())
    bad = corrupt(tmp_path / "model-00002-of-00002.safetensors")
    with pytest.raises(CheckpointError) as info:
        read_kv_scales(tmp_path)
    message = str(info.value)
    assert str(bad) in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "files, expected",
    [
        (["pytorch_model.bin"], "pytorch-bin"),
        (["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"], "pytorch-bin"),
        (["model.pt"], "pytorch-bin"),
        (["training_args.bin"], "none"),  # a training leftover, not weights
        ([], "none"),
    ],
    ids=["bin", "sharded-bin", "pt", "training-args-only", "empty"],
)
def test_non_safetensors_checkpoints_give_none_and_say_their_format(tmp_path, files, expected):
    (tmp_path / "config.json").write_text("{}")
    for name in files:
        torch.save({"model.layers.0.self_attn.k_scale": torch.tensor(0.5)}, tmp_path / name)
    assert checkpoint_format(tmp_path) == expected
    assert read_kv_scales(tmp_path) is None


def test_safetensors_win_over_bin_files_beside_them(tmp_path):
    torch.save({}, tmp_path / "pytorch_model.bin")
    write(tmp_path / "model.safetensors", {"model.layers.0.self_attn.k_scale": torch.tensor(0.5)})
    assert checkpoint_format(tmp_path) == "safetensors"
    assert read_kv_scales(tmp_path) == KvScales(k={0: 0.5}, v={}, files=("model.safetensors",))


def test_a_per_head_scale_gives_its_maximum(tmp_path):
    # llm-compressor's attn_head strategy stores [num_kv_heads, 1, 1].
    write(
        tmp_path / "model.safetensors",
        {
            "model.layers.0.self_attn.k_scale": torch.tensor([0.25, 0.75, 0.5]).view(3, 1, 1),
            "model.layers.0.self_attn.v_scale": torch.tensor([2.0, 0.5, 1.0]).view(3, 1, 1),
        },
    )
    scales = read_kv_scales(tmp_path)
    assert scales is not None
    assert scales.k == {0: 0.75}
    assert scales.v == {0: 2.0}


def test_an_empty_scale_tensor_is_an_error(tmp_path):
    write(tmp_path / "model.safetensors", {"model.layers.0.self_attn.k_scale": torch.zeros(0)})
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.self_attn\.k_scale is empty"):
        read_kv_scales(tmp_path)


def test_two_different_k_scales_for_one_layer_are_an_error(tmp_path):
    write(
        tmp_path / "model.safetensors",
        {
            "model.layers.1.self_attn.k_scale": torch.tensor(0.5),
            "model.layers.1.self_attn.kv_scale": torch.tensor(0.25),
        },
    )
    with pytest.raises(CheckpointError, match="layer 1 has two k scales"):
        read_kv_scales(tmp_path)


def test_a_scale_without_a_layer_index_is_an_error(tmp_path):
    write(tmp_path / "model.safetensors", {"model.self_attn.k_scale": torch.tensor(0.5)})
    with pytest.raises(CheckpointError, match=r"KV scale model\.self_attn\.k_scale does not name"):
        read_kv_scales(tmp_path)


def test_layer_scales_fills_missing_layers_with_one():
    scales = KvScales(k={0: 0.5, 2: 0.125}, v={0: 0.75, 2: 0.1875}, files=("m.safetensors",))
    assert layer_scales(scales, 4) == [(0.5, 0.75), (1.0, 1.0), (0.125, 0.1875), (1.0, 1.0)]


def test_layer_scales_without_a_checkpoint_scale_is_all_one():
    assert layer_scales(None, 3) == [(1.0, 1.0), (1.0, 1.0), (1.0, 1.0)]


def test_layer_scales_one_sided_layers_follow_vllm():
    # K alone: vLLM's KV-cache method uses it for V too; V alone: K stays 1.0.
    scales = KvScales(k={0: 0.5}, v={1: 0.375}, files=("m.safetensors",))
    assert layer_scales(scales, 2) == [(0.5, 0.5), (1.0, 0.375)]


def test_layer_scales_drops_layers_beyond_the_model():
    scales = KvScales(k={0: 0.5, 3: 0.25}, v={0: 0.75, 3: 0.375}, files=("m.safetensors",))
    assert layer_scales(scales, 2) == [(0.5, 0.75), (1.0, 1.0)]


# --------------------------------------------------------------------------------------
# Issue 21, items 20 and 22: scales vLLM cannot use, and files that are not files


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), float("-inf"), 0.0, -0.5],
    ids=["nan", "inf", "minus-inf", "zero", "negative"],
)
@pytest.mark.parametrize("side", ["k", "v"])
def test_a_scale_that_is_not_finite_and_above_zero_is_an_error(tmp_path, value, side):
    good = {"k": 0.5, "v": 0.75}
    good[side] = value
    write(
        tmp_path / "model.safetensors",
        {f"model.layers.0.self_attn.{s}_scale": torch.tensor(x) for s, x in good.items()},
    )
    with pytest.raises(CheckpointError) as info:
        read_kv_scales(tmp_path)
    message = str(info.value)
    assert f"KV scale model.layers.0.self_attn.{side}_scale holds {value}" in message
    assert "a KV scale must be a finite number above 0" in message and "\n" not in message


def test_one_bad_head_of_a_per_head_scale_is_an_error(tmp_path):
    write(
        tmp_path / "model.safetensors",
        {"model.layers.0.self_attn.k_scale": torch.tensor([0.5, float("nan"), 0.25])},
    )
    with pytest.raises(CheckpointError, match="holds nan"):
        read_kv_scales(tmp_path)


def test_two_nan_scales_for_one_layer_are_named_as_nan_not_as_two(tmp_path):
    write(
        tmp_path / "model.safetensors",
        {
            "model.layers.1.self_attn.k_scale": torch.tensor(float("nan")),
            "model.layers.1.self_attn.kv_scale": torch.tensor(float("nan")),
        },
    )
    with pytest.raises(CheckpointError) as info:
        read_kv_scales(tmp_path)
    assert "holds nan" in str(info.value) and "two k scales" not in str(info.value)


FP8 = {"quant_method": "fp8"}
CT_TENSOR = {
    "quant_method": "compressed-tensors",
    "kv_cache_scheme": {"type": "float", "num_bits": 8, "strategy": "tensor", "symmetric": True},
}
CT_HEAD = CT_TENSOR | {"kv_cache_scheme": CT_TENSOR["kv_cache_scheme"] | {"strategy": "attn_head"}}


@pytest.mark.parametrize("shape", [(8,), (2, 2)], ids=["8", "2x2"])
@pytest.mark.parametrize(
    ("quantization", "refused"),
    [(FP8, True), (CT_TENSOR, True), (CT_HEAD, False)],
    ids=["fp8", "compressed-tensor", "compressed-attn-head"],
)
def test_per_head_scales_load_only_under_compressed_tensors_attn_head(
    tmp_path, shape, quantization, refused
):
    write(
        tmp_path / "model.safetensors",
        {
            "model.layers.0.self_attn.k_scale": torch.full(shape, 0.5),
            "model.layers.0.self_attn.v_scale": torch.full(shape, 0.25),
        },
    )
    scales = read_kv_scales(tmp_path)
    assert scales is not None and scales.k == {0: 0.5}
    problem = load_problem(scales, quantization)
    if refused:
        assert problem is not None
        assert f"KV scale model.layers.0.self_attn.k_scale has shape {list(shape)}" in problem
        assert "refuses it at load" in problem
    else:
        assert problem is None


@pytest.mark.parametrize(
    ("quantization", "refused"),
    [(FP8, True), ({"quant_method": "quark"}, True), (CT_TENSOR, False)],
    ids=["fp8", "quark", "compressed-tensors"],
)
def test_a_v_scale_without_its_k_loads_only_under_compressed_tensors(
    tmp_path, quantization, refused
):
    write(tmp_path / "model.safetensors", {"model.layers.2.self_attn.v_scale": torch.tensor(0.5)})
    scales = read_kv_scales(tmp_path)
    assert scales is not None and scales.k == {} and scales.v == {2: 0.5}
    problem = load_problem(scales, quantization)
    if refused:
        assert problem is not None and problem.startswith("layer 2 has a V scale but no K scale")
    else:
        assert problem is None
        assert layer_scales(scales, 3)[2] == (1.0, 0.5)


def test_per_tensor_scales_of_both_sides_load_everywhere(tmp_path):
    write(
        tmp_path / "model.safetensors",
        {
            "model.layers.0.self_attn.k_scale": torch.tensor(0.5),
            "model.layers.0.self_attn.v_scale": torch.tensor(0.25),
        },
    )
    scales = read_kv_scales(tmp_path)
    assert scales is not None
    for quantization in (FP8, CT_TENSOR, CT_HEAD, {"quant_method": "modelopt"}):
        assert load_problem(scales, quantization) is None


def test_an_index_entry_naming_the_model_directory_says_so(tmp_path):
    sharded_with_scales_in_second_shard(tmp_path)
    index = tmp_path / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["model.layers.0.self_attn.k_scale"] = "."
    index.write_text(json.dumps(data))
    with pytest.raises(CheckpointError) as info:
        read_kv_scales(tmp_path)
    message = str(info.value)
    assert "a directory, not a safetensors file" in message and "does not exist" not in message
    assert "model.layers.0.self_attn.k_scale" in message


def test_a_safetensors_name_that_is_a_directory_says_so(tmp_path):
    (tmp_path / "model.safetensors").mkdir()
    with pytest.raises(CheckpointError) as info:
        read_kv_scales(tmp_path)
    message = str(info.value)
    assert message == f"{tmp_path / 'model.safetensors'} is a directory, not a safetensors file"


def test_a_fifo_named_like_a_safetensors_file_is_refused_not_read(tmp_path):
    import os

    os.mkfifo(tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors is not a regular file"):
        read_kv_scales(tmp_path)


def test_a_scale_of_ten_million_elements_is_checked_in_one_pass(tmp_path):
    """Every element is checked (one NaN among ten million is found), without a Python
    loop over them (that took minutes)."""
    import time

    big = torch.ones(10_000_000)
    big[7_654_321] = float("nan")
    write(tmp_path / "model.safetensors", {"model.layers.0.self_attn.k_scale": big})
    began = time.monotonic()
    with pytest.raises(CheckpointError, match=r"k_scale holds nan"):
        read_kv_scales(tmp_path)
    assert time.monotonic() - began < 10


def test_an_unreadable_checkpoint_file_is_named_with_the_systems_reason(tmp_path, monkeypatch):
    """safetensors reports a file it may not open as missing (ENOENT): the reader asks the
    system first, so the line says why (here as a non-root user would see it)."""
    from vllm_rocm_asm_decode.tools import checkpoint_scales

    path = write(
        tmp_path / "model.safetensors", {"model.layers.0.self_attn.k_scale": torch.tensor(0.5)}
    )

    def refuse(file, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(file))

    monkeypatch.setattr(checkpoint_scales, "open", refuse, raising=False)
    with pytest.raises(CheckpointError) as raised:
        read_kv_scales(tmp_path)
    assert str(raised.value) == f"cannot read {path}: Permission denied"
