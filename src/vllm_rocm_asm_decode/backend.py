"""``ROCM_ATTN`` with an asm decode: subclasses of vLLM's own backend, builder and impl.

Data flow, decide once and run many:

1. At the first ``build()`` after the KV cache is bound, the builder loads the AITER
   kernel (:mod:`.kernel`) and asks each of its layers' impls to bind: the impl checks
   the layer against :mod:`.eligibility`, and if it passes, keeps the cache views the
   kernel reads and the layer's scale tables (:mod:`.scale_tables`).
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

from .decision import call_uses_asm, describe_cut, resolve_cut, step_uses_asm
from .eligibility import VALIDATED_CONTEXT, LayerFacts, rejection_reasons
from .kernel import AsmKernel, current_arch, load_asm_kernel
from .kernel_table import ULTRA_PRECISION
from .log import logger
from .scale_tables import scale_tables

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
        )

    def _split(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return PagedAttention.split_kv_cache(
            kv_cache.transpose(0, 1), self.num_kv_heads, self.head_size
        )

    def bind_asm(
        self,
        layer: torch.nn.Module,
        kv_cache: torch.Tensor,
        kernel: AsmKernel,
        query_dtype: torch.dtype,
        max_model_len: int,
    ) -> list[str]:
        """Decide this layer against the rule; bind it when eligible. Returns the reasons."""
        reasons = rejection_reasons(
            self.layer_facts(kv_cache, query_dtype, max_model_len), kernel.table
        )
        self.asm_rejections = reasons
        self._asm_context = (kernel, query_dtype, max_model_len)
        self.asm_binding = (
            None if reasons else self._make_binding(layer, kv_cache, kernel, query_dtype)
        )
        return reasons

    def _make_binding(
        self,
        layer: torch.nn.Module,
        kv_cache: torch.Tensor,
        kernel: AsmKernel,
        query_dtype: torch.dtype,
    ) -> AsmLayerBinding:
        key_cache, value_cache = self._split(kv_cache)
        key_cache = key_cache.view(self.fp8_dtype)
        # [nb, nkv, head_size, 16] is AITER's shuffled [nb, nkv, 16/16, head_size, 16].
        value_cache = value_cache.view(self.fp8_dtype).unsqueeze(2)
        k_scale, v_scale = float(layer._k_scale_float), float(layer._v_scale_float)
        # Shaped as the kernel indexes them: K's block count, KV heads and block size.
        num_blocks, num_kv_heads, _, block_size, _ = key_cache.shape
        k_table, v_table = scale_tables(
            kv_cache.device, num_blocks, num_kv_heads, block_size, k_scale, v_scale
        )
        return AsmLayerBinding(
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
        for reason in self.bind_asm(layer, kv_cache, *self._asm_context):
            logger.warning_once(
                "ROCM_ATTN asm decode: after a KV cache re-bind, layers with %s keep the "
                "HIP decode",
                reason,
            )
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
        eligible = 0
        for layer in layers:
            impl = layer.impl
            if impl.attn_type != AttentionType.DECODER:
                # Encoder attention has no paged KV cache to decode from.
                impl.asm_rejections = reasons = ["not decoder self-attention"]
            else:
                reasons = impl.bind_asm(
                    layer, layer.kv_cache, kernel, model_config.dtype, model_config.max_model_len
                )
            for reason in reasons:
                logger.info_once("ROCM_ATTN asm decode: layers with %s keep the HIP decode", reason)
            eligible += not reasons
        self.asm_eligible_layers = eligible
        _announce(self, arch, compute_units, eligible, len(layers), model_config.max_model_len)


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
        arch,
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
