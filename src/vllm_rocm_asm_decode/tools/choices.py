"""What the command line accepts, judged without importing torch or vLLM: GPUs, presets,
dtypes, model directories, numbers. Every error here is one line (:class:`InputError`)."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
DEFAULT_PRESET = "qwen3-14b-fp8"


@dataclass(frozen=True)
class Gpu:
    name: str
    arch: str
    compute_units: int


GPUS = {
    "mi300x": Gpu("MI300X", "gfx942", 304),
    "mi325x": Gpu("MI325X", "gfx942", 304),
    "mi355x": Gpu("MI355X", "gfx950", 256),
}
DEFAULT_GPU = "mi355x"

KV_CACHE_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2", "auto", "bfloat16", "float16")
#: vLLM's ``--dtype`` spellings (``half`` and ``float`` are its aliases).
DTYPES = {
    "auto": "auto",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "half": "float16",
    "float32": "float32",
    "float": "float32",
}
#: Names Hugging Face configs give the attention head count. Without one, transformers
#: would fill in its class defaults and the plan would describe a model that isn't there.
HEAD_COUNT_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
#: The longest context ``check accuracy`` and ``bench kernel`` build (the asm decode's
#: envelope, ``max_model_len <= 131072``).
MAX_CONTEXT = 131072
#: The GQA ratios the shipped ultra-precision kernels serve.
MAX_GQA = 8
#: vLLM's ``CUDAGraphMode`` names ``plan --cudagraph-mode`` takes; the first is vLLM's
#: default.
CUDAGRAPH_MODES = ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "FULL", "PIECEWISE", "NONE")


class InputError(ValueError):
    """A problem with the user's input; the CLI prints it as one line and exits 2."""


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def presets() -> list[str]:
    return sorted(p.name for p in PRESETS_DIR.iterdir() if (p / "config.json").is_file())


def resolve_model_dir(model: str) -> tuple[Path, str]:
    """A local directory with a ``config.json`` that names its head count, or a preset.

    A name that is both a preset and a directory with a ``config.json`` here is the
    directory (what the user pointed at); anything written as a path (``/``, ``.``,
    ``~``) is always a path.
    """
    path = Path(model).expanduser()
    if not model.strip():
        raise InputError("--model is empty; give a preset or a local model directory")
    as_path = model.startswith((os.sep, ".", "~")) or os.sep in model
    if model in presets() and not (path / "config.json").is_file() and not as_path:
        return PRESETS_DIR / model, f"preset {model}"
    if path.is_dir():
        config = path / "config.json"
        try:
            raw = json.loads(config.read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read {config}: {first_line(exc)}") from exc
        if not isinstance(raw, dict):
            raise InputError(f"{config} is not a JSON object")
        sections = [raw, *(v for v in raw.values() if isinstance(v, dict))]
        if not any(key in section for section in sections for key in HEAD_COUNT_KEYS):
            raise InputError(f"{config} has no attention fields (num_attention_heads)")
        return path, str(path)
    if path.exists():
        raise InputError(f"--model {model} is a file; give the model's directory (config.json)")
    if model.startswith((os.sep, ".", "~")):
        raise InputError(f"model directory {model} does not exist")
    if "/" in model:
        raise InputError(
            f"--model {model}: only local directories and presets work (plan reads "
            "config.json offline; download the model, then give its directory)"
        )
    raise InputError(f"unknown model preset {model!r}; presets: {', '.join(presets())}")


# --------------------------------------------------------------------------------------
# argparse types: each rejects in one line, before anything heavy is imported


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535)")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number above 0")
    return value


def fraction(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text} must be in (0, 1]")
    return value


def kv_cache_dtype(text: str) -> str:
    if text not in KV_CACHE_DTYPES:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of " + ", ".join(KV_CACHE_DTYPES))
    return text


def dtype(text: str) -> str:
    if text not in DTYPES:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of " + ", ".join(DTYPES))
    return DTYPES[text]


def cudagraph_mode(text: str) -> str:
    mode = text.strip().upper()
    if mode not in CUDAGRAPH_MODES:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of " + ", ".join(CUDAGRAPH_MODES))
    return mode


def int_list(text: str, minimum: int = 1, maximum: int | None = None) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from None
    if not values or min(values) < minimum:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers of at least {minimum}")
    if maximum is not None and max(values) > maximum:
        raise argparse.ArgumentTypeError(f"{text!r}: at most {maximum}")
    return values


def positive_ints(text: str) -> list[int]:
    return int_list(text)


def seeds(text: str) -> list[int]:
    return int_list(text, minimum=0, maximum=2**32 - 1)


def contexts(text: str) -> list[int]:
    return int_list(text, maximum=MAX_CONTEXT)


def nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def http_url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL")
    return text.rstrip("/")


def precision(text: str) -> str:
    if text not in ("uhp", "default"):
        raise argparse.ArgumentTypeError(f"{text!r}: use uhp or default")
    return text


def layouts(text: str) -> list[tuple[int, int]]:
    """``Q/KV,...`` head layouts the asm kernel serves (GQA up to 8)."""
    try:
        pairs = [tuple(int(x) for x in item.split("/")) for item in text.split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or min(p) < 1 or p[0] % p[1] for p in pairs):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give query/KV head pairs such as 40/8,32/8 (query a multiple of KV)"
        )
    too_wide = [f"{q}/{kv}" for q, kv in pairs if q // kv > MAX_GQA]
    if too_wide:
        raise argparse.ArgumentTypeError(
            f"{', '.join(too_wide)}: GQA above {MAX_GQA} has no ultra-precision asm kernel"
        )
    return [(p[0], p[1]) for p in pairs]
