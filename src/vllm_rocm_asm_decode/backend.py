"""``ROCM_ATTN`` with an asm decode: subclasses of vLLM's own backend, builder and impl.

Data flow, decide once and run many:

1. At the first ``build()`` after the KV cache is bound, the builder loads the AITER
   kernel (:mod:`.kernel`) and decides its layers (:func:`decide_layers`): each layer is
   checked against :mod:`.eligibility`; the scale tables of those that pass are budgeted
   against free device memory (:mod:`.scale_tables`); the layers that fit keep the
   cache views the kernel reads and their tables, the rest keep the HIP decode.
2. Every ``build()`` decides the step from host integers (:func:`.decision.step_uses_asm`)
   and records it in the metadata, so a captured CUDA graph holds one decode kernel.
3. ``forward`` combines the step with the layer's binding and the call's arguments and
   either calls ``pa_fwd_asm`` on views it already holds, or runs stock ``forward``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.config import VllmConfig, get_layers_from_vllm_config
from vllm.model_executor.layers.attention import Attention
from vllm.v1.attention.backend import AttentionType, CommonAttentionMetadata
from vllm.v1.attention.backends.rocm_attn import (
    RocmAttentionBackend,
    RocmAttentionImpl,
    RocmAttentionMetadata,
    RocmAttentionMetadataBuilder,
)
from vllm.v1.attention.ops.chunked_prefill_paged_decode import has_native_kv_cache_layout
from vllm.v1.attention.ops.paged_attn import PagedAttention
from vllm.v1.kv_cache_interface import AttentionSpec

from . import settings
from .aiter_version import BLOCK_ID_LIMIT
from .decision import call_uses_asm, describe_cut, resolve_cut, step_uses_asm
from .eligibility import VALIDATED_CONTEXT, LayerFacts, rejection_reasons
from .kernel import AsmKernel, current_arch, load_asm_kernel
from .kernel_table import ULTRA_PRECISION
from .log import logger
from .scale_tables import (
    TableKey,
    existing_tables,
    fit_tables,
    free_device_memory,
    mib,
    scale_tables,
    table_key,
)

_announced = False


@dataclass
class RocmAsmDecodeMetadata(RocmAttentionMetadata):
    """``RocmAttentionMetadata`` plus the step's decode kernel choice."""

    use_asm_decode: bool = False


@dataclass(frozen=True)
class AsmLayerBinding:
    """What one layer's asm decode reads, made once when its KV cache is bound."""

    kv_cache: torch.Tensor  # the bound cache these views were made from
    key_cache: torch.Tensor  # [num_blocks, num_kv_heads, head_size/16, 16, 16], fp8
    value_cache: torch.Tensor  # [num_blocks, num_kv_heads, 1, head_size, 16], fp8
    k_scale: float
    v_scale: float
    k_scale_table: torch.Tensor  # [num_blocks, num_kv_heads, 16], fp32, shared
    v_scale_table: torch.Tensor
    query_dtype: torch.dtype
    kernel: AsmKernel


class RocmAsmDecodeImpl(RocmAttentionImpl):
    """``RocmAttentionImpl`` whose pure-decode steps above the cut may run ``pa_fwd_asm``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Always 2 (ultra precision) in serving; ``bench kernel --precision default``
        #: sets 1 to time AITER's default-precision kernel on the same path.
        self.asm_high_precision = ULTRA_PRECISION
        self.asm_binding: AsmLayerBinding | None = None
        #: Why this layer stays on HIP; None until the layer is decided.
        self.asm_rejections: list[str] | None = None
        #: (kernel, query dtype, max_model_len) of the last decision, to decide again.
        self._asm_context: tuple[AsmKernel, torch.dtype, int] | None = None

    def layer_facts(
        self, kv_cache: torch.Tensor, query_dtype: torch.dtype, max_model_len: int
    ) -> LayerFacts:
        key_cache, value_cache = self._split(kv_cache)
        return LayerFacts(
            kv_cache_dtype=self.kv_cache_dtype,
            block_size=value_cache.shape[3],
            head_size=self.head_size,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            query_dtype=query_dtype,
            scale=self.scale,
            sliding_window=self.sliding_window != (-1, -1),
            alibi=self.alibi_slopes is not None,
            logits_soft_cap=float(self.logits_soft_cap or 0),
            sinks=self.sinks is not None,
            decoder_self_attention=self.attn_type == AttentionType.DECODER,
            native_kv_layout=has_native_kv_cache_layout(key_cache, value_cache),
            max_model_len=max_model_len,
            num_blocks=key_cache.shape[0],
        )

    def _split(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return PagedAttention.split_kv_cache(
            kv_cache.transpose(0, 1), self.num_kv_heads, self.head_size
        )

    def scale_table_keys(
        self, layer: torch.nn.Module, kv_cache: torch.Tensor
    ) -> tuple[TableKey, TableKey]:
        """The shared tables this layer's binding will use, shaped as the kernel indexes
        them: K's block count, KV heads and block size, at the layer's final scales."""
        num_blocks, num_kv_heads, _, block_size, _ = self._split(kv_cache)[0].shape
        return (
            table_key(kv_cache.device, num_blocks, num_kv_heads, block_size, layer._k_scale_float),
            table_key(kv_cache.device, num_blocks, num_kv_heads, block_size, layer._v_scale_float),
        )

    def keep_hip(self, reasons: list[str]) -> None:
        """Decide this layer for the HIP decode, for ``reasons``."""
        self.asm_rejections = reasons
        self.asm_binding = None

    def bind_asm(
        self,
        layer: torch.nn.Module,
        kv_cache: torch.Tensor,
        kernel: AsmKernel,
        query_dtype: torch.dtype,
        max_model_len: int,
    ) -> None:
        """Decide this (eligible) layer for the asm decode: make its views and tables."""
        key_cache, value_cache = self._split(kv_cache)
        key_cache = key_cache.view(self.fp8_dtype)
        # [nb, nkv, head_size, 16] is AITER's shuffled [nb, nkv, 16/16, head_size, 16].
        value_cache = value_cache.view(self.fp8_dtype).unsqueeze(2)
        k_scale, v_scale = float(layer._k_scale_float), float(layer._v_scale_float)
        num_blocks, num_kv_heads, _, block_size, _ = key_cache.shape
        k_table, v_table = scale_tables(
            kv_cache.device, num_blocks, num_kv_heads, block_size, k_scale, v_scale
        )
        self.asm_rejections = []
        self._asm_context = (kernel, query_dtype, max_model_len)
        self.asm_binding = AsmLayerBinding(
            kv_cache=kv_cache,
            key_cache=key_cache,
            value_cache=value_cache,
            k_scale=k_scale,
            v_scale=v_scale,
            k_scale_table=k_table,
            v_scale_table=v_table,
            query_dtype=query_dtype,
            kernel=kernel,
        )

    def _rebind(self, layer: torch.nn.Module, kv_cache: torch.Tensor) -> AsmLayerBinding | None:
        """The cache was re-bound or the scales reloaded: decide and bind the layer again."""
        assert self._asm_context is not None
        decide_layers([(layer, kv_cache)], *self._asm_context, when="after a KV cache re-bind")
        return self.asm_binding

    def _binding_for_call(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        output: torch.Tensor,
        output_quant_requested: bool,
    ) -> AsmLayerBinding | None:
        """For a step that chose asm on an eligible layer: the binding to run this call
        with, or None when the call must take the stock path."""
        binding = self.asm_binding
        assert binding is not None
        if not call_uses_asm(
            step_asm=True,
            layer_eligible=True,
            output_quant_requested=output_quant_requested,
            # The kernel gets Q's row stride only (heads and dims dense) and writes out_
            # densely from its base.
            tensors_ok=query.dtype == binding.query_dtype
            and query.stride(-1) == 1
            and query.stride(-2) == self.head_size
            and output.is_contiguous(),
        ):
            return None
        if (
            kv_cache is not binding.kv_cache
            or layer._k_scale_float != binding.k_scale
            or layer._v_scale_float != binding.v_scale
        ):
            return self._rebind(layer, kv_cache)
        return binding

    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: RocmAttentionMetadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # The step's choice and the layer's eligibility first: one attribute read each,
        # so steps that stay on stock pay next to nothing for the plugin.
        if self.asm_binding is not None and getattr(attn_metadata, "use_asm_decode", False):
            binding = self._binding_for_call(
                layer,
                query,
                kv_cache,
                output,
                output_scale is not None or output_block_scale is not None,
            )
            if binding is not None:
                num_tokens = attn_metadata.num_actual_tokens
                block_table = attn_metadata.block_table
                binding.kernel.run(
                    Q=query[:num_tokens],
                    K=binding.key_cache,
                    V=binding.value_cache,
                    block_tables=block_table,
                    context_lens=attn_metadata.seq_lens,
                    block_tables_stride0=block_table.stride(0),
                    K_QScale=binding.k_scale_table,
                    V_QScale=binding.v_scale_table,
                    out_=output[:num_tokens],
                    high_precision=self.asm_high_precision,
                )
                return output
        return super().forward(
            layer,
            query,
            key,
            value,
            kv_cache,
            attn_metadata,
            output,
            output_scale,
            output_block_scale,
        )


class RocmAsmDecodeMetadataBuilder(RocmAttentionMetadataBuilder):
    """``RocmAttentionMetadataBuilder`` that binds its layers once and decides each step."""

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.asm_layers_bound = False
        self.asm_eligible_layers = 0
        self.asm_cut = 0

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> RocmAsmDecodeMetadata:
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
        if not self.asm_layers_bound:
            self._bind_layers()
        use_asm = self.asm_eligible_layers > 0 and step_uses_asm(
            max_query_len=metadata.max_query_len,
            num_tokens=metadata.num_actual_tokens,
            num_reqs=metadata.seq_lens.shape[0],
            num_heads=self.num_heads_q,
            cut=self.asm_cut,
        )
        return RocmAsmDecodeMetadata(**vars(metadata), use_asm_decode=use_asm)

    def _bind_layers(self) -> None:
        layers = [
            layer
            for layer in get_layers_from_vllm_config(
                self.vllm_config, Attention, self.layer_names
            ).values()
            if isinstance(layer.impl, RocmAsmDecodeImpl)
        ]
        cached = [layer for layer in layers if layer.impl.attn_type == AttentionType.DECODER]
        if any(layer.kv_cache.dim() != 4 for layer in cached):
            return  # the KV cache is not bound yet (profiling): decide at a later build
        self.asm_layers_bound = True
        arch = current_arch()
        kernel, why_not = load_asm_kernel(arch)
        if kernel is None:
            logger.warning_once(
                "ROCM_ATTN asm decode is off: %s; every layer keeps the HIP decode", why_not
            )
            return
        if kernel.table_note is not None:
            logger.warning_once(
                "ROCM_ATTN asm decode: AITER's kernel table was not read (%s); assuming %s",
                kernel.table_note,
                kernel.table.source,
            )
        from vllm.utils.platform_utils import num_compute_units

        compute_units = num_compute_units()
        self.asm_cut = resolve_cut(compute_units)
        model_config = self.vllm_config.model_config
        for layer in layers:
            if layer.impl.attn_type != AttentionType.DECODER:
                # Encoder attention has no paged KV cache to decode from.
                layer.impl.keep_hip(["not decoder self-attention"])
        eligible = decide_layers(
            [(layer, layer.kv_cache) for layer in cached],
            kernel,
            model_config.dtype,
            model_config.max_model_len,
        )
        for layer in layers:
            for reason in layer.impl.asm_rejections or ():
                logger.info_once("ROCM_ATTN asm decode: layers with %s keep the HIP decode", reason)
        self.asm_eligible_layers = eligible
        _announce(self, arch, compute_units, eligible, len(layers), model_config.max_model_len)


def decide_layers(
    entries: list[tuple[torch.nn.Module, torch.Tensor]],
    kernel: AsmKernel,
    query_dtype: torch.dtype,
    max_model_len: int,
    when: str | None = None,
) -> int:
    """Decide decoder layers (with their bound caches) for asm or HIP; returns how many
    are bound for asm.

    Each layer is checked against the rule; the scale tables of those that pass are
    budgeted against one free-memory reading of their device, in layer order, and the
    layers whose tables do not fit keep the HIP decode too. ``when`` (e.g. after a
    re-bind) makes every reason a warning that says so.
    """
    candidates = []
    for layer, kv_cache in entries:
        impl = layer.impl
        reasons = rejection_reasons(
            impl.layer_facts(kv_cache, query_dtype, max_model_len), kernel.table, kernel.aiter
        )
        if reasons:
            impl.keep_hip(reasons)
        else:
            candidates.append((layer, kv_cache))
    if candidates:
        device = candidates[0][1].device
        budget = fit_tables(
            [layer.impl.scale_table_keys(layer, kv_cache) for layer, kv_cache in candidates],
            free_device_memory(device),
            existing_tables(),
        )
        kv_bytes = sum(
            {kv.data_ptr(): kv.numel() * kv.element_size() for _, kv in entries}.values()
        )
        logger.info(
            "ROCM_ATTN asm decode: %d scale table(s) for %d layer(s), %s, %.3f %% of their "
            "KV cache",
            budget.tables,
            len(candidates),
            mib(budget.bytes),
            100 * budget.bytes / max(kv_bytes, 1),
        )
        no_room = (
            f"scale tables that do not fit in free device memory ({mib(budget.free or 0)} "
            f"free on {device}, {mib(budget.margin)} kept spare)"
        )
        for (layer, kv_cache), fits in zip(candidates, budget.fits, strict=True):
            if fits:
                layer.impl.bind_asm(layer, kv_cache, kernel, query_dtype, max_model_len)
            else:
                layer.impl.keep_hip([no_room])
    hint = False
    for layer, kv_cache in entries:
        reasons = layer.impl.asm_rejections or []
        if when is not None:
            for reason in reasons:
                logger.warning_once(
                    "ROCM_ATTN asm decode: %s, layers with %s keep the HIP decode", when, reason
                )
        problem = kernel.aiter.block_id_problem(layer.impl._split(kv_cache)[0].shape[0])
        hint = hint or (problem is not None and problem in reasons)
    if hint:
        logger.warning_once(
            "ROCM_ATTN asm decode: if `vllm-rocm-asm-decode doctor` passes its block-id probe "
            "on this GPU, %s=1 lets caches of more than %d blocks use the asm decode with "
            "this AITER",
            settings.TRUST_ENV,
            BLOCK_ID_LIMIT,
        )
    return sum(layer.impl.asm_binding is not None for layer, _ in entries)


def _announce(
    builder: RocmAsmDecodeMetadataBuilder,
    arch: str,
    compute_units: int,
    eligible: int,
    total: int,
    max_model_len: int,
) -> None:
    """One info line per process: what is active and where."""
    global _announced
    if _announced:
        return
    _announced = True
    logger.info(
        "ROCM_ATTN asm decode: %d of %d layers eligible on %s; pure-decode steps above "
        "%d query heads (%s) run aiter.pa_fwd_asm with high_precision=%d, the rest the "
        "HIP decode",
        eligible,
        total,
        arch or "an unknown GPU architecture",
        builder.asm_cut,
        describe_cut(compute_units),
        ULTRA_PRECISION,
    )
    if eligible and max_model_len > VALIDATED_CONTEXT:
        logger.info(
            "ROCM_ATTN asm decode: contexts above %d tokens (max_model_len %d) are not "
            "validated on hardware",
            VALIDATED_CONTEXT,
            max_model_len,
        )


class RocmAsmDecodeBackend(RocmAttentionBackend):
    """``ROCM_ATTN`` (same name, layouts and selection) with the asm decode."""

    @staticmethod
    def get_impl_cls() -> type[RocmAsmDecodeImpl]:
        return RocmAsmDecodeImpl

    @staticmethod
    def get_builder_cls() -> type[RocmAsmDecodeMetadataBuilder]:
        return RocmAsmDecodeMetadataBuilder
