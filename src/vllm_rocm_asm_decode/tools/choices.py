"""What the command line accepts, judged without importing torch or vLLM: GPUs, presets,
dtypes, model directories, numbers. Every error here is one line (:class:`InputError`)."""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import math
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TypeVar

T = TypeVar("T", bound=Hashable)

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
DEFAULT_PRESET = "qwen3-14b-fp8"


@dataclass(frozen=True)
class Gpu:
    name: str
    arch: str
    compute_units: int
    #: HBM in GiB (None: not known, a live GPU whose memory was not read).
    memory_gib: int | None = None


GPUS = {
    "mi300x": Gpu("MI300X", "gfx942", 304, 192),
    "mi325x": Gpu("MI325X", "gfx942", 304, 256),
    "mi355x": Gpu("MI355X", "gfx950", 256, 288),
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
#: Names encoder-decoder configs (Whisper) give their head counts instead (transformers
#: maps ``num_attention_heads`` to the encoder's): such a config reaches vLLM's reading,
#: and ``plan`` refuses it there for what it is (vLLM's ROCm platform never picks
#: ROCM_ATTN for an encoder-decoder model).
ENCODER_DECODER_HEAD_KEYS = ("decoder_attention_heads", "encoder_attention_heads")
#: Names Hugging Face configs give the KV head count and the layer count.
KV_HEAD_COUNT_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
#: Names state-space (Mamba) configs give the state size: a config with one of them and
#: no head count is a model without attention layers.
SSM_STATE_KEYS = ("state_size", "ssm_state_size", "mamba_d_state", "d_state")
#: ``plan`` builds one attention layer per counted layer; the deepest served models have
#: a little over a hundred. A count past this is a damaged config, not a model.
MAX_LAYERS = 1024
#: vLLM's block tables hold int32 block ids.
MAX_GPU_BLOCKS = 2**31 - 1
#: The longest context ``check accuracy`` and ``bench kernel`` build (the asm decode's
#: envelope, ``max_model_len <= 131072``).
MAX_CONTEXT = 131072
#: The GQA ratios the shipped ultra-precision kernels serve.
MAX_GQA = 8
#: ``check accuracy``'s grid on the GPU (the original change's): head layouts and
#: context lengths, when ``--heads`` and ``--contexts`` are not given.
ACCURACY_LAYOUTS = ((40, 8), (32, 8), (64, 8), (32, 4))
ACCURACY_CONTEXTS = (1, 15, 16, 17, 255, 1000, 4000)
#: The most host memory one ``check accuracy`` case may take (its fp8 cache, the draws
#: and the fp32 reference); a case past it is refused before anything is allocated.
MAX_ACCURACY_CASE_BYTES = 16 * 2**30
#: The largest KV cache one ``bench kernel`` case may ask the GPU for.
MAX_KERNEL_CACHE_BYTES = 64 * 2**30
#: Bounds on counts that size a run: ``bench serve --repeats`` (each repeat starts two
#: servers), ``check passkey --prompts`` (per length) and ``--in-flight`` (threads).
MAX_REPEATS = 1000
MAX_PROMPTS = 10000
MAX_IN_FLIGHT = 1024
#: The longest wait an option takes, in seconds (a day): past it a socket timeout
#: overflows, and no server takes that long.
MAX_SECONDS = 86400
#: vLLM's ``CUDAGraphMode`` names ``plan --cudagraph-mode`` takes; the first is vLLM's
#: default.
CUDAGRAPH_MODES = ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "FULL", "PIECEWISE", "NONE")


class InputError(ValueError):
    """A problem with the user's input; the CLI prints it as one line and exits 2."""


#: What would break a line of ours on a terminal or hide what it says: C0 and C1
#: controls, the tab among them, Unicode's line and paragraph separators and its
#: bidirectional controls. (Undecodable bytes stay as given: a path is named as typed.)
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
#: A byte of an argument that is not UTF-8 as ``repr`` writes it (``'\\udcff'`` for 0xff,
#: which Python holds as a surrogate), where a quoted value names it.
_UNDECODED = re.compile(r"\\udc([89a-f][0-9a-f])")


def one_line(text: str) -> str:
    """``text`` with its control characters written as Python escapes (a newline as
    ``\\n``, ESC as ``\\x1b``): a path or value that carries one leaves an error one
    line, and sends no escape sequence to the terminal. A quoted byte that is not UTF-8
    reads as the byte, ``'\\xff'``."""
    text = _UNDECODED.sub(r"\\x\1", text)
    return _CONTROLS.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def presets() -> list[str]:
    return sorted(p.name for p in PRESETS_DIR.iterdir() if (p / "config.json").is_file())


#: The largest config.json read (real ones are a few KiB).
MAX_CONFIG_BYTES = 16 * 2**20


def resolve_model_dir(model: str) -> tuple[Path, str]:
    """A local directory with a ``config.json`` that names its head count, or a preset.

    A name that is both a preset and a directory with a ``config.json`` here is the
    directory (what the user pointed at); anything written as a path (``/``, ``.``,
    ``~``) is always a path. A directory that cannot be looked into is one line.
    """
    try:
        return _resolve_model_dir(model)
    except OSError as exc:  # a directory without search permission, on the way or itself
        where = exc.filename or model
        raise InputError(f"cannot read {where}: {exc.strerror or first_line(exc)}") from exc


def _resolve_model_dir(model: str) -> tuple[Path, str]:
    path = Path(model).expanduser()
    if not model.strip():
        raise InputError("--model is empty; give a preset or a local model directory")
    as_path = model.startswith((os.sep, ".", "~")) or os.sep in model
    if model in presets() and not (path / "config.json").is_file() and not as_path:
        return PRESETS_DIR / model, f"preset {model}"
    if path.is_dir():
        config = path / "config.json"
        if config.is_dir():
            raise InputError(f"{config} is a directory, not a model's config.json")
        if config.is_fifo():  # its read would wait for a writer, for ever
            raise InputError(f"{config} is a FIFO, not a model's config.json")
        if config.is_char_device() or config.is_block_device():  # /dev/zero, ...
            raise InputError(f"{config} is a device, not a model's config.json")
        try:
            with open(config, "rb") as f:
                data = f.read(MAX_CONFIG_BYTES + 1)  # a link to /dev/zero ends here
        except OSError as exc:
            raise InputError(f"cannot read {config}: {exc.strerror or first_line(exc)}") from exc
        if len(data) > MAX_CONFIG_BYTES:
            raise InputError(
                f"{config} is larger than {MAX_CONFIG_BYTES // 2**20} MiB: not a model's "
                "config.json"
            )
        nul = data.find(b"\0")
        if nul >= 0:
            raise InputError(f"{config} has a NUL byte at byte offset {nul}: not JSON text")
        try:
            raw = json.loads(data.decode("utf-8"))
        except ValueError as exc:
            raise InputError(f"cannot read {config}: {first_line(exc)}") from exc
        except RecursionError:  # arrays or objects nested thousands deep
            raise InputError(f"cannot read {config}: nested too deep for JSON") from None
        if not isinstance(raw, dict):
            raise InputError(f"{config} is not a JSON object")
        sections = [raw, *(v for v in raw.values() if isinstance(v, dict))]
        named = HEAD_COUNT_KEYS + ENCODER_DECODER_HEAD_KEYS
        if not any(key in section for section in sections for key in named):
            state = next((k for sec in sections for k in SSM_STATE_KEYS if k in sec), None)
            if state is not None:
                raise InputError(
                    f"{config} has no attention fields (num_attention_heads) but a state "
                    f"size ({state}): a state-space model (Mamba) has no attention layers, "
                    "so ROCM_ATTN and its asm decode do not apply"
                )
            raise InputError(f"{config} has no attention fields (num_attention_heads)")
        return path, str(path)
    if path.exists():
        raise InputError(f"--model {model} is a file; give the model's directory (config.json)")
    if path.is_symlink():
        raise InputError(f"--model {model} is a link to {os.readlink(path)}, which does not exist")
    # A path, not a Hugging Face id (org/name): rooted, ending in "/", of more or other
    # parts than an id has, or in a directory that is here.
    parts, parent = model.split("/"), os.path.dirname(model.rstrip("/"))
    if (
        model.startswith((os.sep, ".", "~"))
        or model.endswith("/")
        or len(parts) > 2
        or ".." in parts
        or os.path.isdir(parent)
    ):
        raise InputError(f"model directory {model} does not exist")
    # A Hugging Face id or a preset in other case whose name is a preset's: say which.
    like = model.rstrip("/").rsplit("/", 1)[-1].lower()
    hint = f"; --model {like} plans it from its bundled config.json" if like in presets() else ""
    if "/" in model:
        raise InputError(
            f"--model {model}: only local directories and presets work (plan reads "
            f"config.json offline; download the model, then give its directory){hint}"
        )
    raise InputError(
        f"unknown model preset {model!r}{hint or '; presets: ' + ', '.join(presets())}"
    )


def cache_too_large(
    num_gpu_blocks: int | None,
    block_size: int,
    size: int,
    gpu: Gpu,
    any_gpu: bool = False,
    model: str | None = None,
    fix: str = "",
) -> str:
    """The error for a KV cache of ``size`` bytes per rank past ``gpu``'s memory
    (``any_gpu``: the largest of :data:`GPUS`, none was named): ``--num-gpu-blocks``
    blocks, or without it (None) one block of ``--block-size`` tokens. Where even one
    block of the fewest tokens ROCM_ATTN takes is past the GPU, no block option is to
    blame: ``model`` then says what in the config makes it so, ``size`` is that block's,
    and ``fix`` (from :func:`smaller_block_fix`) the options that would fit it."""
    where = f"any GPU's (at most the {gpu.name}'s" if any_gpu else f"the {gpu.name}'s"
    if model is not None:
        what = (
            f"{model}: one block of {ROCM_ATTN_BLOCK_MULTIPLE} tokens (ROCM_ATTN's smallest) takes"
        )
    elif num_gpu_blocks:
        what = f"--num-gpu-blocks {num_gpu_blocks}: that KV cache takes"
    else:
        what = f"--block-size {block_size}: one block takes"
    return (
        f"{what} {round(Fraction(size, 2**30))} GiB per rank, more than {where} "
        f"{gpu.memory_gib} GiB"
        + (")" if any_gpu else "")
        + (f"; {fix} would fit it" if fix else "")
    )


#: The most tensor-parallel ranks :func:`smaller_block_fix` proposes.
MAX_PROPOSED_RANKS = 64


def smaller_block_fix(
    size: int, limit: int, heads: int, kv_heads: int, tp: int, kv_cache_dtype: str
) -> str:
    """The options that bring a block of ``size`` bytes per rank (at ``-tp tp`` and this
    KV dtype) under ``limit``, as vLLM would split ``heads`` and ``kv_heads`` (the model's
    totals): an fp8 KV cache (half the bytes; the asm decode's), then the fewest ranks,
    up to :data:`MAX_PROPOSED_RANKS`, that fit; empty when none does."""
    halve = not kv_cache_dtype.startswith("fp8")

    def per_rank(ranks: int) -> int:
        return max(1, kv_heads // ranks)

    for ranks in range(tp, MAX_PROPOSED_RANKS + 1):
        splits = heads % ranks == 0 and (
            kv_heads % ranks == 0 if kv_heads >= ranks else ranks % kv_heads == 0
        )
        if splits and size * per_rank(ranks) // per_rank(tp) >> halve <= limit:
            fp8 = "--kv-cache-dtype fp8" if halve else ""
            return " with ".join(x for x in (f"-tp {ranks}" * (ranks > tp), fp8) if x)
    return ""


def _count(section: dict, keys: tuple[str, ...]) -> tuple[str, object] | None:
    for key in keys:
        if section.get(key) is not None:
            return key, section[key]
    return None


def attention_section(raw: dict) -> dict:
    """The part of a ``config.json`` that describes the language model's attention: a
    ``text_config`` (or similar) that names a head count, else the top level."""
    for value in raw.values():
        if isinstance(value, dict) and any(k in value for k in HEAD_COUNT_KEYS):
            if not any(k in raw for k in HEAD_COUNT_KEYS):
                return value
    return raw


def check_model_config(model_dir: Path, tensor_parallel_size: int = 1) -> None:
    """What ``config.json`` alone decides, before vLLM is imported: counts that are
    whole numbers of at least 1 (layers at most :data:`MAX_LAYERS`), query heads a
    multiple of the KV heads, and a tensor-parallel size that splits both as vLLM
    splits them."""
    config = model_dir / "config.json"
    section = attention_section(json.loads(config.read_text()))
    counts: dict[str, tuple[str, int]] = {}
    for what, keys in (
        ("heads", HEAD_COUNT_KEYS),
        ("kv_heads", KV_HEAD_COUNT_KEYS),
        ("layers", LAYER_COUNT_KEYS),
    ):
        found = _count(section, keys)
        if found is None:
            # A null head or layer count is no count (vLLM would fail on it after its
            # import); a null KV head count means "as many as the heads" to transformers.
            null = next((k for k in keys if k in section), None)
            if null is None or what == "kv_heads":
                continue
            found = (null, None)
        key, value = found
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(
                f"{config}: {key} is {json.dumps(value)}; it must be a whole number >= 1"
            )
        if what == "layers" and value > MAX_LAYERS:
            raise InputError(
                f"{config}: {key} is {value}; no model has more than {MAX_LAYERS} layers"
            )
        counts[what] = (key, value)
    if "heads" not in counts:
        return
    if "layers" not in counts:  # transformers would fill in its class default
        raise InputError(f"{config} has no layer count ({LAYER_COUNT_KEYS[0]})")
    heads_key, heads = counts["heads"]
    kv_key, kv = counts.get("kv_heads", (heads_key, heads))
    if heads % kv:
        raise InputError(
            f"{config}: {heads_key} {heads} is not a multiple of {kv_key} {kv}; not a model "
            "vLLM can serve"
        )
    tp = tensor_parallel_size
    if heads % tp:
        raise InputError(f"--tensor-parallel-size {tp} does not divide the {heads} attention heads")
    if (kv % tp) if kv >= tp else (tp % kv):
        raise InputError(
            f"--tensor-parallel-size {tp} neither divides the {kv} KV heads nor is a multiple "
            "of them (vLLM splits or replicates KV heads evenly)"
        )


# --------------------------------------------------------------------------------------
# argparse types: each rejects in one line, before anything heavy is imported


_INTEGER = re.compile(r"[+-]?[0-9]+")


def _ascii_int(text: str) -> int:
    """``text`` as an integer written in ASCII digits (an optional sign, spaces around);
    ValueError otherwise. ``int()`` alone would take other scripts' digits and ``_``."""
    stripped = text.strip()
    if not _INTEGER.fullmatch(stripped):
        raise ValueError(text)
    return int(stripped)


def integer(text: str) -> int:
    try:
        return _ascii_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (ASCII digits)") from None


def positive_int(text: str) -> int:
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


#: ROCM_ATTN's kernel block sizes: multiples of this (vLLM's
#: ``RocmAttentionBackend.get_supported_kernel_block_sizes()``, a unit test holds them equal).
ROCM_ATTN_BLOCK_MULTIPLE = 16


def block_size(text: str) -> int:
    value = positive_int(text)
    if value % ROCM_ATTN_BLOCK_MULTIPLE:
        raise argparse.ArgumentTypeError(
            f"{value}: vLLM's ROCM_ATTN takes a multiple of {ROCM_ATTN_BLOCK_MULTIPLE}, so it "
            "would not serve this model"
        )
    return value


def _bounded(text: str, limit: int, what: str) -> int:
    value = positive_int(text)
    if value > limit:
        raise argparse.ArgumentTypeError(f"{value} is more than {limit} {what}")
    return value


#: ``bench kernel --iters`` at most: a million graph replays a timing is already hours.
MAX_ITERS = 10**6


#: ``plan --max-model-len`` at most: far beyond any model's context, refused at once.
MAX_MODEL_LEN = 2**31 - 1


def max_model_len(text: str) -> int:
    """``plan --max-model-len``: 1 to :data:`MAX_MODEL_LEN`, before vLLM loads (whose
    own check against the model's context length comes later)."""
    return _bounded(text, MAX_MODEL_LEN, "tokens")


def iters(text: str) -> int:
    """``bench kernel --iters``: 1 to :data:`MAX_ITERS`."""
    return _bounded(text, MAX_ITERS, "graph replays per timing")


def seed(text: str) -> int:
    """A seed: 0 to 2**32 - 1, as ``check accuracy --seeds`` takes them."""
    value = integer(text)
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"{value} is not a seed from 0 to {2**32 - 1}")
    return value


def repeats(text: str) -> int:
    """``bench serve --repeats``: 1 to :data:`MAX_REPEATS`."""
    return _bounded(text, MAX_REPEATS, "repeats (each starts two servers)")


def prompts(text: str) -> int:
    """``check passkey --prompts``: 1 to :data:`MAX_PROMPTS` per length."""
    return _bounded(text, MAX_PROMPTS, "prompts per length")


def in_flight(text: str) -> int:
    """``check passkey --in-flight``: 1 to :data:`MAX_IN_FLIGHT` requests at once."""
    return _bounded(text, MAX_IN_FLIGHT, "requests in flight")


def gpu_blocks(text: str) -> int:
    value = positive_int(text)
    if value > MAX_GPU_BLOCKS:
        raise argparse.ArgumentTypeError(
            f"{value} is more blocks than vLLM's int32 block ids reach ({MAX_GPU_BLOCKS})"
        )
    return value


def gpu(text: str) -> str:
    """``--gpu``: one of :data:`GPUS`, any case."""
    if text.strip().lower() not in GPUS:
        raise argparse.ArgumentTypeError(f"unknown GPU {text!r}; choose one of {', '.join(GPUS)}")
    return text.strip().lower()


def aiter_version(text: str) -> str | None:
    """``--aiter-version``: ``installed`` (kept as is), a PEP 440 version, or
    ``unknown`` (None)."""
    from packaging.version import InvalidVersion, Version

    if text.strip().lower() == "installed":
        return "installed"
    if text.strip().lower() == "unknown":
        return None
    try:
        Version(text)
    except InvalidVersion:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a version (e.g. 0.1.22), 'installed' or 'unknown'"
        ) from None
    return text.strip()


def port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535)")
    return value


def positive_float(text: str) -> float:
    stripped = text.strip()
    try:
        if not stripped.isascii() or "_" in stripped:  # float() takes both
            raise ValueError(text)
        value = float(stripped)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (ASCII digits)") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number above 0")
    return value


def seconds(text: str) -> float:
    """A timeout: above 0, at most :data:`MAX_SECONDS`."""
    value = positive_float(text)
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text}: at most {MAX_SECONDS} seconds (a day)")
    return value


def fraction(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text} must be in (0, 1]")
    return value


def one_of(values: Sequence[str]) -> Callable[[str], str]:
    """An option's type that takes exactly one of ``values`` (argparse then says
    ``argument --X: 'y' is not one of a, b``, as for every option)."""

    def parse(text: str) -> str:
        if text not in values:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of " + ", ".join(values))
        return text

    return parse


kv_cache_dtype = one_of(KV_CACHE_DTYPES)


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
        values = [_ascii_int(v) for v in text.split(",")]  # an empty item too: "1,"
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from None
    if not values or min(values) < minimum:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers of at least {minimum}")
    if maximum is not None and max(values) > maximum:
        raise argparse.ArgumentTypeError(f"{text!r}: at most {maximum}")
    return values


def _distinct(text: str, values: list[T]) -> list[T]:
    """``values`` when none repeats: each names a run, a row or a file of its own, so a
    repeat would run twice into one name (or merge its rows)."""
    seen: set[T] = set()
    for value in values:
        if value in seen:
            shown = "/".join(map(str, value)) if isinstance(value, tuple) else value
            raise argparse.ArgumentTypeError(f"{text!r}: {shown} is given twice")
        seen.add(value)
    return values


def positive_ints(text: str) -> list[int]:
    return int_list(text)


def distinct_positive_ints(text: str) -> list[int]:
    return _distinct(text, int_list(text))


def seeds(text: str) -> list[int]:
    return _distinct(text, int_list(text, minimum=0, maximum=2**32 - 1))


def contexts(text: str) -> list[int]:
    return _distinct(text, int_list(text, maximum=MAX_CONTEXT))


#: The shortest passkey prompt: its question, the key's sentence and one filler block
#: already take about 80 tokens.
MIN_PASSKEY_LENGTH = 100


def passkey_lengths(text: str) -> list[int]:
    return _distinct(text, int_list(text, minimum=MIN_PASSKEY_LENGTH, maximum=MAX_CONTEXT))


def nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _host_problem(host: str) -> str | None:
    """Why ``host`` (a URL's host, brackets removed) cannot be dialled as written; None
    when it can: an IP address, or a name whose dot-separated labels are 1 to 63
    characters (IDNA), 253 in all."""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    try:
        encoded = host.encode("idna")
    except UnicodeError:
        return "a host name whose labels (between dots) are 1 to 63 characters"
    if len(encoded) > 253:
        return "a host name of at most 253 characters"
    return None


def http_url(text: str) -> str:
    """A server's root URL: ``http(s)://host[:port][/path]``; an OpenAI-style base URL
    ending in ``/v1`` is taken as its root (the tools add ``/v1/...`` themselves). No
    user name or password (the tools send none)."""
    from urllib.parse import urlsplit

    if any(c.isspace() or not c.isprintable() for c in text):
        raise argparse.ArgumentTypeError(f"{text!r} has spaces or control characters")
    try:
        parts = urlsplit(text)
    except ValueError:  # an unclosed [IPv6 address
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http(s) URL with a host (an IPv6 host goes in [ ])"
        ) from None
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL with a host")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if (port is not None and not 1 <= port <= 65535) or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r}: the host or port is not valid")
    if "@" in parts.netloc:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a user name or password in the URL is not supported (the requests "
            "carry no credentials); give http(s)://host:port"
        )
    if why := _host_problem(parts.hostname):
        raise argparse.ArgumentTypeError(f"{text!r}: the host must be an IP address or {why}")
    if parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(f"{text!r}: give the server's URL, without ?query or #")
    root = f"{parts.scheme.lower()}://{parts.netloc}{parts.path}".rstrip("/")
    if "/v1/" in f"{parts.path.rstrip('/')}/" and not root.endswith("/v1"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is an endpoint: give the server's URL (http(s)://host:port, or with "
            "/v1); the tool adds /v1/completions itself"
        )
    return root.removesuffix("/v1") if root.endswith("/v1") else root


def precision(text: str) -> str:
    if text not in ("uhp", "default"):
        raise argparse.ArgumentTypeError(f"{text!r}: use uhp or default")
    return text


def layouts(text: str) -> list[tuple[int, int]]:
    """``Q/KV,...`` head layouts the asm kernel serves (GQA up to 8)."""
    try:
        pairs = [tuple(_ascii_int(x) for x in item.split("/")) for item in text.split(",")]
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
    return _distinct(text, [(p[0], p[1]) for p in pairs])


# --------------------------------------------------------------------------------------
# what an input makes a tool allocate, judged from the options before anything is


def gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


def accuracy_case_bytes(heads: int, kv_heads: int, contexts: Sequence[int]) -> int:
    """Host memory one ``check accuracy`` case takes at its peak, about: the fp8 cache
    of every sequence (K and V), the block table, the queries and the fp32 reference,
    and for the longest sequence its K and V drawn in fp32 and quantized, and the
    reference's K and V widened to every query head with its scores."""
    head, block = 128, 16
    longest = max(contexts)
    pages = sum(math.ceil(n / block) for n in contexts) + 1
    cache = 2 * pages * block * kv_heads * head
    table = len(contexts) * (math.ceil(longest / block) + 1) * 4
    batch = len(contexts) * heads * head * (4 + 2 + 4)
    per_token = kv_heads * head * 18 + heads * head * 8 + heads * 4 * 3
    return cache + table + batch + longest * per_token


def accuracy_memory_problem(
    layouts: Sequence[tuple[int, int]] | None, contexts: Sequence[int] | None
) -> str | None:
    """Why ``check accuracy`` would take more than :data:`MAX_ACCURACY_CASE_BYTES` for
    one case of these options (the grid's defaults where not given); None when not."""
    layouts = layouts or ACCURACY_LAYOUTS
    contexts = contexts or ACCURACY_CONTEXTS
    size, (heads, kv_heads) = max((accuracy_case_bytes(*lay, contexts), lay) for lay in layouts)
    if size <= MAX_ACCURACY_CASE_BYTES:
        return None
    return (
        f"--heads {heads}/{kv_heads} over --contexts {','.join(map(str, contexts))} "
        f"takes about {gib(size)} of memory per case, more than the "
        f"{gib(MAX_ACCURACY_CASE_BYTES)} allowed; give fewer heads or shorter contexts"
    )


def plugin_settings_problem() -> str | None:
    """What in this environment would stop both arms' servers, or keep the plugin out of
    the candidate's (``bench serve`` sets ``VLLM_ROCM_ASM_DECODE`` per arm itself)."""
    from .. import settings

    bad = [p for p in settings.problems() if not p.startswith(f"{settings.SWITCH_ENV}=")]
    if bad:
        return "; ".join(bad)
    if settings.left_out_by_vllm_plugins():
        return (
            f"VLLM_PLUGINS={os.environ['VLLM_PLUGINS']!r} leaves out {settings.ENTRY_POINT}: "
            "no arm would run the plugin"
        )
    return servers_logging_problem()


def servers_logging_problem() -> str | None:
    """Why the servers' logs would not show the INFO lines each serving arm is confirmed
    from, read as vLLM reads its logging settings; None when they would."""
    from .. import settings

    if bad := settings.logging_level_problem():  # vLLM's logging set-up refuses it
        return bad
    configure = os.environ.get("VLLM_CONFIGURE_LOGGING", "1")
    try:
        configured = bool(int(configure))  # as vLLM reads it
    except ValueError:
        return (
            f"VLLM_CONFIGURE_LOGGING={configure!r} is not an integer (vLLM fails on it); unset it"
        )
    if not configured:
        return (
            f"VLLM_CONFIGURE_LOGGING={configure!r} leaves the servers without vLLM's log "
            "lines, whose INFO lines confirm each arm; unset it"
        )
    if os.environ.get("VLLM_LOGGING_CONFIG_PATH"):
        return None  # the user's logging configuration decides; the arms' check says
    level = os.environ.get("VLLM_LOGGING_LEVEL", "INFO")
    if logging.getLevelName(level.upper()) not in (logging.DEBUG, logging.INFO):
        return (
            f"VLLM_LOGGING_LEVEL={level!r} hides the INFO lines of the servers' logs that "
            "confirm each arm; unset it, or set INFO or DEBUG"
        )
    return None


def unwritable(path: str) -> str | None:
    """Why a result file cannot be written at ``path``, checked before a long run; None
    when it can: a name that is not a directory (nor ends in a separator), not too long
    for the file system, an existing regular file (or ``/dev/null``) that is writable,
    or a new one in a writable directory. A link to nothing is judged by where it
    points, where the write makes its file."""
    if path.endswith(("/", os.sep)):
        return "ends in a path separator; give a file name"
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        info = None
    except OSError as exc:  # a name too long for the file system, a loop of links, ...
        return exc.strerror or str(exc)
    if info is None and os.path.islink(path):
        target = os.path.realpath(path)
        why = unwritable(target)
        return None if why is None else f"is a link to {target}; {why}"
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            return "is a directory; give a file name"
        if not stat.S_ISREG(info.st_mode) and path != os.devnull:
            # A FIFO blocks the write at the end of the run until something reads it.
            return "is not a regular file (a FIFO, a device or a socket); give a file name"
        if not os.access(path, os.W_OK):
            return "exists and is not writable"
        if os.path.realpath(path).startswith(("/proc/", "/sys/")):  # writable by root
            return "is a kernel interface file (/proc, /sys), not a result file"
        return None
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        there = parent  # the nearest part of it that exists, when one does
        while there and not os.path.exists(there) and there != os.path.dirname(there):
            there = os.path.dirname(there)
        if there and os.path.exists(there) and not os.path.isdir(there):
            return f"{there} is not a directory"
        return f"{parent} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable"
    return _cannot_create_in(parent)


def heads_text(count: int, kind: str) -> str:
    """``8 KV heads``, ``1 KV head``."""
    return f"{count} {kind} head" + ("" if count == 1 else "s")


def said_of(subject: str, why: str) -> str:
    """``subject`` (an option and its value) with what is wrong with it: a phrase said of
    it follows it (``--json x is a directory``), a sentence of its own after a colon
    (``--json x/y: x does not exist``)."""
    phrase = why.startswith(("is ", "ends ", "exists "))
    return f"{subject} {why}" if phrase else f"{subject}: {why}"


def new_file_mode() -> int:
    """The mode ``open()`` gives a new file under the process's umask (``mkstemp``'s
    0600 would make a file written through a temporary one private)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _cannot_create_in(directory: str) -> str | None:
    """Why no file can be made in ``directory``, found by making (and removing) one; None
    when one can. ``os.access`` answers yes to root for any directory, ``/proc`` and
    ``/sys`` included, where nothing can be made."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".vllm-rocm-asm-decode-", dir=directory)
    except OSError as exc:
        return f"no file can be made in {directory}: {exc.strerror or exc}"
    os.close(fd)
    os.unlink(probe)
    return None


def not_executable(value: str, hint: str) -> str | None:
    """Why ``value`` (a name on ``PATH`` or a path) is not a program to run, as a phrase
    after it; None when it is one. ``hint`` says where the program should come from."""
    if shutil.which(value) is not None:
        return None
    if os.sep in value and os.path.isdir(value):
        return f"is a directory, not a program ({hint})"
    if os.sep in value and os.path.exists(value):
        return "is not an executable file (chmod +x it)"
    if os.path.exists(value):  # a bare name is looked up on PATH, not here
        if not (os.path.isfile(value) and os.access(value, os.X_OK)):
            return f"is not a program on PATH, and ./{value} is not executable (chmod +x it)"
        return f"is not a program on PATH (the file here is ./{value})"
    return f"no such executable ({hint})"


def not_png(path: str) -> str | None:
    """Why ``path`` is not a name for the PNG a ``--plot`` writes; None when it ends in
    ``.png`` (matplotlib would pick its format from any other suffix, or add ``.png``
    to a name without one)."""
    if not path.lower().endswith(".png"):
        return "the plot is a PNG: give a path ending in .png"
    return None


def uncreatable_dir(path: str) -> str | None:
    """Why files cannot be written in a directory at ``path`` (made where it is not
    there yet), as a phrase after the path; None when they can. Checked before a long
    run: the nearest existing ancestor must be a writable directory, and each name to
    make short enough for its file system."""
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        info = None
    except OSError as exc:
        return f"cannot be used: {exc.strerror or exc}"
    if info is not None:
        if not stat.S_ISDIR(info.st_mode):
            return "is a file"
        if not os.access(path, os.W_OK | os.X_OK):
            return "is not writable"
        return _cannot_create_in(path)
    bare = os.path.normpath(path)  # "link/" and "link/." name the link too
    if os.path.islink(bare):  # mkdir does not follow a link, even one to nothing
        return f"cannot be made: it is a link to {os.readlink(bare)}, which does not exist"
    missing = []
    here = os.path.abspath(path)
    while True:
        here, name = os.path.split(here)
        missing.append(name)
        try:
            info = os.stat(here)
        except (FileNotFoundError, NotADirectoryError):
            if os.path.islink(here):
                target = os.readlink(here)
                return f"cannot be made: {here} is a link to {target}, which does not exist"
            continue
        except OSError as exc:
            return f"cannot be made: {exc.strerror or exc}"
        break
    if not stat.S_ISDIR(info.st_mode):
        return f"cannot be made: {here} is not a directory"
    if not os.access(here, os.W_OK | os.X_OK):
        return f"cannot be made: {here} is not writable"
    if why := _cannot_create_in(here):
        return f"cannot be made: {why}"
    try:
        longest = os.pathconf(here, "PC_NAME_MAX")
    except (OSError, ValueError):
        longest = 255
    if too_long := [n for n in missing if len(os.fsencode(n)) > longest]:
        return f"cannot be made: {too_long[-1][:40]}... is longer than {longest} bytes"
    return None
