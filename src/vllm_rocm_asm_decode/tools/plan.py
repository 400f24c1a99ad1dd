"""``plan``: what the backend will do for a model on a GPU, computed by the backend's own rule.

The model's attention facts come from vLLM's ``ModelConfig`` (offline, from a directory
holding a Hugging Face ``config.json``), as the real ``RocmAttentionImpl`` vLLM would
build for each layer over a KV cache laid out as vLLM binds it (on the meta device: no
memory); the answers from :mod:`..core` and the plugin's guards (:mod:`..eligibility`),
exactly as the builder asks them at run time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import sys
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

from .. import settings
from ..aiter_version import FIRST_FIXED, AiterBuild, describe, installed_version, safe_blocks
from ..core import ASM_KV_DTYPES, ASM_MAX_MODEL_LEN, use_asm_decode
from ..eligibility import (
    FP16_UNPROVEN,
    VALIDATED_CONTEXT,
    default_cut,
    describe_cut,
    guard_reasons,
    kv_page_bytes,
    rejection_reasons,
    resolve_cut,
)
from ..kernel_table import KernelTable, fallback_table
from ..page_span import SPAN_LIMIT
from ..plugin import IN_TREE_MODULE, vllm_carries_asm_decode
from ..skew import ASM_SKEW_HEAD_TOKENS, ASM_SKEW_RATIO, asm_decode_skewed
from .choices import (
    DEFAULT_GPU,
    DEFAULT_PRESET,
    GPUS,
    MAX_CONFIG_BYTES,
    MAX_LAYERS,
    ROCM_ATTN_BLOCK_MULTIPLE,
    Gpu,
    InputError,
    cache_too_large,
    first_line,
    heads_text,
    resolve_model_dir,
    smaller_block_fix,
)
from .contract_model import original_time_model
from .plan_input import check_config, check_model_path, unserved_head_size

#: A problem with the user's input (one line, exit 2).
PlanError = InputError


#: One aliased table's device memory: a chunk of the GPU's allocation granularity
#: (2 MiB on the H200 measured; ``benchmarks/scale_table_memory.py`` reads it on yours).
ALIASED_CHUNK = 2 * 1024**2

#: cudagraph modes under which no captured graph holds the attention: each step's
#: decode kernel is decided on that step's lengths, the skew clause included.
PER_STEP_MODES = ("PIECEWISE", "NONE")


def default_capture_sizes(max_size: int = 512) -> list[int]:
    """vLLM's default CUDA-graph capture sizes (``VllmConfig._set_cudagraph_sizes``):
    1, 2, 4, then every 8 below 256, then every 16 up to the maximum (512 by default)."""
    return [1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16)]


@dataclass
class LayerGroup:
    layers: list[int]
    eligible: bool
    reasons: list[str]


@dataclass
class Plan:
    model: str
    gpu: str
    arch: str
    compute_units: int
    tensor_parallel_size: int
    kv_cache_dtype: str
    block_size: int
    dtype: str
    cut_query_heads: int
    cut_source: str
    num_layers: int
    num_heads_per_rank: int
    num_kv_heads_per_rank: int
    head_size: int
    max_model_len: int
    kernel_table: str
    eligible: bool
    eligible_layers: int
    reasons: list[str]
    layer_groups: list[LayerGroup]
    batches: list[dict[str, Any]]
    #: Distinct per-slot scale tables the eligible layers need (one per distinct scale).
    scale_tables: int
    scale_table_fraction: float
    #: Where the scales come from: "checkpoint", or why they are 1.0.
    kv_scales: str
    aiter_version: str | None
    block_id_fix: bool | None
    num_gpu_blocks: int | None
    #: What the AITER version means for this deployment, as a sentence.
    block_id_clause: str
    #: vLLM's cudagraph_mode the batch table is for.
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    #: Whether each step's decode kernel is decided on its lengths (no captured graph
    #: holds the attention: cudagraph_mode PIECEWISE or NONE).
    decided_per_step: bool = False
    #: Decode requests from which a mixed prefill+decode step runs its decode part on asm
    #: (when the decodes lead and there is no speculative decoding); None when no layer
    #: is eligible or under cudagraph_mode FULL (mixed steps replay FULL graphs whole).
    mixed_asm_from_decodes: int | None = None
    #: Bytes of the scale tables allocated in full at ``num_gpu_blocks`` blocks per
    #: layer (where the GPU offers no virtual memory); None without it.
    scale_table_bytes: int | None = None
    #: Device memory of the tables aliased (one chunk each, taken as 2 MiB, the
    #: allocation granularity of the GPUs measured), as where the GPU offers virtual
    #: memory.
    scale_table_aliased_bytes: int = 0
    #: The page-span guard for this deployment, as a sentence (see ``page_span``).
    page_span_clause: str = ""
    #: The skew clause's ratio (``VLLM_ROCM_ASM_DECODE_SKEW``, else the core's; 0: off).
    skew_ratio: int = 0
    #: Whether the imported vLLM carries the asm decode itself (the in-tree change): the
    #: plugin stays inactive there, and this plan is the plugin's (a note says so).
    vllm_carries_asm_decode: bool = False
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def resolve_gpu(name: str | None) -> Gpu:
    """``--gpu``, else the live GPU on ROCm, else MI355X."""
    if name is not None:
        gpu = GPUS.get(name.lower())
        if gpu is None:
            raise PlanError(f"unknown GPU {name!r}; choose one of {', '.join(GPUS)}")
        return gpu
    from vllm.platforms import current_platform

    if current_platform.is_rocm():
        import torch

        from ..kernel import current_arch

        arch = current_arch()
        try:
            memory = torch.cuda.get_device_properties(0).total_memory // 1024**3
        except (RuntimeError, AssertionError):  # ROCm, but torch cannot open the GPU
            memory = None
        return Gpu(f"live {arch}", arch, current_platform.num_compute_units(), memory)
    return GPUS[DEFAULT_GPU]


def kernel_table_for(arch: str) -> KernelTable:
    """AITER's table where AITER is installed, else the built-in knowledge."""
    from importlib.util import find_spec

    if find_spec("aiter") is not None:
        from ..kernel import load_asm_kernel

        kernel, _ = load_asm_kernel(arch, settings.trust_aiter())
        if kernel is not None:
            return kernel.table
    return fallback_table(arch)


@contextlib.contextmanager
def _one_voice() -> Iterator[None]:
    """vLLM and Transformers log a config error (and warn) before they raise it; the
    raised error alone is reported, as one line."""
    disabled = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(disabled)


def _model_config(
    model_dir: Path,
    label: str,
    dtype: str,
    max_model_len: int | None,
    language_model_only: bool = False,
    trust_remote_code: bool = False,
):
    offline = os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm.config import ModelConfig

    def read(skip_tokenizer_init: bool):
        # A checkpoint's own code (--trust-remote-code) may print: not into --json.
        with _one_voice(), _stdout_to_stderr(), _exit_raises():
            return ModelConfig(
                model=str(model_dir),
                skip_tokenizer_init=skip_tokenizer_init,
                dtype=dtype,
                max_model_len=max_model_len,
                language_model_only=language_model_only,
                trust_remote_code=trust_remote_code,
            )

    try:
        try:  # without a tokenizer: a directory may hold config.json alone
            return read(skip_tokenizer_init=True)
        except Exception as exc:
            # A multimodal model whose processor needs the tokenizer (InternVL, Llama 3.2
            # Vision) is read as vllm serve reads it, where the checkpoint has one.
            if not (_processor_missing(exc) and _has_tokenizer(model_dir)):
                raise
            return read(skip_tokenizer_init=False)
    except SystemExit as exc:  # a checkpoint's own code that exits
        raise PlanError(f"{label}'s own code exited ({exc.code}) while vLLM read it") from exc
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # vLLM's own validation errors, unreadable configs
        if _in_dtype_fallback(exc):
            raise PlanError(
                f"vLLM refuses {label}: the checkpoint's dtype (config.json's torch_dtype, "
                "else its weights') is not one vLLM runs a model in here (bfloat16, "
                "float16, float32); give --dtype"
            ) from exc
        if broken := _broken_json(model_dir):
            raise PlanError(f"vLLM refuses {label}: {broken}") from exc
        if broken := _broken_weights(model_dir):
            raise PlanError(broken) from exc
        if problem := _auto_map_problem(model_dir):
            raise PlanError(f"{label}'s config.json{problem}") from exc
        remote = ("contains custom code which must be executed", "inspect the repository")
        if not trust_remote_code and any(said in str(exc) for said in remote):
            raise PlanError(
                f"{label} needs its own Python code to be read (config.json's auto_map): "
                "give --trust-remote-code to run it, as vllm serve takes it"
            ) from exc
        hub = _HUB_UNREACHED.search(str(exc))
        if trust_remote_code and hub:
            code = f"{label}'s config.json names code on the Hugging Face Hub (its auto_map)"
            if offline.strip().upper() in ("1", "ON", "YES", "TRUE"):  # as the Hub reads it
                raise PlanError(
                    f"{code}, which plan, reading offline (HF_HUB_OFFLINE={offline}), does "
                    "not download: set HF_HUB_OFFLINE=0 to let it"
                ) from exc
            raise PlanError(
                f"{code}, which plan could not download: {hub[1]} cannot be reached from here"
            ) from exc
        if trust_remote_code and (own := _raised_by_own_code(exc)):
            where, error = own
            said = f"{type(error).__name__}: {first_line(error)}"
            if where is None:
                raise PlanError(
                    f"{label}'s own code, as config.json's auto_map names it, could not be "
                    f"loaded: {said}"
                ) from exc
            raise PlanError(f"{label}'s own code ({where}) raised {said}") from exc
        if missing := _processor_missing(exc):
            raise PlanError(
                f"{label} is a multimodal model whose processor vLLM reads to configure "
                f"it, and Transformers cannot load it ({missing}): put the checkpoint's "
                "processor and tokenizer files beside its config.json"
            ) from exc
        longest = _LONGER_THAN_THE_MODEL.search(str(exc))
        if max_model_len is not None and longest:
            raise PlanError(
                f"--max-model-len {max_model_len} is more than {label}'s context length, "
                f"{longest[2]} ({longest[1]} in its config.json, as vLLM derives it); give "
                f"--max-model-len {longest[2]} or less"
            ) from exc
        raise PlanError(f"vLLM refuses {label}: {_what_is_wrong(exc)}") from exc
    except BaseException as exc:  # a checkpoint's own code's (GeneratorExit, ...)
        raise PlanError(
            f"{label}'s own code raised {type(exc).__name__}: {first_line(exc)}"
        ) from exc


@contextlib.contextmanager
def _exit_raises() -> Iterator[None]:
    """While this runs, ``os._exit(code)`` (a checkpoint's own code may call it) raises
    ``SystemExit(code)`` where it is called, so that plan says which code ended it
    rather than ending without a word."""
    real = os._exit

    def exit_raising(code: int) -> NoReturn:
        raise SystemExit(code)

    os._exit = exit_raising
    try:
        yield
    finally:
        os._exit = real


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Whatever is written to stdout while this runs goes to stderr: ``print`` and
    writes to file descriptor 1 alike (a checkpoint's own code, a process it starts), so
    that ``--json``'s stdout holds the JSON alone."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # stdout or stderr closed: print's redirect alone
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


#: huggingface_hub's error for a download it could not make: the endpoint it tried.
_HUB_UNREACHED = re.compile(r"couldn't connect to '([^']+)'")

#: vLLM's refusal of a --max-model-len above the model's: the key and its value.
_LONGER_THAN_THE_MODEL = re.compile(
    r"is greater than the derived max_model_len \((\w+)=(\d+)(?:\.0)?\b"
)


def _broken_json(model_dir: Path) -> str | None:
    """Which of the checkpoint's JSON files (``hf_quant_config.json``, ``generation_
    config.json``, ...) does not parse, with why: vLLM's and Transformers' errors name
    no file. None when each does (or is too large to look at)."""
    for path in sorted(model_dir.glob("*.json")):
        try:
            if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
                continue
            json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError) as exc:
            return f"its {path.name} is not JSON ({first_line(exc)})"
    return None


def _broken_weights(model_dir: Path) -> str | None:
    """Which safetensors file of the checkpoint cannot be read, with why, as the scales'
    read says it later: vLLM reads their headers for a dtype config.json does not give,
    and its errors (``MemoryError``, ``unpack requires a buffer of 8 bytes``) name no
    file. None when each reads (or the checkpoint is not safetensors)."""
    from .checkpoint_scales import CheckpointError, read_kv_scales

    try:
        read_kv_scales(model_dir)
    except CheckpointError as exc:
        return str(exc)
    except Exception:  # what the read cannot judge is left to vLLM's own error
        return None
    return None


def _auto_map_problem(model_dir: Path) -> str | None:
    """What is wrong with config.json's ``auto_map``, said after "X's config.json": a
    ``.py`` file it names in the checkpoint that is not there, or a shape Transformers
    cannot read (not a mapping of names to ``module.Class`` strings, or lists of them, a
    tokenizer's); None when it is fine, absent, or config.json cannot tell."""
    try:
        config = json.loads((model_dir / "config.json").read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(config, dict) or "auto_map" not in config:
        return None
    auto_map = config["auto_map"]
    refs = list(auto_map.values()) if isinstance(auto_map, dict) else [auto_map]
    refs = [r for ref in refs for r in (ref if isinstance(ref, list) else [ref])]
    if not isinstance(auto_map, dict) or not all(r is None or isinstance(r, str) for r in refs):
        shown = json.dumps(auto_map)[:60]
        return f": auto_map is {shown}, not a mapping of Auto classes to module.Class names"
    for ref in refs:  # the checkpoint's own module, not another repository's
        if isinstance(ref, str) and _LOCAL_CLASS.fullmatch(ref):
            name = ref.split(".")[0] + ".py"
            if not (model_dir / name).is_file():
                return (
                    f" names its own code in {name} (its auto_map), which is not beside it: "
                    "put the checkpoint's .py files there"
                )
    bad = [r for r in refs if isinstance(r, str) and "." not in r.split("--")[-1]]
    return f": auto_map names {bad[0]!r}, not a module.Class" if bad else None


#: An auto_map entry naming a class of the checkpoint's own module (``module.Class``), as
#: Transformers reads one: one dot, no other repository (``org/repo--module.Class``).
_LOCAL_CLASS = re.compile(r"[A-Za-z_][\w-]*\.[A-Za-z_]\w*")


def _raised_by_own_code(exc: BaseException) -> tuple[str | None, BaseException] | None:
    """Where a checkpoint's own code failed, with the error: its file (Transformers'
    ``transformers_modules``) when it raised ``exc`` or the error ``exc`` wraps (pydantic
    keeps it in the error's context), or None for the file when loading the code failed
    (Transformers' ``dynamic_module_utils``); None when neither."""
    errors = _validation_errors(exc)  # pydantic keeps the error it wraps in its context
    wrapped = [exc, *(e["ctx"]["error"] for e in errors if "error" in e.get("ctx", {}))]
    for error in wrapped:
        if not isinstance(error, BaseException):
            continue
        files = [Path(f.filename) for f in traceback.extract_tb(error.__traceback__)]
        if isinstance(error, SyntaxError) and error.filename:
            files.append(Path(error.filename))
        if files and "transformers_modules" in files[-1].parts:
            return files[-1].name, error
        if any(f.name == "dynamic_module_utils.py" for f in files):
            return None, error
    return None


def _in_dtype_fallback(exc: BaseException) -> bool:
    """Whether ``exc`` came from vLLM's ``--dtype auto`` falling back from a checkpoint
    dtype it does not run models in: off a GPU platform, the fallback cannot name the
    device and raises a bare ``NotImplementedError``."""
    if not isinstance(exc, NotImplementedError) or str(exc).strip():
        return False
    return any(f.name == "_resolve_auto_dtype" for f in traceback.extract_tb(exc.__traceback__))


#: The first line of huggingface_hub's error for a config field of the wrong type.
_STRICT_FIELD = re.compile(r"Validation error for field '(\w+)':")
#: ``<class 'transformers.modeling_rope_utils.RopeParameters'>`` -> ``RopeParameters``.
_CLASS_NAME = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>")


def _validation_errors(exc: BaseException) -> list[dict]:
    """pydantic's errors when ``exc`` is its ValidationError (vLLM's config classes
    raise one), else none."""
    errors = getattr(exc, "errors", None)
    if not (callable(errors) and type(exc).__name__ == "ValidationError"):
        return []
    try:
        return [e for e in errors() if isinstance(e, dict)]
    except Exception:  # an error object that cannot list its errors
        return []


def _first_sentence(reason: str) -> str:
    """A config error's first sentence, which says what is wrong (the rest advises on
    retries and the hub), and the next one where it names the config.json key to add
    (Transformers' "Unrecognized model in DIR. Should have a `model_type` key ...")."""
    first, _, rest = reason.partition(". ")
    if rest.startswith("Should have a"):
        advice = rest.split(". ")[0].removesuffix(".")
        return f"{first}: it {advice[0].lower()}{advice[1:]}"
    return first


def _what_is_wrong(exc: BaseException) -> str:
    """The one line of a vLLM (pydantic) or Transformers config error that says what is
    wrong with which field: not pydantic's ``1 validation error for ModelConfig`` header,
    the field alone, nor transformers' retry advice."""
    if errors := _validation_errors(exc):
        with contextlib.suppress(Exception):
            first = errors[0]
            message = str(first["msg"]).strip().splitlines()[0]
            for prefix in ("Value error,", "Assertion failed,"):
                if message.startswith(prefix):
                    reason = message.removeprefix(prefix).split(" [type=")[0].strip()
                    return _first_sentence(reason)
            where = ".".join(str(part) for part in first.get("loc", ()))
            given = first.get("input")
            got = f" (got {type(given).__name__} {given!r})" if "input" in first else ""
            return f"{where}: {message}{got}" if where else f"{message}{got}"
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    for line in lines:
        if line.startswith(("Value error,", "Assertion failed,")):
            reason = line.split(",", 1)[1].split(" [type=")[0].strip()
            return _first_sentence(reason)
    strict = _STRICT_FIELD.fullmatch(lines[0]) if lines else None
    if strict and len(lines) > 1:  # huggingface_hub's strict dataclass fields
        field_name = strict.group(1)
        cause = lines[1].split(": ", 1)[-1]  # without its "TypeError: "
        cause = _CLASS_NAME.sub(r"\1", cause.split(". Errors:")[0])
        cause = cause.replace(f"Field {field_name!r} ", "").removeprefix("with ")
        # Transformers reads rope_scaling into rope_parameters.
        alias = " (rope_scaling)" if field_name == "rope_parameters" else ""
        return f"config.json field {field_name!r}{alias}: {cause}"
    meaningful = [line for line in lines if "validation error" not in line]
    first = (meaningful or lines or [type(exc).__name__])[0]
    return first.split(". Checkout 'https://huggingface.co/")[0]  # a Hub page, offline


#: Transformers' error for a processor file a directory lacks: which file.
_NO_PROCESSOR_FILE = re.compile(r"Can't load .* directory containing an? (\S+) file$")


def _has_tokenizer(model_dir: Path) -> bool:
    """Whether the checkpoint carries a tokenizer (Transformers' file names)."""
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    return any((model_dir / name).is_file() for name in names)


def _processor_missing(exc: BaseException) -> str | None:
    """What vLLM could not load of a multimodal model's processor while it built the
    ModelConfig (it reads the processor of a model served by Transformers' backend),
    said briefly; None where the error came from elsewhere."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not any(frame.name in ("get_hf_processor", "get_tokenizer") for frame in frames):
        return None
    said = " ".join(str(exc).split())
    if missing := _NO_PROCESSOR_FILE.search(said):
        return f"no {missing[1]}"
    return said.split(". ")[0].rstrip(".")


def _per_rank_heads(model_config, tp: int) -> tuple[int, int]:
    from vllm.config import ParallelConfig

    total = model_config.model_arch_config.total_num_attention_heads
    if tp < 1 or total % tp:
        raise PlanError(f"--tensor-parallel-size {tp} does not divide the {total} attention heads")
    parallel = ParallelConfig(tensor_parallel_size=tp)
    return (
        model_config.get_num_attention_heads(parallel),
        model_config.get_num_kv_heads(parallel),
    )


@dataclass
class PlanLayer:
    """One attention layer as the backend sees it: vLLM's impl and the layer's KV cache
    view (meta tensors: shapes and strides, no memory)."""

    impl: Any
    kv_cache: Any
    #: Why vLLM builds the layer on a backend derived from ROCM_ATTN's, whose builder
    #: keeps the HIP decode, or sizes its blocks past the kernel's; None where neither.
    kept_on_hip: str | None = None

    @property
    def num_blocks(self) -> int:
        return int(self.kv_cache.shape[0])

    @property
    def page_bytes(self) -> int:
        """Bytes of one block of the layer's K and V."""
        return 2 * kv_page_bytes(self.impl, self.kv_cache)


def check_attention_kind(model_config) -> None:
    """A model none of whose layers vLLM's ROCm platform would run on ROCM_ATTN whatever
    the options (attention-free, multi-head latent attention, an encoder-decoder), as one
    line; judged before anything of the checkpoint's quantization."""
    hf = model_config.hf_text_config
    if model_config.is_attention_free:  # vLLM's registry: Mamba, Mamba2, RWKV-style models
        raise PlanError(
            f"{hf.model_type} has no attention layers (vLLM serves it attention-free), so "
            "ROCM_ATTN and its asm decode do not apply"
        )
    if model_config.use_mla:
        raise PlanError(
            f"{hf.model_type} uses multi-head latent attention: vLLM serves it with an MLA "
            "backend, never ROCM_ATTN, so the asm decode does not apply"
        )
    if model_config.attn_type == "encoder_decoder":  # Whisper, as vLLM's ROCm platform asks
        raise PlanError(
            f"{hf.model_type} is an encoder-decoder model: vLLM's ROCm platform leaves "
            "ROCM_ATTN out of the backends it picks for one, so the asm decode does not apply"
        )


def plan_layers(
    model_config,
    *,
    tp: int,
    kv_cache_dtype: str,
    block_size: int,
    num_blocks: int = 1,
    arch: str = "gfx950",
    per_head_scales: bool = False,
) -> list[PlanLayer]:
    """One :class:`PlanLayer` per attention layer, from vLLM's reading of the config.

    A model that vLLM's ROCm platform would not serve on ROCM_ATTN at all is a
    :class:`PlanError` (none of its layers runs ROCM_ATTN's decode): what
    :func:`check_attention_kind` refuses, which the caller asks first, and what
    ``RocmAttentionBackend.validate_configuration`` refuses for the ``arch`` GPU
    (attention sinks, multimodal prefix attention, per-head KV scales
    (``per_head_scales``), R-SWA, batch invariance, ...)."""
    import torch
    from vllm import envs
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.rocm_attn import RocmAttentionBackend, RocmAttentionImpl

    hf = model_config.hf_text_config
    try:
        head_size = model_config.get_head_size()
        num_heads, num_kv_heads = _per_rank_heads(model_config, tp)
        num_layers = model_config.get_total_num_hidden_layers()
        if model_config.is_hybrid:  # Jamba, Qwen3-Next: their attention layers alone
            from vllm.config import ParallelConfig

            parallel = ParallelConfig(tensor_parallel_size=tp)
            num_layers = model_config.get_num_layers_by_block_type(parallel, "attention")
    except PlanError:
        raise
    except Exception as exc:
        raise PlanError(f"config.json lacks attention fields: {first_line(exc)}") from exc
    # Only what stock ROCM_ATTN serves at all (vLLM's own checks) has a decode to plan.
    if not RocmAttentionBackend.supports_head_size(head_size):
        served = RocmAttentionBackend.get_supported_head_sizes()
        raise PlanError(unserved_head_size(head_size, served))
    if not RocmAttentionBackend.supports_block_size(block_size):
        kinds = RocmAttentionBackend.get_supported_kernel_block_sizes()
        takes = [f"a multiple of {k.base}" if isinstance(k, MultipleOf) else k for k in kinds]
        raise PlanError(
            f"--block-size {block_size}: vLLM's ROCM_ATTN takes "
            f"{' or '.join(map(str, takes))}, so it would not serve this model"
        )
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        # A hybrid without attention layers: check_model_config judged
        # num_hidden_layers before vLLM was imported.
        raise PlanError(
            f"vLLM reads {num_layers!r} attention layers from config.json; a model it "
            "serves on ROCM_ATTN has a whole number of at least 1"
        )
    if num_layers > MAX_LAYERS:  # one layer is built per count
        raise PlanError(
            f"vLLM reads {num_layers} layers from config.json; no model has more than "
            f"{MAX_LAYERS} layers"
        )
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise PlanError(
            f"{num_heads} attention heads per rank are not a multiple of {num_kv_heads} KV "
            "heads: not a model vLLM can serve"
        )
    window = model_config.get_sliding_window()
    layer_types = getattr(hf, "layer_types", None) or []
    # The softmax scale models give their attention layers.
    pre_attn = _attention_number(hf, "query_pre_attn_scalar")
    multiplier = _attention_number(hf, "attention_multiplier")
    if pre_attn is not None:
        if pre_attn <= 0:
            raise PlanError(
                f"config.json: query_pre_attn_scalar is {pre_attn:g}; it must be above 0 "
                "(queries are scaled by its -1/2 power)"
            )
        scale = pre_attn**-0.5
    elif multiplier:
        scale = multiplier
    else:
        scale = head_size**-0.5
    soft_cap = _attention_number(hf, "attn_logit_softcapping") or None
    if soft_cap is not None and soft_cap < 0:
        raise PlanError(
            f"config.json: attn_logit_softcapping is {soft_cap:g}; a logit soft cap must be "
            "0 (none) or above"
        )
    alibi = bool(getattr(hf, "alibi", False)) or hf.model_type in ("bloom", "mpt")
    has_sink = attention_sinks(hf)
    attn_type = attention_type(model_config)
    refused = RocmAttentionBackend.validate_configuration(
        head_size,
        model_config.dtype,
        kv_cache_dtype,
        block_size,
        use_mla=False,
        has_sink=has_sink,
        use_sparse=False,
        use_mm_prefix=model_config.is_mm_prefix_lm,
        use_per_head_quant_scales=per_head_scales,
        device_capability=device_capability(arch),
        attn_type=attn_type,
        has_sliding_window=window is not None,
        use_batch_invariant=envs.VLLM_BATCH_INVARIANT,
        use_rswa=model_config.rswa_window is not None,
    )
    if refused:
        text_only = ""
        if model_config.is_mm_prefix_lm:  # vLLM turns it off when it serves text alone
            text_only = "; with --language-model-only it serves the text model on it"
        raise PlanError(
            f"vLLM would not serve {model_config.hf_config.model_type} on ROCM_ATTN "
            f"({', '.join(refused)}), so the asm decode does not apply{text_only}"
        )
    # ROCM_ATTN's cache as vLLM binds it under its preferred LHBNC layout (dense pages).
    if 2 * num_blocks * block_size * num_kv_heads * head_size >= 2**63:
        raise PlanError(
            f"--block-size {block_size}: a KV cache of {num_blocks} block(s) of {block_size} "
            f"tokens x {heads_text(num_kv_heads, 'KV')} x {head_size} dims has more elements "
            "than a tensor can index (2^63)"
        )
    # Llama 4 with attention_chunk_size: every layer that applies RoPE (no_rope_layers[i]
    # 1) attends in chunks (vLLM's ChunkedLocalAttention).
    chunked = getattr(hf, "attention_chunk_size", None)
    ropes = (getattr(hf, "no_rope_layers", None) or []) if chunked else []
    hybrid = HYBRID_MODEL if model_config.is_hybrid else None
    element = torch.uint8 if kv_cache_dtype.startswith("fp8") else model_config.dtype
    groups = torch.empty(
        2, num_blocks, block_size, num_kv_heads * head_size, dtype=element, device="meta"
    )
    kv_cache = groups.transpose(0, 1)
    layers = []
    for i in range(num_layers):
        if window is None:
            sliding = None
        elif layer_types:
            sliding = (
                window if i < len(layer_types) and layer_types[i] == "sliding_attention" else None
            )
        else:
            sliding = window
        impl = RocmAttentionImpl(
            num_heads,
            head_size,
            scale,
            num_kv_heads,
            [1.0] * num_heads if alibi else None,
            sliding,
            kv_cache_dtype,
            logits_soft_cap=soft_cap,
            attn_type=attn_type,
        )
        kept = CHUNKED_LOCAL_ATTENTION if i < len(ropes) and ropes[i] else hybrid
        layers.append(PlanLayer(impl, kv_cache, kept))
    return layers


#: The reason of a layer of chunked local attention (Llama 4): vLLM builds it on a
#: backend derived from ROCM_ATTN's, whose builder keeps the HIP decode.
CHUNKED_LOCAL_ATTENTION = "chunked local attention (a builder derived from ROCM_ATTN's)"
#: The reason of an attention layer of a hybrid model (Jamba, Qwen3-Next, Granite 4):
#: vLLM makes its attention blocks at least as large as a layer's state page.
HYBRID_MODEL = "a hybrid model: vLLM sizes its attention blocks to hold a state page, not 16 tokens"


def attention_type(model_config) -> Any:
    """The ``AttentionType`` vLLM gives the attention layers ``plan`` models, from its own
    reading of the config: ENCODER_ONLY for what ``ModelConfig.attn_type`` says is
    encoder-only (BERT, RoBERTa, XLM-R: pooling models of bidirectional attention), else
    DECODER (an encoder-decoder model never reaches it: :func:`plan_layers`)."""
    from vllm.v1.attention.backend import AttentionType

    if model_config.attn_type == "encoder_only":
        return AttentionType.ENCODER_ONLY
    return AttentionType.DECODER


#: Every layer's reason under vLLM's pooling runner (embedding, classification, reward,
#: BERT-style encoders): a request is one forward pass over its prompt, never a decode.
POOLING_MODEL = "a pooling model (vLLM's pooling runner): no decode steps"


def _attention_number(hf, name: str) -> float | None:
    """A number of the model's attention from its config (None when absent), as the
    model class would compute with it: a finite int or float, else a :class:`PlanError`."""
    value = getattr(hf, name, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PlanError(f"config.json: {name} is {value!r}; it must be a finite number")
    return float(value)


def table_count(
    layers: list[PlanLayer],
    eligible: list[bool],
    scales: list[tuple[float, float]],
    from_checkpoint: bool,
) -> tuple[int, int]:
    """The tables the backend makes for the eligible layers (a K and a V table of their
    own for each layer whose scales come from the checkpoint, else one per distinct
    fixed scale), and what they take per KV cache block allocated in full: the backend's
    own counting (:func:`~.scale_tables.fit_tables`) over one-block keys."""
    from ..scale_tables import fit_tables, table_key

    requests = [
        tuple(
            table_key(
                "plan",
                1,
                layer.impl.num_kv_heads,
                layer.kv_cache.shape[2],
                scale,
                (str(i) if from_checkpoint else "") + side,
            )
            for side, scale in zip((":K", ":V"), pair, strict=True)
        )
        for i, (layer, ok, pair) in enumerate(zip(layers, eligible, scales, strict=True))
        if ok
    ]
    budget = fit_tables(requests, None)
    return budget.tables, budget.bytes


def vllm_quant_config(model_config, label: str) -> Any:
    """vLLM's own quantization config of the checkpoint (None: not quantized)."""
    if model_config.quantization is None:
        return None
    from vllm.config import LoadConfig, VllmConfig

    try:
        with _one_voice():
            return VllmConfig.get_quantization_config(model_config, LoadConfig())
    except Exception as exc:  # vLLM's own refusal of the checkpoint's quantization
        if broken := _broken_json(Path(model_config.model)):
            raise PlanError(f"vLLM refuses {label}: {broken}") from exc
        raise PlanError(f"vLLM refuses {label}'s quantization: {_what_is_wrong(exc)}") from exc


def served_kv_cache_dtype(model_config, kv_cache_dtype: str, quant_config: Any) -> str:
    """The KV cache dtype vLLM serves with: ``auto`` becomes what the checkpoint declares,
    ModelOpt's by vLLM's engine (``resolve_kv_cache_dtype_string``), compressed-tensors'
    ``kv_cache_scheme`` by vLLM's attention layer (fp8); anything else is as given."""
    from vllm.utils.torch_utils import resolve_kv_cache_dtype_string

    with _one_voice():  # vLLM warns of a kv_cache_quant_algo it does not know
        served = resolve_kv_cache_dtype_string(kv_cache_dtype, model_config)
    if served == "auto" and getattr(quant_config, "kv_cache_scheme", None) is not None:
        return "fp8"
    return served


#: Text model types whose vLLM classes (granite.py, granitemoe.py, granitemoeshared.py,
#: also inside Granite's vision and speech models) take their sinks from vLLM's
#: ``granite_layer_attn_params``.
GRANITE_SINK_MODEL_TYPES = (
    "granite",
    "granite_swa",
    "granitemoe",
    "granitemoe_swa",
    "granitemoeshared",
)


def attention_sinks(hf: Any) -> bool:
    """Whether vLLM's model class gives the attention layers sinks: every gpt-oss layer;
    Granite's as vLLM's ``granite_layer_attn_params`` decides (sinks where the config has
    ``layer_types``, as every SWA Granite's has, unless ``attention_sinks`` says
    otherwise)."""
    if hf.model_type == "gpt_oss":
        return True
    if hf.model_type not in GRANITE_SINK_MODEL_TYPES:
        return False
    from vllm.model_executor.models.granite import granite_layer_attn_params

    try:
        return bool(granite_layer_attn_params(hf, 0)[2])
    except Exception as exc:  # vLLM's model would fail on the same config
        raise PlanError(
            f"config.json: vLLM's {hf.model_type} model cannot read it: {first_line(exc)}"
        ) from exc


def check_kv_cache_quantization(
    quant_config: Any, kv_cache_dtype: str, loads_kv_scales: bool, label: str
) -> None:
    """What vLLM's attention layer refuses of the checkpoint's KV-cache quantization, as
    one line: a compressed-tensors ``kv_cache_scheme`` its KV-cache method rejects
    (``validate_kv_cache_scheme``; not an object: the layer fails reading it), and
    ``--kv-cache-dtype fp8_e5m2`` where the layers load KV scales (an fp8 checkpoint;
    not a compressed-tensors one that declares no scheme)."""
    scheme = getattr(quant_config, "kv_cache_scheme", None)
    if scheme is not None:
        from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
            CompressedTensorsKVCacheMethod,
        )

        if not isinstance(scheme, dict):
            raise PlanError(
                f"{label}'s kv_cache_scheme is a {type(scheme).__name__}, not an object: "
                "vLLM's attention layers fail reading it"
            )
        try:
            CompressedTensorsKVCacheMethod.validate_kv_cache_scheme(scheme)
        except Exception as exc:
            raise PlanError(
                f"vLLM refuses {label}'s kv_cache_scheme: {_what_is_wrong(exc)}"
            ) from exc
    compressed_without_scheme = scheme is None and hasattr(quant_config, "kv_cache_scheme")
    if kv_cache_dtype == "fp8_e5m2" and loads_kv_scales and not compressed_without_scheme:
        raise PlanError(
            f"--kv-cache-dtype fp8_e5m2: vLLM refuses it with {label}'s quantization "
            "(fp8_e5m2 kv-cache is not supported with fp8 checkpoints); use fp8"
        )


def per_head_kv_scales(quant_config: Any) -> bool:
    """Whether vLLM's attention layers ask per-head KV scales (compressed-tensors'
    ``kv_cache_scheme`` of the ``attn_head`` strategy)."""
    scheme = getattr(quant_config, "kv_cache_scheme", None)
    return isinstance(scheme, dict) and scheme.get("strategy") == "attn_head"


def device_capability(arch: str) -> Any:
    """The compute capability torch reports on ROCm for ``arch`` (gfx942: 9.4, gfx950:
    9.5, gfx90a: 9.0), as vLLM's backend selection is given it; None for an unknown one."""
    from vllm.platforms.interface import DeviceCapability

    found = re.fullmatch(r"gfx(\d+)([0-9a-f])[0-9a-f]", arch)
    return DeviceCapability(int(found[1]), int(found[2], 16)) if found else None


def layers_load_kv_scales(quant_config: Any) -> bool:
    """Whether vLLM gives this model's attention layers a KV-cache quantization method
    (every fp8 checkpoint's layers have one), asked of vLLM's own quantization config
    (:func:`vllm_quant_config`): the backend then gives each eligible layer tables of its
    own, whatever the scales (``asm_scale_tables.checkpoint_scales``)."""
    if quant_config is None:
        return False
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod

    layer = Attention.__new__(Attention)  # what quant configs test with isinstance
    try:
        method = quant_config.get_quant_method(layer, prefix="model.layers.0.self_attn.attn")
    except Exception:  # a method that reads the layer further: count tables as owned
        return True
    return isinstance(method, BaseKVCacheMethod)


def kv_cache_bytes_per_block(layers: list[PlanLayer]) -> int:
    """Bytes of one block of every layer's K and V."""
    return sum(layer.page_bytes for layer in layers)


def checkpoint_scales(model_dir: Path, label: str, model_config, num_layers: int):
    """Per-layer (K, V) scales as vLLM will use them, and a word on where they come from."""
    from .checkpoint_scales import (
        INDEX_NAME,
        CheckpointError,
        checkpoint_format,
        layer_scales,
        load_problem,
        read_kv_scales,
    )

    ones = [(1.0, 1.0)] * num_layers
    if label.startswith("preset "):
        return ones, "1.0 (a preset: config only, no checkpoint read)"
    weights = checkpoint_format(model_dir)
    if weights == "none" and (model_dir / INDEX_NAME).is_file():
        return ones, f"1.0 (config only: no shard of {INDEX_NAME} is here, none read)"
    if weights == "none":
        return ones, "1.0 (config only, no checkpoint read)"
    if weights == "pytorch-bin":
        return ones, "1.0 assumed (a .bin checkpoint: scales not read)"
    try:
        found = read_kv_scales(model_dir)
    except CheckpointError as exc:
        raise PlanError(str(exc)) from exc
    if found is None:
        return ones, "1.0 (none in the checkpoint)"
    quantization = getattr(model_config.hf_config, "quantization_config", None)
    if quantization is None:
        return ones, "1.0 (the checkpoint's are unused: config.json has no quantization_config)"
    if problem := load_problem(found, quantization):
        raise PlanError(f"{label}: {problem}")
    return layer_scales(found, num_layers), "checkpoint"


def switched_off() -> str | None:
    """Why the environment ``plan`` runs in turns the asm decode off, as vLLM would read
    it; None when it does not. ``VLLM_ROCM_USE_AITER`` counts only when set to a false
    value: ``plan`` describes a deployment that sets it (the plugin needs it)."""
    if not settings.asm_decode_switch():
        return f"{settings.SWITCH_ENV}=0 (the asm decode is off)"
    if settings.left_out_by_vllm_plugins():
        return f"VLLM_PLUGINS={os.environ['VLLM_PLUGINS']!r} leaves the plugin out"
    from vllm.envs import environment_variables  # vLLM's own reading, uncached

    for name in ("VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MHA"):
        value = os.environ.get(name)
        if name == "VLLM_ROCM_USE_AITER" and value is None:
            continue  # planned as the deployment sets it (a note says so)
        if not environment_variables[name]():
            shown = value if value and value.strip() == value else repr(value)
            return f"{name}={shown} (the asm decode is off)"
    return None


def block_id_sentence(aiter: AiterBuild, num_gpu_blocks: int | None, page_bytes: int | None) -> str:
    """What the AITER version means for this deployment, in one line."""
    limit = safe_blocks(page_bytes)
    if aiter.trusted:
        return f"{describe(aiter.version)}: trusted with every KV block ({settings.TRUST_ENV}=1)"
    if aiter.reads_high_block_ids:
        return f"{describe(aiter.version)}: reads every KV block right (fixed in {FIRST_FIXED})"
    who = (
        f"{describe(aiter.version)} (before {FIRST_FIXED})"
        if aiter.block_id_fix is False
        else f"{describe(aiter.version)} (counts as before {FIRST_FIXED}; --aiter-version V)"
    )
    if limit == 0:
        return f"{who}: a KV page of {page_bytes} bytes ends past 2 GiB: every layer keeps HIP"
    if num_gpu_blocks is None:
        return (
            f"{who}: caches over {limit} blocks keep HIP; the block count decides "
            "(--num-gpu-blocks N)"
        )
    if num_gpu_blocks <= limit:
        return f"{who}: {num_gpu_blocks} blocks, within {limit}: no effect"
    return f"{who}: {num_gpu_blocks} blocks > {limit}: every layer keeps HIP"


def page_span_sentence(aiter: AiterBuild, num_gpu_blocks: int | None, page_bytes: int) -> str:
    """What the page-span guard does for this deployment, in one line."""
    reach = SPAN_LIMIT // page_bytes + 1  # blocks from which two pages can be that far apart
    if num_gpu_blocks is not None and num_gpu_blocks <= reach:
        return f"{num_gpu_blocks} blocks: no two pages 2 GiB apart, no probe"
    how = (
        f"trusted ({settings.TRUST_ENV}=1)"
        if aiter.trusted
        else "proven on the GPU by a probe at bind time, or the layers keep HIP"
    )
    if num_gpu_blocks is None:
        return f"caches of more than {reach} blocks (pages 2 GiB apart): {how}"
    span = (num_gpu_blocks - 1) * page_bytes / 2**30
    return f"{num_gpu_blocks} blocks, pages up to {span:.1f} GiB apart: {how}"


def make_plan(
    model: str = DEFAULT_PRESET,
    gpu: str | None = None,
    tensor_parallel_size: int = 1,
    kv_cache_dtype: str = "fp8",
    block_size: int = 16,
    dtype: str = "auto",
    max_model_len: int | None = None,
    aiter_version: str | None = "installed",
    num_gpu_blocks: int | None = None,
    cudagraph_mode: str = "FULL_AND_PIECEWISE",
    language_model_only: bool = False,
    trust_remote_code: bool = False,
) -> Plan:
    """The plan; ``aiter_version="installed"`` reads the installed AITER's (None: unknown)."""
    check_model_path(model)
    model_dir, label = resolve_model_dir(model)
    check_config(model_dir, dtype)
    the_gpu = resolve_gpu(gpu)
    model_config = _model_config(
        model_dir, label, dtype, max_model_len, language_model_only, trust_remote_code
    )
    check_attention_kind(model_config)
    quant_config = vllm_quant_config(model_config, label)
    loads_kv_scales = layers_load_kv_scales(quant_config)
    asked = kv_cache_dtype
    kv_cache_dtype = served_kv_cache_dtype(model_config, asked, quant_config)
    check_kv_cache_quantization(quant_config, kv_cache_dtype, loads_kv_scales, label)
    layers = plan_layers(
        model_config,
        tp=tensor_parallel_size,
        kv_cache_dtype=kv_cache_dtype,
        block_size=block_size,
        num_blocks=num_gpu_blocks or 1,
        arch=the_gpu.arch,
        per_head_scales=per_head_kv_scales(quant_config),
    )
    if the_gpu.memory_gib is not None:  # without --num-gpu-blocks: one block
        per_block = kv_cache_bytes_per_block(layers)
        kv_bytes = (num_gpu_blocks or 1) * per_block
        smallest = per_block // block_size * ROCM_ATTN_BLOCK_MULTIPLE
        if smallest > the_gpu.memory_gib * 1024**3:  # the config's doing, not an option's
            kv_heads = layers[0].impl.num_kv_heads
            model = (
                f"{label}'s config.json, as vLLM reads it, gives {heads_text(kv_heads, 'KV')} per "
                f"rank of head size {layers[0].impl.head_size} in {len(layers)} layers"
            )
            fix = smaller_block_fix(
                smallest,
                the_gpu.memory_gib * 1024**3,
                model_config.model_arch_config.total_num_attention_heads,
                model_config.get_total_num_kv_heads(),
                tensor_parallel_size,
                kv_cache_dtype,
            )
            raise PlanError(
                cache_too_large(None, block_size, smallest, the_gpu, model=model, fix=fix)
            )
        if kv_bytes > the_gpu.memory_gib * 1024**3:
            raise PlanError(cache_too_large(num_gpu_blocks, block_size, kv_bytes, the_gpu))
    full_attention = any(layer.impl.sliding_window == (-1, -1) for layer in layers)
    if num_gpu_blocks is not None and full_attention:
        # vLLM holds one block back (the null block) and will not start unless the rest
        # hold one request at max_model_len (kv_cache_planning's admission check).
        needed = -(-model_config.max_model_len // block_size) + 1
        if num_gpu_blocks < needed:
            raise PlanError(
                f"--num-gpu-blocks {num_gpu_blocks}: one request at max_model_len "
                f"{model_config.max_model_len} needs {needed} blocks of {block_size} tokens "
                "(the null block included), and vLLM does not start with fewer; give at "
                f"least {needed}, or a smaller --max-model-len"
            )
    version = installed_version() if aiter_version == "installed" else aiter_version
    aiter = AiterBuild(version, trusted=settings.trust_aiter())
    scales, scales_source = checkpoint_scales(model_dir, label, model_config, len(layers))
    table = kernel_table_for(the_gpu.arch)
    # Without --num-gpu-blocks the cache has one block: the block-id clause waits for it.
    per_layer = [
        rejection_reasons(layer.impl, layer.kv_cache, model_config, table, aiter)
        + ([layer.kept_on_hip] if layer.kept_on_hip else [])
        for layer in layers
    ]
    # A layer kept on HIP by max_model_len alone also gets what AITER's guards would say
    # were it lowered, so that no note promises that lowering it is enough.
    for reasons, layer in zip(per_layer, layers, strict=True):
        lengths = [r for r in reasons if r.startswith("max_model_len ")]
        if lengths and all(r in lengths or r == FP16_UNPROVEN for r in reasons):
            guards = guard_reasons(layer.impl, layer.kv_cache, model_config, table, aiter)
            reasons += [g for g in guards if g not in reasons]
    notes: list[str] = []
    in_tree = vllm_carries_asm_decode()
    if in_tree:
        notes.append(
            f"the vLLM imported here carries the asm decode itself ({IN_TREE_MODULE}): "
            "the plugin stays inactive there, and that vLLM's asm decode reads none of the "
            "VLLM_ROCM_ASM_DECODE* settings (it is off by default there: "
            "--attention-config.use_aiter_asm_decode=true turns it on); this plan is what "
            "the plugin does on a stock vLLM 0.33 "
            "(the project's docs/upstream.md says where the in-tree change differs)"
        )
    if gpu is None and the_gpu is GPUS[DEFAULT_GPU]:  # resolve_gpu found no ROCm GPU
        notes.append(
            f"no ROCm GPU here: planned for {the_gpu.name}, the default "
            f"(--gpu {', '.join(GPUS)} picks one)"
        )
    if os.environ.get("VLLM_ROCM_USE_AITER") is None:
        notes.append(
            "VLLM_ROCM_USE_AITER is unset here: planned as the deployment sets it to 1 (the "
            "plugin needs it; unset, AITER and so the asm decode are off)"
        )
    if language_model_only and model_config.is_multimodal_model:
        notes.append(
            "--language-model-only: planned is the text model alone, as vLLM serves it "
            "then (no image or other inputs, no multimodal prefix attention)"
        )
    if kv_cache_dtype != asked:
        notes.append(
            f"--kv-cache-dtype {asked}: the checkpoint's quantization_config declares its KV "
            f"cache, so vLLM serves it as {kv_cache_dtype}"
        )
    pooling = model_config.runner_type == "pooling"
    if pooling:
        per_layer = [[*r, POOLING_MODEL] for r in per_layer]
    if off := switched_off():  # as vLLM would read the environment plan runs in
        per_layer = [[*r, off] for r in per_layer]
    eligible = [not r for r in per_layer]
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, reasons in enumerate(per_layer):
        groups.setdefault(tuple(reasons), []).append(i)
    cut = resolve_cut(the_gpu.compute_units, settings.cut_override())
    first = layers[0]
    heads = first.impl.num_heads
    any_eligible = any(eligible)

    kv_heads = first.impl.num_kv_heads
    model_time = original_time_model()

    def kernel(num_seqs: int) -> str:
        """The kernel vLLM captures for this many sequences (a graph replays it for any
        lengths), or, where steps are decided on their lengths, the kernel of a step of
        short contexts: the cut alone decides."""
        step = SimpleNamespace(
            max_query_len=1,
            num_reqs=num_seqs,
            num_actual_tokens=num_seqs,
            max_seq_len=1,  # vLLM captures with every sequence at one token
            seq_lens_cpu_upper_bound=None,
        )
        return "asm" if any_eligible and use_asm_decode(step, heads, cut) else "hip"  # type: ignore[arg-type]

    import torch

    skew = settings.skew_override()
    skew = ASM_SKEW_RATIO if skew is None else skew
    per_step = cudagraph_mode in PER_STEP_MODES

    def worst(num_seqs: int, captured: str) -> dict[str, Any]:
        """Both kernels' time on the worst step of this size (one request at
        max_model_len, the others at one token; the time model), and the kernel that
        step runs: a captured graph's for any lengths, or where steps are decided on
        their lengths, the skew clause's decision on that step."""
        contexts = [model_config.max_model_len] + [1] * (num_seqs - 1)
        step = SimpleNamespace(
            max_seq_len=contexts[0], seq_lens_cpu_upper_bound=torch.tensor(contexts)
        )
        skewed = per_step and asm_decode_skewed(step, num_seqs, kv_heads, skew)  # type: ignore[arg-type]
        return {
            "worst_asm_us": round(model_time.asm_us(contexts, kv_heads), 1),
            "worst_hip_us": round(model_time.hip_us(contexts, kv_heads), 1),
            "worst_kernel": "hip" if skewed else captured,
        }

    sizes = default_capture_sizes()
    # FULL captures each graph from a batch whose max_query_len is its token count (a
    # mixed-looking batch), so the captured decode is HIP; FULL_AND_PIECEWISE and
    # FULL_DECODE_ONLY capture pure decodes as uniform decodes; PIECEWISE and NONE run
    # attention outside any graph, so each step is decided on its lengths.
    full = cudagraph_mode == "FULL"
    batches = []
    for n in [] if pooling else sizes:  # a pooling model has no decode step
        captured = "hip" if full else kernel(n)
        batches.append(
            {"num_seqs": n, "query_heads": n * heads, "kernel": captured} | worst(n, captured)
        )
    if full and any_eligible:
        notes.append(
            "cudagraph_mode FULL captures every graph as a mixed batch: the captured "
            f"graphs (up to {sizes[-1]} sequences) hold the HIP decode, and asm runs only on "
            f"eager pure-decode steps of more than {sizes[-1]} sequences; FULL_AND_PIECEWISE "
            "(vLLM's default) or FULL_DECODE_ONLY capture the decode graphs on asm"
        )
    if not any_eligible and all(
        r.startswith("max_model_len ") for reasons in per_layer for r in reasons
    ):
        notes.append(
            f"only max_model_len keeps HIP: with --max-model-len {ASM_MAX_MODEL_LEN} or less "
            "(what the original change served) every layer is eligible"
        )
    if not any_eligible and kv_cache_dtype not in ASM_KV_DTYPES:
        notes.append(
            f"--kv-cache-dtype {kv_cache_dtype} keeps every layer on HIP: the asm decode reads an "
            "fp8 e4m3 cache (--kv-cache-dtype fp8)"
        )
    if any_eligible and model_config.max_model_len > VALIDATED_CONTEXT:
        notes.append(
            f"max_model_len {model_config.max_model_len}: contexts above "
            f"{VALIDATED_CONTEXT} tokens are not validated on hardware"
        )
    if cut != default_cut(the_gpu.compute_units):
        notes.append(f"cut {describe_cut(the_gpu.compute_units, settings.cut_source())}")
    tables, table_bytes_per_block = table_count(layers, eligible, scales, loads_kv_scales)
    return Plan(
        model=label,
        gpu=the_gpu.name,
        arch=the_gpu.arch,
        compute_units=the_gpu.compute_units,
        tensor_parallel_size=tensor_parallel_size,
        kv_cache_dtype=kv_cache_dtype,
        block_size=block_size,
        dtype=str(model_config.dtype).removeprefix("torch."),
        cut_query_heads=cut,
        cut_source=describe_cut(the_gpu.compute_units, settings.cut_source()),
        num_layers=len(layers),
        num_heads_per_rank=heads,
        num_kv_heads_per_rank=first.impl.num_kv_heads,
        head_size=first.impl.head_size,
        max_model_len=model_config.max_model_len,
        kernel_table=table.source,
        eligible=any_eligible,
        eligible_layers=sum(eligible),
        reasons=sorted({r for reasons in per_layer for r in reasons}),
        layer_groups=[
            LayerGroup(layers=idx, eligible=not reasons, reasons=list(reasons))
            for reasons, idx in groups.items()
        ],
        batches=batches,
        scale_tables=tables,
        scale_table_fraction=table_bytes_per_block / kv_cache_bytes_per_block(layers),
        kv_scales=scales_source,
        aiter_version=version,
        block_id_fix=aiter.block_id_fix,
        num_gpu_blocks=num_gpu_blocks,
        block_id_clause=block_id_sentence(
            aiter, num_gpu_blocks, kv_page_bytes(first.impl, first.kv_cache)
        ),
        mixed_asm_from_decodes=cut // heads + 1 if any_eligible and not full else None,
        scale_table_bytes=None
        if num_gpu_blocks is None
        else table_bytes_per_block * num_gpu_blocks,
        scale_table_aliased_bytes=tables * ALIASED_CHUNK,
        page_span_clause=page_span_sentence(
            aiter, num_gpu_blocks, kv_page_bytes(first.impl, first.kv_cache)
        ),
        skew_ratio=skew,
        cudagraph_mode=cudagraph_mode,
        decided_per_step=per_step,
        vllm_carries_asm_decode=in_tree,
        notes=notes,
    )


def _ranges(idx: list[int]) -> str:
    out, start = [], idx[0]
    for a, b in zip(idx, [*idx[1:], None], strict=True):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


def render(plan: Plan) -> str:
    """The human-readable plan."""
    gqa = plan.num_heads_per_rank // max(1, plan.num_kv_heads_per_rank)
    lines = [
        f"model      {plan.model}",
        f"gpu        {plan.gpu} ({plan.arch}, {plan.compute_units} CUs), "
        f"TP {plan.tensor_parallel_size}",
        f"attention  {plan.num_layers} layer{'s' * (plan.num_layers != 1)}; "
        f"per rank {plan.num_heads_per_rank} query / "
        f"{heads_text(plan.num_kv_heads_per_rank, 'KV')} (GQA {gqa}), head size {plan.head_size}; "
        f"{plan.dtype}, {plan.kv_cache_dtype} KV cache, block {plan.block_size}, "
        f"max_model_len {plan.max_model_len}",
        f"kernels    {plan.kernel_table}",
        f"aiter      {plan.block_id_clause}",
        f"cut        pure-decode steps above {plan.cut_query_heads} query heads "
        f"({plan.cut_source}) run asm",
        "skew       "
        + (
            f"a step whose longest context x {plan.skew_ratio} passes its head-tokens "
            f"(contexts x KV heads) + {ASM_SKEW_HEAD_TOKENS} keeps HIP; "
            + (
                f"no graph holds the attention (cudagraph_mode {plan.cudagraph_mode}): each "
                "step is decided on its lengths (worst case below)"
                if plan.decided_per_step
                else "captured graphs hold their kernel for any lengths (worst case below)"
            )
            if plan.skew_ratio
            else f"off ({settings.SKEW_ENV}=0)"
        ),
        f"page span  {plan.page_span_clause}",
        "mixed      "
        + (
            "no layer is eligible"
            if not plan.eligible
            else "prefill+decode steps stay whole on HIP under cudagraph_mode FULL"
            if plan.mixed_asm_from_decodes is None
            else f"a prefill+decode step runs its decode part on asm from "
            f"{plan.mixed_asm_from_decodes} decode requests on (not with speculative "
            "decoding)"
        ),
        "",
    ]
    if plan.eligible:
        size = (
            ""
            if plan.scale_table_bytes is None
            else f", {plan.scale_table_bytes / 1024**2:.1f} MiB at {plan.num_gpu_blocks} blocks"
        )
        lines.append(
            f"asm decode: {plan.eligible_layers} of {plan.num_layers} layers eligible; "
            f"{plan.scale_tables} scale table(s): aliased, about "
            f"{plan.scale_table_aliased_bytes / 1024**2:.0f} MiB of device memory (GPU virtual "
            f"memory); allocated where there is none, {plan.scale_table_fraction * 100:.3f} % of "
            f"the KV cache{size}; KV scales: {plan.kv_scales}"
        )
    else:
        lines.append("asm decode: no layer is eligible; every step keeps the HIP decode")
    if len(plan.layer_groups) > 1 or not plan.eligible:
        for g in plan.layer_groups:
            what = "asm" if g.eligible else "HIP: " + "; ".join(g.reasons)
            lines.append(f"  layers {_ranges(g.layers)}: {what}")
    lines += [f"note: {n}" for n in plan.notes]
    if not plan.batches:
        return "\n".join([*lines, "", "no decode kernel table: the model runs no decode step"])
    mode = plan.cudagraph_mode
    # NONE captures no graph; PIECEWISE's graphs leave the attention out.
    sizes = "these batch sizes" if mode == "NONE" else "vLLM's capture sizes"
    lines += [
        "",
        f"decode kernel at {sizes}, for short contexts (cudagraph_mode {mode}: no graph "
        "holds the attention; each step is decided on its lengths);"
        if plan.decided_per_step
        else f"decode kernel at vLLM's CUDA-graph batch sizes (cudagraph_mode {mode});",
        f"worst case: one request at max_model_len {plan.max_model_len}, the others at one "
        "token, µs per layer (time model fitted to MI355X), and the kernel it runs:",
        "  seqs  query heads  kernel  worst asm  worst HIP  worst runs",
    ]
    lines += [
        f"  {b['num_seqs']:>4}  {b['query_heads']:>11}  {b['kernel']:<6}  "
        f"{b['worst_asm_us']:>9.1f}  {b['worst_hip_us']:>9.1f}  {b['worst_kernel']}"
        for b in plan.batches
    ]
    return "\n".join(lines)
