"""What the plugin lets run the asm decode: :mod:`.core`'s rule, and around it the
guards only a plugin needs, because it runs on whatever AITER is installed.

Per layer (once, at bind time), :func:`rejection_reasons` is the core rule's reasons
and, where the core rule passes, the guards':

* the installed AITER's kernel table (``pa_asm.csv``) has the ultra-precision row the
  launcher would pick, and that row's ``.co`` file is installed (:mod:`.kernel_table`);
* an AITER before 0.1.17 is kept away from caches of more blocks than it reads right
  (:mod:`.aiter_version`);
* fp16 queries wait for proof: AITER's accuracy test runs the ultra-precision kernel
  for bf16 queries only (``op_tests/test_pa.py``; its
  ``op_tests/test_pa_block_id_truncation.py`` runs fp16 too, but as a one-block
  fingerprint of the block-id fix, not against a reference), and so did every
  measurement of the original change. ``VLLM_ROCM_ASM_DECODE_TRUST_AITER=1`` (this
  AITER build passed ``doctor``, whose self-test runs an fp16 probe) admits them, as
  it admits high KV blocks.

Per step, the cut is the core's ``2 x compute units`` unless
``VLLM_ROCM_ASM_DECODE_CUT`` moves it (:func:`resolve_cut`); per call,
:func:`call_uses_asm` checks what the kernel reads of the call's tensors. Memory for
the scale tables is budgeted in :mod:`.scale_tables`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from vllm.config import ModelConfig
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.ops.paged_attn import PagedAttention

from .aiter_version import AiterBuild
from .core import ASM_HEADS_PER_CU, ASM_PRECISION, asm_decode_rejections
from .kernel_table import KernelTable, dtype_name

if TYPE_CHECKING:
    from vllm.v1.attention.backends.rocm_attn import RocmAttentionImpl

#: Why fp16-query layers keep HIP until this AITER build is trusted.
FP16_UNPROVEN = (
    "fp16 queries (AITER's accuracy test runs its ultra-precision kernel for bf16 "
    "only: trusted once doctor's fp16 probe passed on this GPU)"
)

#: Longest context validated on hardware (passkey retrieval, in the original change's
#: runs); longer ones are unvalidated (the start-up line says so).
VALIDATED_CONTEXT = 32768
#: The GPUs AITER ships ultra-precision asm decode kernels for (vLLM's ``on_mi3xx()``).
MI3XX = ("gfx942", "gfx950")
#: The core rule's reason for any other GPU (the plugin adds which it is).
OTHER_GPU = "a GPU other than gfx942/gfx950"


def kv_page_bytes(impl: RocmAttentionImpl, kv_cache: torch.Tensor) -> int:
    """Bytes from one K page to the next: the block stride the launcher passes."""
    key_cache, _ = split_cache(impl, kv_cache)
    return key_cache.stride(0) * key_cache.element_size()


def split_cache(
    impl: RocmAttentionImpl, kv_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's K ``[nb, nkv, hd/x, bs, x]`` and V ``[nb, nkv, hd, bs]`` views of a
    layer's bound cache, as ``RocmAttentionImpl.forward`` makes them."""
    return PagedAttention.split_kv_cache(
        kv_cache.transpose(0, 1), impl.num_kv_heads, impl.head_size
    )


def guard_reasons(
    impl: RocmAttentionImpl,
    kv_cache: torch.Tensor,
    model_config: ModelConfig,
    kernels: KernelTable,
    aiter: AiterBuild,
) -> list[str]:
    """What the installed AITER has not proven for a layer the core rule admits."""
    reasons = []
    key_cache, _ = split_cache(impl, kv_cache)
    gqa = impl.num_heads // impl.num_kv_heads
    # Launcher: no table row -> hard error. Asked for exactly as the call will ask.
    row = kernels.find(
        q_type=dtype_name(model_config.dtype) or "",
        kv_type="fp8",
        gqa=gqa,
        block_size=key_cache.shape[3],
        high_precision=ASM_PRECISION,
    )
    if row is None:
        reasons.append(
            f"GQA {gqa} has no ultra-precision asm kernel on {kernels.arch} "
            f"({kernels.source})"
        )
    elif (missing := kernels.missing_file(row)) is not None:
        # Launcher: loads the row's .co file at the first call -> hard error if absent.
        reasons.append(f"kernel file {missing} not installed (listed in pa_asm.csv)")
    # AITER before 0.1.17 misaddresses blocks >= 65536 or past 2 GiB, silently.
    problem = aiter.block_id_problem(key_cache.shape[0], kv_page_bytes(impl, kv_cache))
    if problem:
        reasons.append(problem)
    if model_config.dtype == torch.float16 and not aiter.trusted:
        reasons.append(FP16_UNPROVEN)
    return reasons


def rejection_reasons(
    impl: RocmAttentionImpl,
    kv_cache: torch.Tensor,
    model_config: ModelConfig,
    kernels: KernelTable,
    aiter: AiterBuild,
) -> list[str]:
    """Why this layer keeps the HIP decode in the plugin; empty when it may run asm.
    The core rule's reasons, else the guards' (which ask AITER for what the rule
    admits). The fp16 proof is asked for either way: a user who fixes the rule's
    reasons should not find it only then."""
    reasons = [
        f"{reason} ({kernels.arch or 'unknown'})" if reason == OTHER_GPU else reason
        for reason in asm_decode_rejections(
            impl, kv_cache, model_config, kernels.arch in MI3XX
        )
    ]
    if not reasons:
        return guard_reasons(impl, kv_cache, model_config, kernels, aiter)
    decoder = impl.attn_type == AttentionType.DECODER
    if decoder and model_config.dtype == torch.float16 and not aiter.trusted:
        reasons.append(FP16_UNPROVEN)
    return reasons


def default_cut(compute_units: int) -> int:
    """The core's cut: query heads above which the asm kernel fills the GPU."""
    return ASM_HEADS_PER_CU * compute_units


def resolve_cut(compute_units: int, override: int | None = None) -> int:
    """``override`` (``VLLM_ROCM_ASM_DECODE_CUT``) when set, else the core's."""
    return override if override is not None else default_cut(compute_units)


def describe_cut(compute_units: int, override_source: str | None = None) -> str:
    """Where the cut comes from, for logs and ``plan``: ``override_source`` (the setting
    that overrode it) or the compute units."""
    if override_source is not None:
        return f"set by {override_source}"
    return f"{ASM_HEADS_PER_CU} x {compute_units} CUs"


def call_uses_asm(
    *,
    step_asm: bool,
    layer_eligible: bool,
    output_quant_requested: bool,
    tensors_ok: bool,
) -> bool:
    """Whether one ``forward`` call runs the asm kernel: the step chose it, the layer is
    bound, no fused output quantization was asked for, and the call's tensors are what
    the kernel reads (the layer's query dtype with dense heads, a dense output)."""
    return step_asm and layer_eligible and not output_quant_requested and tensors_ok
