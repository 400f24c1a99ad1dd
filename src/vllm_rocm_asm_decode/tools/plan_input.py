"""What ``plan`` judges from ``--model`` and ``config.json`` before torch or vLLM is
imported: a path the OS can look up, layer counts in every section of the config, the
attention numbers ``plan`` (and vLLM's model classes) compute the softmax scale and soft
cap from, and a checkpoint dtype vLLM's ``--dtype auto`` can serve. Each problem is one
line (:class:`~.choices.InputError`)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

from .choices import (
    GPUS,
    HEAD_COUNT_KEYS,
    KV_HEAD_COUNT_KEYS,
    LAYER_COUNT_KEYS,
    MAX_LAYERS,
    ROCM_ATTN_BLOCK_MULTIPLE,
    InputError,
    _count,
    attention_section,
    cache_too_large,
    heads_text,
    smaller_block_fix,
)

#: The dtypes vLLM runs a model in; ``--dtype auto`` takes the checkpoint's when it is
#: one of them (``float32`` is cast down), and otherwise falls back to the platform's.
MODEL_DTYPES = ("bfloat16", "float16", "half", "float32", "float")
#: Attention numbers models give in ``config.json``: the query scaling of Gemma 2/3
#: (``query_pre_attn_scalar ** -0.5``), Granite's softmax scale, Gemma 2's logit cap.
SCALAR_FIELDS = ("query_pre_attn_scalar", "attention_multiplier", "attn_logit_softcapping")


def check_model_path(model: str) -> None:
    """``--model`` as a path the OS can look up (a name not too long, a ``~user`` that
    exists); a name that is simply absent is left to the caller."""
    try:
        path = Path(model).expanduser()
    except RuntimeError:  # ~user of a user this machine does not have
        user = model[1:].split(os.sep, 1)[0]
        raise InputError(
            f"--model {model}: there is no user {user!r} here, so ~{user} names no directory"
        ) from None
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    except (OSError, ValueError) as exc:  # a name too long, a loop of links, a NUL
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(f"--model {model}: {why}") from None


def _sections(raw: dict) -> list[tuple[str, dict]]:
    """The config's top level and each sub-config in it (``text_config``, ...)."""
    return [("", raw), *((f"{k}.", v) for k, v in raw.items() if isinstance(v, dict))]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_config(model_dir: Path, dtype: str = "auto") -> None:
    """What ``config.json`` alone decides beyond :func:`~.choices.check_model_config`:

    - every layer count, in every section (a LLaVA-style ``text_config`` too), at most
      :data:`~.choices.MAX_LAYERS`;
    - :data:`SCALAR_FIELDS` numbers, finite, ``query_pre_attn_scalar`` above 0 and a
      soft cap not below 0 (a model class would take a string or a negative root);
    - under ``--dtype auto``, a checkpoint dtype vLLM runs models in.
    """
    config = model_dir / "config.json"
    raw = json.loads(config.read_text())
    for prefix, section in _sections(raw):
        for key in LAYER_COUNT_KEYS:
            value = section.get(key)
            if _is_number(value) and value > MAX_LAYERS:
                raise InputError(
                    f"{config}: {prefix}{key} is {value}; no model has more than "
                    f"{MAX_LAYERS} layers"
                )
    quantization = raw.get("quantization_config")
    if quantization is not None and not isinstance(quantization, dict):
        kind = {str: "string", list: "array", bool: "boolean"}.get(type(quantization), "number")
        raise InputError(
            f"{config}: quantization_config is a JSON {kind}; a checkpoint's is an object "
            '(e.g. {"quant_method": "fp8", ...})'
        )
    text = attention_section(raw)
    text_prefix = next((f"{k}." for k, v in raw.items() if v is text), "")
    for key in SCALAR_FIELDS:
        value = text.get(key)
        if value is None:
            continue
        name = f"{config}: {text_prefix}{key} is {json.dumps(value)}"
        if not _is_number(value) or not math.isfinite(value):
            raise InputError(f"{name}; it must be a finite number")
        if key == "query_pre_attn_scalar" and value <= 0:
            raise InputError(f"{name}; it must be above 0 (queries are scaled by its -1/2 power)")
        if key == "attn_logit_softcapping" and value < 0:
            raise InputError(f"{name}; a logit soft cap must be 0 (none) or above")
    if dtype != "auto":
        return
    for prefix, section in (("", raw), (text_prefix, text)):
        for key in ("dtype", "torch_dtype"):
            value = section.get(key)
            if value is None:
                continue
            if not isinstance(value, str) or value not in MODEL_DTYPES:
                raise InputError(
                    f"{config}: {prefix}{key} is {json.dumps(value)}, not a dtype vLLM runs "
                    f"a model in (bfloat16, float16, float32); give --dtype"
                )
            return  # vLLM reads the first it finds


#: Model types whose every counted layer has a full K and V page per block in vLLM's
#: cache (no Mamba, linear-attention or latent-attention layers): for them the cache's
#: size follows from config.json alone.
PLAIN_DECODERS = ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral")


#: The head sizes vLLM's ROCM_ATTN serves (``RocmAttentionBackend.get_supported_head_sizes()``;
#: a unit test holds them equal).
ROCM_ATTN_HEAD_SIZES = (32, 64, 80, 96, 128, 160, 192, 224, 256)


def unserved_head_size(head_size: object, served: Sequence[int]) -> str:
    """The error for a head size ROCM_ATTN does not serve (``served``: the ones it does)."""
    return (
        f"head size {head_size}: vLLM's ROCM_ATTN serves head sizes "
        f"{', '.join(map(str, served))} only, so it would not serve this model"
    )


def _plain_decoder(model_dir: Path) -> tuple[dict, object, object] | None:
    """A plain decoder's attention section, head count and head size (``head_dim``, else
    hidden size over heads, as vLLM reads them for these models); None for other
    models. check_model_config has judged the counts (whole numbers of at least 1)."""
    section = attention_section(json.loads((model_dir / "config.json").read_text()))
    if section.get("model_type") not in PLAIN_DECODERS:
        return None
    found = _count(section, HEAD_COUNT_KEYS)
    heads = found[1] if found else None
    head_dim = section.get("head_dim") or section.get("hidden_size", 0) // (heads or 1)
    return section, heads, head_dim


def check_head_size(model_dir: Path) -> None:
    """A plain decoder's head size that ROCM_ATTN does not serve, judged before vLLM is
    imported; ``plan`` checks every model again from vLLM's own reading."""
    if (plain := _plain_decoder(model_dir)) is None:
        return
    _, heads, head_dim = plain
    # Anything odder (a negative head_dim, a float) is left to vLLM's own reading.
    if (
        isinstance(head_dim, int)
        and head_dim > 0
        and heads
        and head_dim not in ROCM_ATTN_HEAD_SIZES
    ):
        raise InputError(unserved_head_size(head_dim, ROCM_ATTN_HEAD_SIZES))


def check_cache_size(
    model_dir: Path,
    gpu: str | None,
    tensor_parallel_size: int,
    kv_cache_dtype: str,
    block_size: int,
    num_gpu_blocks: int | None,
) -> None:
    """``--num-gpu-blocks`` of a plain decoder's cache larger than the GPU (any supported
    GPU when ``--gpu`` is not given), or without it a ``--block-size`` one block of which
    is, judged before vLLM is imported; ``plan`` checks every model again from vLLM's own
    reading of the config."""
    if (plain := _plain_decoder(model_dir)) is None:
        return
    section, heads, head_dim = plain
    counts = [_count(section, k) for k in (KV_HEAD_COUNT_KEYS, LAYER_COUNT_KEYS)]
    kv_heads, layers = (found[1] if found else None for found in counts)
    if not (heads and layers and isinstance(head_dim, int)):
        return
    per_rank = max(1, (kv_heads or heads) // tensor_parallel_size)
    width = 1 if kv_cache_dtype.startswith("fp8") else 2
    per_token = layers * 2 * per_rank * head_dim * width
    size = (num_gpu_blocks or 1) * block_size * per_token
    the_gpu = GPUS[gpu] if gpu else max(GPUS.values(), key=lambda g: g.memory_gib or 0)
    limit = (the_gpu.memory_gib or 0) * 1024**3
    if (smallest := ROCM_ATTN_BLOCK_MULTIPLE * per_token) > limit:  # the config's doing
        # No KV head count: as many KV heads as heads (check_model_config found those).
        key, count = counts[0] or _count(section, HEAD_COUNT_KEYS) or ("heads", heads)
        model = (
            f"{model_dir / 'config.json'}: {key} {count} gives {heads_text(per_rank, 'KV')} "
            f"per rank of head size {head_dim} in {layers} layers"
        )
        fix = smaller_block_fix(
            smallest, limit, heads, kv_heads or heads, tensor_parallel_size, kv_cache_dtype
        )
        why = cache_too_large(None, block_size, smallest, the_gpu, not gpu, model, fix)
        raise InputError(why)
    if size > limit:
        why = cache_too_large(num_gpu_blocks, block_size, size, the_gpu, any_gpu=not gpu)
        raise InputError(why)
