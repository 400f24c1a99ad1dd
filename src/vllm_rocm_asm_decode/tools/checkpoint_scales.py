"""Per-layer fp8 KV-cache scales of a local Hugging Face checkpoint, read without its weights.

vLLM's shared ``AsmKvScaleTables`` hold one fp32 table per distinct scale value, so a
checkpoint with calibrated per-layer KV scales costs one K and one V table per layer,
while a checkpoint without them shares one table at scale 1.0. :func:`read_kv_scales`
gives ``plan`` the scales to count those tables.

Only ``*.safetensors`` checkpoints are read: ``safe_open`` parses the header, and only the
scale tensors themselves are fetched. Which tensor names are KV scales, and what vLLM
calls them, comes from vLLM's own cache-scale name mapper
(``Fp8Config.get_cache_scale_mapper()``); the layer index from vLLM's
``extract_layer_index``. Nothing here touches a GPU.

What the numbers mean (vLLM 0.33):

- Scales are given as stored. On fp8 "fnuz" GPUs (gfx942) vLLM doubles the per-tensor
  scales of fp8, Quark and ModelOpt checkpoints when loading; doubling every value keeps
  the number of distinct values, which is what the table count depends on.
- vLLM uses KV scales only when the checkpoint is quantized (``config.json`` has a
  ``quantization_config``); otherwise it keeps 1.0 whatever the files hold. Checking that
  is the caller's business.
- A scale that is not a finite number above 0 (NaN, inf, 0, negative) is refused here:
  vLLM stops loading on some (a NaN or non-positive K), quietly reads a negative pair
  as absent (1.0) and would quantize with the rest; none is a calibrated scale.
- What vLLM refuses at load is checked by :func:`load_problem` against the
  checkpoint's ``quantization_config``: one scale per tensor outside compressed-tensors'
  ``attn_head`` strategy, and a V scale without its K outside compressed-tensors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.model_executor.models.utils import WeightsMapper

#: The Hugging Face index of a sharded safetensors checkpoint (transformers'
#: ``SAFE_WEIGHTS_INDEX_NAME``, the index vLLM's loader reads).
INDEX_NAME = "model.safetensors.index.json"

#: vLLM's names of the attention layer's KV-cache scales, after its name mapper.
_SIDES = {".attn.k_scale": "k", ".attn.v_scale": "v"}


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, or scales that cannot be told apart by layer.

    The message is one line and names the file (or the tensors) concerned.
    """


@dataclass(frozen=True)
class KvScales:
    """Per-layer KV-cache scales read from a checkpoint.

    ``k`` and ``v`` map a decoder layer index to its scale as stored (a layer absent from
    a map has no such scale in the checkpoint); ``files`` are the names, relative to the
    model directory, of the files the scales came from.
    """

    k: dict[int, float]
    v: dict[int, float]
    files: tuple[str, ...]
    #: ``(name, shape)`` of each scale tensor of more than one element (per head).
    per_head: tuple[tuple[str, tuple[int, ...]], ...] = ()


@lru_cache(maxsize=1)
def _cache_scale_mapper() -> WeightsMapper:
    """vLLM's mapping of checkpoint KV-scale names to ``....attn.{q,k,v}_scale``.

    ``Fp8Config``'s mapper is the general one (deprecated ``.kv_scale``, ModelOpt
    ``.{k,v}_proj.{k,v}_scale``, fused ``qkv_proj``, plain ``.{k,v}_scale``, ...) plus the
    compressed-tensors/Quark ``{k,v}_proj.output_scale`` suffixes; it is what
    ``AutoWeightsLoader`` applies to the weight stream of Llama, Qwen and most other
    decoders. Its regexes are those of ``maybe_remap_kv_scale_name``, which per-model
    loaders call instead; that function is therefore not needed on top.
    """
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    return Fp8Config.get_cache_scale_mapper()


def _kv_scale_target(name: str) -> tuple[str, int] | None:
    """``("k" | "v", layer index)`` for a checkpoint name vLLM loads as a KV-cache scale.

    A deprecated ``.kv_scale`` counts as the K scale, as vLLM maps it (see
    :func:`layer_scales` for V). Query, probability and zero-point scales are not KV scales.
    """
    mapped = _cache_scale_mapper().map_name(name)
    if mapped is None:
        return None
    for suffix, side in _SIDES.items():
        if mapped.endswith(suffix):
            from vllm.model_executor.models.utils import extract_layer_index

            module = mapped[: -len(suffix)]
            try:
                return side, extract_layer_index(module)
            except (AssertionError, IndexError):
                raise CheckpointError(
                    f"KV scale {name} does not name exactly one decoder layer"
                ) from None
    return None


def checkpoint_format(model_dir: Path) -> str:
    """The weight format vLLM's loader would pick in ``model_dir``.

    ``"safetensors"`` when any ``*.safetensors`` file is present (vLLM prefers them);
    else ``"pytorch-bin"`` for ``*.bin`` or ``*.pt`` weights (training leftovers such as
    ``optimizer.pt`` do not count), whose scales :func:`read_kv_scales` does not read
    because that would load the whole file; else ``"none"`` (a download of the ``*.json``
    files alone, a sharded checkpoint's index included, plans from ``config.json``).
    """
    from vllm.model_executor.model_loader.weight_utils import (
        filter_files_not_needed_for_inference,
    )

    model_dir = Path(model_dir)
    if any(model_dir.glob("*.safetensors")):
        return "safetensors"
    pytorch = [str(p) for pattern in ("*.bin", "*.pt") for p in model_dir.glob(pattern)]
    if filter_files_not_needed_for_inference(pytorch):
        return "pytorch-bin"
    return "none"


def _files_to_open(model_dir: Path) -> dict[Path, list[str] | None]:
    """Each safetensors file to open, with the scale names to read from it.

    With an index, only the files its ``weight_map`` gives a KV scale, with those names
    (every file it names must be there: vLLM loads them all); without one, every
    ``*.safetensors`` file, its names to be found in its header (None).
    """
    index = model_dir / INDEX_NAME
    if not index.is_file():
        found = sorted(model_dir.glob("*.safetensors"))
        for path in found:
            if path.is_dir():
                raise CheckpointError(f"{path} is a directory, not a safetensors file")
            if not path.is_file():  # a FIFO would never end a read
                raise CheckpointError(f"{path} is not a regular file")
        return dict.fromkeys(found)
    try:
        data = json.loads(index.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {index}: {_first_line(exc)}") from exc
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise CheckpointError(f"{index} holds no weight_map of tensor names to file names")
    entries = list(weight_map.items())
    wanted: dict[Path, list[str]] = {}
    for name, file in entries:
        if _kv_scale_target(name) is not None:
            wanted.setdefault(model_dir / file, []).append(name)
    # Each file the index names, with the first tensor it places there (a scale's when
    # the file holds one): vLLM loads every shard, so a missing one stops its load.
    shards: dict[Path, str] = {path: names[0] for path, names in wanted.items()}
    for name, file in entries:
        shards.setdefault(model_dir / file, name)
    for path, name in shards.items():
        if path.is_dir():
            raise CheckpointError(
                f"{index} places {name} in {path}, a directory, not a safetensors file"
            )
        if not path.exists():
            raise CheckpointError(
                f"{path} (listed in {index.name}) does not exist: the checkpoint is "
                "incomplete; download the shard, or keep only the *.json files to plan "
                "from config.json alone"
            )
        if not path.is_file():
            raise CheckpointError(f"{path} (listed in {index.name}) is not a regular file")
    return {path: names for path, names in wanted.items()}


def read_kv_scales(model_dir: Path) -> KvScales | None:
    """The KV-cache scales of the safetensors checkpoint in ``model_dir``.

    Returns None when it holds none; vLLM then uses 1.0 for every layer. Also None when
    the checkpoint is not safetensors (see :func:`checkpoint_format` for why).

    A scale tensor with more than one element (a compressed-tensors ``attn_head`` scheme,
    one scale per KV head) gives its maximum: that is the single float vLLM's
    compressed-tensors KV method hands the attention backend, the value the scale tables
    are built from. (vLLM's other KV methods refuse such a tensor at load time:
    :func:`load_problem` says so.)

    Raises :class:`CheckpointError` when a file that may hold scales cannot be read (or
    is a directory), when a scale tensor is empty or holds a value that is not a finite
    number above 0, or when one layer is given two different K (or V) scales.
    """
    from safetensors import SafetensorError, safe_open

    model_dir = Path(model_dir)
    if checkpoint_format(model_dir) != "safetensors":
        return None
    found: dict[str, dict[int, tuple[float, str]]] = {"k": {}, "v": {}}
    files: list[str] = []
    per_head: list[tuple[str, tuple[int, ...]]] = []
    for path, names in _files_to_open(model_dir).items():
        try:
            with open(path, "rb"):  # the system's reason (safetensors says ENOENT for EACCES)
                pass
            with safe_open(str(path), framework="pt") as f:
                present = set(f.keys())
                if names is None:
                    names = [n for n in sorted(present) if _kv_scale_target(n) is not None]
                missing = [n for n in names if n not in present]
                if missing:
                    raise CheckpointError(
                        f"{path} lacks {missing[0]}, which {INDEX_NAME} places there"
                    )
                values = {n: f.get_tensor(n) for n in names}
        except (SafetensorError, OSError, RuntimeError) as exc:
            why = getattr(exc, "strerror", None) or _first_line(exc)
            raise CheckpointError(f"cannot read {path}: {why}") from exc
        for name, tensor in values.items():
            if tensor.numel() == 0:
                raise CheckpointError(f"{path}: KV scale {name} is empty")
            flat = tensor.float().flatten()
            bad = flat[~(flat.isfinite() & (flat > 0))]  # one pass, however large
            if bad.numel():
                raise CheckpointError(
                    f"{path}: KV scale {name} holds {float(bad[0])}; a KV scale must be a "
                    "finite number above 0"
                )
            if tensor.numel() > 1:
                per_head.append((name, tuple(tensor.shape)))
            target = _kv_scale_target(name)
            assert target is not None
            side, layer = target
            value = float(flat.max())
            earlier = found[side].get(layer)
            if earlier is not None and earlier[0] != value:
                raise CheckpointError(
                    f"layer {layer} has two {side} scales: {earlier[1]} = {earlier[0]} "
                    f"and {name} = {value}"
                )
            found[side][layer] = (value, name)
        if values:
            files.append(str(path.relative_to(model_dir)))
    if not files:
        return None
    return KvScales(
        k={layer: v for layer, (v, _) in sorted(found["k"].items())},
        v={layer: v for layer, (v, _) in sorted(found["v"].items())},
        files=tuple(sorted(files)),
        per_head=tuple(per_head),
    )


def load_problem(scales: KvScales, quantization: object) -> str | None:
    """What in ``scales`` vLLM 0.33 refuses at load for a checkpoint with this
    ``quantization_config`` (one line), or None.

    Only compressed-tensors' ``attn_head`` strategy loads a scale per KV head; vLLM's
    other KV-cache methods take a tensor of one element and stop on any other shape.
    Only compressed-tensors keeps 1.0 for a K scale that is absent beside a V scale; the
    others stop loading on a V scale without its K.
    """
    config = quantization if isinstance(quantization, dict) else {}
    method = str(config.get("quant_method", "")).lower()
    compressed = method == "compressed-tensors"
    scheme = config.get("kv_cache_scheme")
    strategy = scheme.get("strategy") if isinstance(scheme, dict) else None
    if scales.per_head and not (compressed and strategy == "attn_head"):
        name, shape = scales.per_head[0]
        return (
            f"KV scale {name} has shape {list(shape)}: vLLM loads one scale per tensor for "
            f"{method or 'this'} checkpoints (one per KV head only under compressed-tensors' "
            "attn_head strategy) and refuses it at load"
        )
    if not compressed:
        v_only = sorted(set(scales.v) - set(scales.k))
        if v_only:
            return (
                f"layer {v_only[0]} has a V scale but no K scale: vLLM's KV-cache method for "
                f"{method or 'this'} checkpoints stops loading on that"
            )
    return None


def layer_scales(scales: KvScales | None, num_layers: int) -> list[tuple[float, float]]:
    """``(k_scale, v_scale)`` for layers ``0 .. num_layers - 1`` as vLLM ends up using them.

    vLLM's KV-cache method (vLLM 0.33, fp8/Quark/ModelOpt checkpoints) after loading:

    - both scales given: those two;
    - neither given (or no scales at all): 1.0 and 1.0;
    - only K given, which is what a deprecated ``.kv_scale`` loads as: K for both;
    - only V given: vLLM's fp8 method stops loading on this (:func:`load_problem`);
      compressed-tensors keeps 1.0 for K, which is what is returned.

    (For compressed-tensors checkpoints with only K, vLLM keeps V at 1.0 rather than
    copying K; such checkpoints are not known to exist.) Scales of layers at or beyond
    ``num_layers`` (e.g. multi-token-prediction layers) are left out.
    """
    k = scales.k if scales is not None else {}
    v = scales.v if scales is not None else {}
    out = []
    for layer in range(num_layers):
        if layer in k:
            out.append((k[layer], v.get(layer, k[layer])))
        else:
            out.append((1.0, v.get(layer, 1.0)))
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
