"""``ROCM_ATTN`` with the asm decode, on stock vLLM: subclasses of vLLM's own backend,
builder and impl with :mod:`.asm_path`'s halves in front, and the plugin's settings.

The in-tree form (``vllm-rocm-asm-decode upstream``) puts the same halves in front of
vLLM's own classes instead; these subclasses are what the plugin needs in its place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.config import VllmConfig
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.rocm_attn import (
    RocmAttentionBackend,
    RocmAttentionImpl,
    RocmAttentionMetadata,
    RocmAttentionMetadataBuilder,
)
from vllm.v1.kv_cache_interface import AttentionSpec

from . import settings
from .asm_path import (
    AsmBindings,
    AsmDecodeBuilderMixin,
    AsmDecodeImplMixin,
    AsmDecodeSettings,
    MixedSplit,
)


def plugin_settings() -> AsmDecodeSettings:
    """The asm decode's settings from the plugin's environment variables."""
    return AsmDecodeSettings(
        cut=settings.cut_override(),
        cut_source=settings.CUT_ENV,
        trust_aiter=settings.trust_aiter(),
        trust_hint=(
            "if `vllm-rocm-asm-decode doctor` passes its block-id probe on this GPU, "
            f"{settings.TRUST_ENV}=1 lets these caches use the asm decode with this "
            "AITER"
        ),
    )


@dataclass
class RocmAsmDecodeMetadata(RocmAttentionMetadata):
    """``RocmAttentionMetadata`` plus the step's decode kernel choice."""

    use_asm_decode: bool = False
    #: Set for a mixed step whose decode part runs asm.
    asm_split: MixedSplit | None = None
    #: The builder's bindings (the same object every step; nothing is copied).
    asm_bindings: AsmBindings | None = None


class RocmAsmDecodeImpl(AsmDecodeImplMixin, RocmAttentionImpl):
    """``RocmAttentionImpl`` whose decode steps above the cut may run ``pa_fwd_asm``."""

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
        if self.forward_asm_decode(
            layer,
            query,
            key,
            value,
            kv_cache,
            attn_metadata,
            output,
            output_scale is not None or output_block_scale is not None,
        ):
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


class RocmAsmDecodeMetadataBuilder(AsmDecodeBuilderMixin, RocmAttentionMetadataBuilder):
    """``RocmAttentionMetadataBuilder`` that binds its layers once and decides each
    step."""

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        if type(self) is RocmAsmDecodeMetadataBuilder:
            # This builder only, as in-tree: the builders vLLM derives from it
            # (chunked local attention, static sinks, ...) rewrite the metadata first.
            self.init_asm_decode(plugin_settings(), kv_cache_spec)

    def build_for_cudagraph_capture(
        self, common_attn_metadata: CommonAttentionMetadata
    ) -> RocmAsmDecodeMetadata:
        with self.asm_capture_build():
            return super().build_for_cudagraph_capture(common_attn_metadata)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> RocmAsmDecodeMetadata:
        stock = super().build(common_prefix_len, common_attn_metadata, fast_build)
        metadata = RocmAsmDecodeMetadata(**vars(stock))
        self.decide_asm_step(metadata, common_attn_metadata)
        return metadata


class RocmAsmDecodeBackend(RocmAttentionBackend):
    """``ROCM_ATTN`` (same name, layouts and selection) with the asm decode."""

    @staticmethod
    def get_impl_cls() -> type[RocmAsmDecodeImpl]:
        return RocmAsmDecodeImpl

    @staticmethod
    def get_builder_cls() -> type[RocmAsmDecodeMetadataBuilder]:
        return RocmAsmDecodeMetadataBuilder
