"""``ROCM_ATTN`` with the asm decode, on stock vLLM: subclasses of vLLM's own backend,
metadata, builder and impl that run :mod:`.core` (and :mod:`.mixed`) inside the
plugin's guards (:mod:`.eligibility`, :mod:`.kernel`, :mod:`.scale_tables`).

Decide once, run many:

1. At the first ``build()`` after the KV cache is bound, the builder loads the AITER
   kernel (:mod:`.kernel`) and decides its layers (:func:`decide_layers`): each layer is
   checked against the rule and the guards; the scale tables of those that pass are
   budgeted against the device memory vLLM did not claim; the layers that fit get an
   :class:`AsmLayerBinding` (the cache views the kernel reads and their tables).
2. Every ``build()`` decides the step from host integers (:func:`.core.use_asm_decode`,
   :func:`.mixed.split_asm_decode`) and records it in the metadata with a reference to
   the builder's bindings, so a captured CUDA graph holds one decode kernel.
3. ``forward`` combines the step with its layer's binding and the call's tensors and
   either calls :func:`.core.asm_decode` on views made at bind time (for a split step,
   after vLLM's prefill kernel on the prefill requests) or leaves the call to stock.

The bindings belong to the builder, as ``ROCM_AITER_FA``'s scale tables do: vLLM drops
the builders of its CUDA-graph profiling pass with that pass's small KV cache, and the
bindings (which hold that cache) go with them. A binding whose cache was re-bound or
whose scales changed is never used: ``forward`` takes the stock path and marks the
bindings stale, and the next ``build()`` (never inside a graph capture) decides again.

Only ``ROCM_ATTN``'s own builder turns the path on: the builders vLLM derives from it
(chunked local attention, static sinks, KV-sharing fast prefill, Whisper block pooling)
rewrite the metadata first and keep the stock decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, cast

import torch
from vllm.config import (
    CUDAGraphMode,
    ModelConfig,
    VllmConfig,
    get_layers_from_vllm_config,
)
from vllm.model_executor.layers.attention import Attention
from vllm.v1.attention.backend import AttentionType, CommonAttentionMetadata
from vllm.v1.attention.backends.rocm_attn import (
    RocmAttentionBackend,
    RocmAttentionImpl,
    RocmAttentionMetadata,
    RocmAttentionMetadataBuilder,
)
from vllm.v1.attention.ops import chunked_prefill_paged_decode as stock_ops
from vllm.v1.kv_cache_interface import AttentionSpec

from . import page_span, settings
from .asm_scale_tables import (
    AsmScaleTables,
    MappingLimitError,
    checkpoint_scales,
)
from .core import ASM_PRECISION, asm_decode, use_asm_decode
from .eligibility import (
    FP16_UNPROVEN,
    VALIDATED_CONTEXT,
    call_uses_asm,
    describe_cut,
    kv_page_bytes,
    rejection_reasons,
    resolve_cut,
    split_cache,
)
from .kernel import AsmKernel, current_arch, load_asm_kernel, unavailable_reason
from .log import logger
from .mixed import AsmDecodeSplit, asm_split_off, asm_split_reorders, split_asm_decode
from .scale_tables import (
    TableBudget,
    TableKey,
    fit_tables,
    mib,
    table_key,
    table_memory,
)
from .skew import ASM_SKEW_HEAD_TOKENS, ASM_SKEW_RATIO, asm_decode_skewed

#: Logged once when an unproven AITER keeps layers on HIP (high KV blocks on an AITER
#: before 0.1.17, or fp16 queries): how to lift that.
TRUST_HINT = (
    "if `vllm-rocm-asm-decode doctor` passes its self-test on this GPU, "
    f"{settings.TRUST_ENV}=1 lets these layers use the asm decode with this AITER"
)


@dataclass(frozen=True)
class AsmDecodeSettings:
    """How the asm decode is set up in this process (read once per builder)."""

    #: ``VLLM_ROCM_ASM_DECODE_CUT``: query heads above which a decode runs asm; None
    #: for the core's 2 x compute units.
    cut: int | None = None
    #: Take the installed AITER as reading every KV block right whatever its version.
    trust_aiter: bool = False
    #: ``VLLM_ROCM_ASM_DECODE_SKEW``: the skew clause's ratio; None for the core's.
    skew: int | None = None

    @classmethod
    def from_env(cls) -> AsmDecodeSettings | None:
        """The plugin's settings; None where the asm decode is switched off or cannot
        run in this process (why, once, at debug level)."""
        if not settings.asm_decode_switch():
            return None
        reason = unavailable_reason()
        if reason is not None:
            logger.debug_once("ROCM_ATTN asm decode is off: %s", reason)
            return None
        return cls(
            cut=settings.cut_override(),
            trust_aiter=settings.trust_aiter(),
            skew=settings.skew_override(),
        )


@dataclass(frozen=True)
class AsmLayerBinding:
    """What one layer's asm decode reads, made once when its KV cache is bound."""

    kv_cache: torch.Tensor  # the bound cache these views were made from
    key_cache: torch.Tensor  # [num_blocks, num_kv_heads, head_size/16, 16, 16], fp8
    value_pages: torch.Tensor  # vLLM's V view [num_blocks, num_kv_heads, head_size, 16]
    #: The scales the tables hold (the layer's ``_k_scale_float``/``_v_scale_float``).
    k_scale: float
    v_scale: float
    k_scale_table: torch.Tensor  # [num_blocks, num_kv_heads, 16], fp32
    v_scale_table: torch.Tensor
    query_dtype: torch.dtype
    #: The tables are this layer's own (its scales come from the checkpoint and a
    #: reload refills them); else shared by every layer of the same fixed scale.
    owns_tables: bool = False

    @property
    def scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_scale_table, self.v_scale_table


@dataclass
class AsmBindings:
    """The asm bindings of one builder's layers, by layer name, and their tables."""

    layers: dict[str, AsmLayerBinding] = field(default_factory=dict)
    tables: AsmScaleTables | None = None
    #: Set by ``forward`` when a layer's cache or scales changed since binding (and no
    #: refill followed them): the next ``build()`` decides every layer again.
    stale: bool = False
    #: How the page-span guard admitted the bound layers (None: their cache is small).
    span_note: str | None = None

    def follow_reload(self) -> list[str]:
        """Refill the tables of the layers whose scales a weight reload changed (in
        place: captured CUDA graphs read the new scales); returns their names."""
        if self.tables is None:
            return []
        names = []
        for layer in self.tables.follow_reload():
            binding = self.layers[layer.layer_name]
            self.layers[layer.layer_name] = replace(
                binding, k_scale=layer._k_scale_float, v_scale=layer._v_scale_float
            )
            names.append(layer.layer_name)
        return names


@dataclass
class RocmAsmDecodeMetadata(RocmAttentionMetadata):
    """``RocmAttentionMetadata`` plus the step's decode kernel choice."""

    use_asm_decode: bool = False
    #: Set for a mixed step whose decode part runs asm.
    asm_split: AsmDecodeSplit | None = None
    #: The builder's bindings (the same object every step; nothing is copied).
    asm_bindings: AsmBindings | None = None


class RocmAsmDecodeImpl(RocmAttentionImpl):
    """``RocmAttentionImpl`` whose decode steps above the cut may run ``pa_fwd_asm``."""

    #: Why this layer keeps the HIP decode (empty when bound); None until decided.
    asm_rejections: list[str] | None = None

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
        quant = output_scale is not None or output_block_scale is not None
        binding = self._asm_binding(
            layer, query, kv_cache, attn_metadata, output, quant
        )
        if binding is None:
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
        assert isinstance(attn_metadata, RocmAsmDecodeMetadata)
        split = attn_metadata.asm_split
        if split is None:
            rows = attn_metadata.num_actual_tokens
            block_table, seq_lens = attn_metadata.block_table, attn_metadata.seq_lens
        else:
            self._prefill(
                binding, split, layer, query, key, value, attn_metadata, output
            )
            rows = split.num_decodes
            block_table, seq_lens = split.decode_block_table, split.decode_seq_lens
        asm_decode(
            query[:rows],
            binding.key_cache,
            binding.value_pages,
            block_table,
            seq_lens,
            binding.scales,
            output[:rows],
        )
        return output

    def _asm_binding(
        self,
        layer: Any,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: RocmAttentionMetadata | None,
        output: torch.Tensor,
        output_quant_requested: bool,
    ) -> AsmLayerBinding | None:
        """This call's binding when the step chose asm and the call can run it; None to
        leave the call to stock. The step's choice is read first (one attribute read
        each), so steps that stay on stock pay next to nothing."""
        if not getattr(attn_metadata, "use_asm_decode", False) and not getattr(
            attn_metadata, "asm_split", None
        ):
            return None
        assert isinstance(attn_metadata, RocmAsmDecodeMetadata)
        bindings = attn_metadata.asm_bindings
        assert bindings is not None  # set with the step's choice
        binding = bindings.layers.get(layer.layer_name)
        if binding is None:
            return None
        if (
            kv_cache is not binding.kv_cache
            or layer._k_scale_float != binding.k_scale
            or layer._v_scale_float != binding.v_scale
        ):
            bindings.stale = True  # decided again at the next build(), never here
            return None
        ok = call_uses_asm(
            step_asm=True,
            layer_eligible=True,
            output_quant_requested=output_quant_requested,
            # The kernel gets Q's row stride only (heads and dims dense) and writes out_
            # densely from its base, in the query's dtype.
            tensors_ok=query.dtype == binding.query_dtype
            and output.dtype == query.dtype
            and query.stride(-1) == 1
            and query.stride(-2) == self.head_size
            and output.is_contiguous(),
        )
        return binding if ok else None

    def _prefill(
        self,
        binding: AsmLayerBinding,
        split: AsmDecodeSplit,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        attn_metadata: RocmAttentionMetadata,
        output: torch.Tensor,
    ) -> None:
        """A split step's prefill requests through vLLM's own prefill kernel, with the
        arguments stock ``forward`` passes it, on the prefill requests' views (stage 2
        of the in-tree change gets the same from ``chunked_prefill_paged_decode``).

        The kernel indexes absolute rows from its start locations, so it gets the whole
        ``q/k/v/o`` (``key``/``value`` may be None: it then reads the new tokens from
        the cache, as in stock)."""
        stock_ops.context_attention_fwd(
            q=query,
            k=key,
            v=value,
            o=output,
            kv_cache_dtype=self.kv_cache_dtype,
            k_cache=binding.key_cache,
            v_cache=binding.value_pages,
            b_loc=split.prefill_block_table,
            b_start_loc=split.prefill_query_start_loc,
            b_seq_len=split.prefill_seq_lens,
            max_seq_len=attn_metadata.max_seq_len,
            max_input_len=attn_metadata.max_query_len,
            k_scale=layer._k_scale,
            v_scale=layer._v_scale,
            alibi_slopes=self.alibi_slopes,
            sliding_window=1 + self.sliding_window[0],
            sm_scale=self.scale,
            skip_decode=True,
            fp8_out_scale=None,
            sinks=self.sinks,
            interleaved_v_pack_factor=(
                16 // binding.value_pages.element_size()
                if self._use_interleaved_v_cache
                else 0
            ),
            causal=attn_metadata.causal,
        )


class RocmAsmDecodeMetadataBuilder(RocmAttentionMetadataBuilder):
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
        # The cut counts these layers' query heads: a drafter's may not be the model's.
        # (vLLM's get_num_attention_heads_from_layers asserts one count, which stock
        # ROCM_ATTN does not: layers of several counts keep the model's, as stock does.)
        layers = get_layers_from_vllm_config(vllm_config, Attention, layer_names)
        heads = {layer.impl.num_heads for layer in layers.values()}
        if len(heads) == 1:
            self.num_heads_q = heads.pop()
        # This builder only: the builders vLLM derives from it keep the stock decode.
        own = type(self) is RocmAsmDecodeMetadataBuilder
        #: None: the asm decode is off for this builder, for good.
        self.asm_settings = AsmDecodeSettings.from_env() if own else None
        self.asm_layers_bound = False
        self.asm_bindings = AsmBindings()
        self.asm_cut = 0
        self.asm_skew = ASM_SKEW_RATIO
        #: The kernel's context lengths: vLLM's, but at least 1. vLLM gives a CUDA-graph
        #: padding row length 0, and pa_fwd_asm writes such a row NaN (see
        #: ``contract_model.EMPTY_ROW``), which a later op reading several rows (a
        #: per-tensor dynamic quant) spreads to real ones. Refilled in place by every
        #: build() of a step above the cut, so the graphs holding asm read the step's.
        #: (A later bind that binds no layer leaves graphs captured on asm with lengths
        #: no longer refreshed: a KV-cache re-bind after capture, which vLLM 0.33 does
        #: not make, already leaves such graphs reading the old cache.)
        seqs = vllm_config.scheduler_config.max_num_seqs if self.asm_settings else 0
        self.asm_seq_lens = torch.ones(seqs, dtype=torch.int32, device=device)
        #: Why mixed steps are not split (None: they are).
        self.asm_split_off: str | None = "the asm decode is off"
        if self.asm_settings is None:
            return
        if self.asm_settings.skew is not None:
            self.asm_skew = self.asm_settings.skew
        self.asm_split_off = asm_split_off(vllm_config)
        if self.asm_split_off is None and asm_split_reorders(
            vllm_config, kv_cache_spec, layer_names
        ):
            self._init_reorder_batch_threshold(1)

    @property
    def asm_split_allowed(self) -> bool:
        return self.asm_split_off is None

    def build_for_cudagraph_capture(
        self, common_attn_metadata: CommonAttentionMetadata
    ) -> RocmAsmDecodeMetadata:
        metadata = super().build_for_cudagraph_capture(common_attn_metadata)
        assert isinstance(metadata, RocmAsmDecodeMetadata)
        metadata.asm_split = None  # a graph would replay a dummy batch's split
        # A graph replays its kernel for any lengths (vLLM's capture batch claims
        # max_model_len): the cut alone decides. (Stock's fill_(1) of the lengths filled
        # asm_seq_lens where build() put them there.)
        metadata.use_asm_decode = self._asm_sized_step(common_attn_metadata)
        return metadata

    def _asm_sized_step(self, common_attn_metadata: CommonAttentionMetadata) -> bool:
        """A pure-decode step above the cut, whatever its lengths: the graph of its
        size holds asm (and reads :attr:`asm_seq_lens`)."""
        return (
            bool(self.asm_bindings.layers)
            and common_attn_metadata.seq_lens.shape[0] <= self.asm_seq_lens.numel()
            and use_asm_decode(common_attn_metadata, self.num_heads_q, self.asm_cut)
        )

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> RocmAsmDecodeMetadata:
        stock = super().build(common_prefix_len, common_attn_metadata, fast_build)
        metadata = RocmAsmDecodeMetadata(**vars(stock))
        if self.asm_settings is None:
            return metadata
        bindings = self.asm_bindings
        if not self.asm_layers_bound or bindings.stale:
            self._bind_layers()
        elif bindings.tables is not None and bindings.tables.changed():
            refilled = bindings.follow_reload()
            logger.info(
                "ROCM_ATTN asm decode: the KV scales of %d layer(s) changed (a weight "
                "reload); their scale tables were refilled in place, so captured CUDA "
                "graphs read the new scales",
                len(refilled),
            )
        metadata.asm_bindings = self.asm_bindings
        if not self.asm_bindings.layers:
            return metadata
        sized = self._asm_sized_step(common_attn_metadata)
        if sized:  # in place: the graphs that hold asm read these lengths
            rows = metadata.seq_lens.shape[0]
            out = self.asm_seq_lens[:rows]
            metadata.seq_lens = torch.clamp(metadata.seq_lens, min=1, out=out)
        metadata.use_asm_decode = sized and not asm_decode_skewed(
            common_attn_metadata,
            common_attn_metadata.num_reqs,
            self.num_heads_kv,
            self.asm_skew,
        )
        if metadata.max_query_len > 1:
            split = split_asm_decode(
                common_attn_metadata, self.vllm_config, self.num_heads_q, self.asm_cut
            )
            if split is None or not asm_decode_skewed(
                common_attn_metadata,
                split.num_decodes,
                self.num_heads_kv,
                self.asm_skew,
            ):
                metadata.asm_split = split
        return metadata

    def binding(self, layer_name: str) -> AsmLayerBinding | None:
        """The asm binding of one of this builder's layers; None when it keeps HIP."""
        return self.asm_bindings.layers.get(layer_name)

    def _bind_layers(self) -> None:
        settings_ = self.asm_settings
        assert settings_ is not None
        layers = [
            layer
            for layer in get_layers_from_vllm_config(
                self.vllm_config, Attention, self.layer_names
            ).values()
            if isinstance(layer.impl, RocmAsmDecodeImpl)
        ]
        impls = {layer: layer.impl for layer in layers}
        cached = [
            layer for layer in layers if impls[layer].attn_type == AttentionType.DECODER
        ]
        if any(layer.kv_cache.dim() != 4 for layer in cached):
            return  # the KV cache is not bound yet: decide at a later build
        again = self.asm_layers_bound
        self.asm_layers_bound = True
        self.asm_bindings = AsmBindings()
        # Model Runner V2 resolves the graph mode after it makes the builders.
        self.asm_split_off = asm_split_off(self.vllm_config)
        arch = current_arch()
        kernel, why_not = load_asm_kernel(arch, settings_.trust_aiter)
        if kernel is None:
            logger.warning_once(
                "ROCM_ATTN asm decode is off: %s; every layer keeps the HIP decode",
                why_not,
            )
            return
        if kernel.table_note is not None:
            logger.warning_once(
                "ROCM_ATTN asm decode: AITER's kernel table was not read (%s); "
                "assuming %s",
                kernel.table_note,
                kernel.table.source,
            )
        from vllm.utils.platform_utils import num_compute_units

        # The compute units of the GPU the KV cache (and so the kernel) is on.
        device = cached[0].kv_cache.device if cached else self.device
        compute_units = num_compute_units(device.index or 0)
        self.asm_cut = resolve_cut(compute_units, settings_.cut)
        max_num_seqs = self.vllm_config.scheduler_config.max_num_seqs
        if max_num_seqs * self.num_heads_q <= self.asm_cut:
            # No step is above the cut (a decode step is at most max_num_seqs tokens):
            # scale tables would be memory for nothing.
            logger.info_once(
                "ROCM_ATTN asm decode is off: max_num_seqs %d x %d query heads never "
                "passes the cut of %d; every layer keeps the HIP decode",
                max_num_seqs,
                self.num_heads_q,
                self.asm_cut,
            )
            return
        for layer in layers:
            if impls[layer].attn_type != AttentionType.DECODER:
                # Encoder attention has no paged KV cache to decode from.
                impls[layer].asm_rejections = ["not decoder self-attention"]
        cache_config = self.vllm_config.cache_config
        model_config = self.vllm_config.model_config
        self.asm_bindings = decide_layers(
            [(layer, layer.kv_cache) for layer in cached],
            kernel,
            model_config,
            # Tables may take only memory vLLM did not claim for itself.
            None
            if cache_config.kv_cache_memory_bytes
            else cache_config.gpu_memory_utilization,
        )
        when = "after a KV cache re-bind or scale reload, " if again else ""
        for layer in layers:
            for reason in impls[layer].asm_rejections or ():
                log = logger.warning_once if again else logger.info_once
                log(
                    "ROCM_ATTN asm decode: %slayers with %s keep the HIP decode",
                    when,
                    reason,
                )
        self._announce(arch, compute_units, len(layers), cached)

    def _announce(
        self, arch: str, compute_units: int, total: int, cached: list[Attention]
    ) -> None:
        """One info line per decision (vLLM's CUDA-graph profiling pass, on its small
        cache, then the real cache, then any other KV cache group): what is active and
        where."""
        settings_ = self.asm_settings
        assert settings_ is not None
        max_model_len = self.vllm_config.model_config.max_model_len
        bound = len(self.asm_bindings.layers)
        blocks = sorted({layer.kv_cache.shape[0] for layer in cached})
        mixed = (
            "so do the leading decode requests of mixed steps"
            if self.asm_split_off is None
            else f"mixed steps stay whole on the stock path ({self.asm_split_off})"
        )
        logger.info_once(
            "ROCM_ATTN asm decode: %d of %d layers eligible on %s (KV cache of %s "
            "blocks%s); pure-decode steps above %d query heads (%s) run "
            "aiter.pa_fwd_asm with high_precision=%d, the rest the HIP decode, as do "
            "steps whose longest context x %d passes their head-tokens + %d; %s",
            bound,
            total,
            arch or "an unknown GPU architecture",
            "/".join(map(str, blocks)) or "no",
            f"; {self.asm_bindings.span_note}" if self.asm_bindings.span_note else "",
            self.asm_cut,
            describe_cut(
                compute_units, settings.CUT_ENV if settings_.cut is not None else None
            ),
            ASM_PRECISION,
            self.asm_skew,
            ASM_SKEW_HEAD_TOKENS,
            mixed,
        )
        compilation = self.vllm_config.compilation_config
        if bound and compilation.cudagraph_mode == CUDAGraphMode.FULL:
            logger.warning_once(
                "ROCM_ATTN asm decode: cudagraph_mode=FULL captures every graph as a "
                "mixed batch, so the captured graphs hold the HIP decode and asm runs "
                "only on eager decode steps past the largest capture size (%s); "
                "FULL_AND_PIECEWISE (vLLM's default) or FULL_DECODE_ONLY capture "
                "pure-decode graphs on asm",
                compilation.max_cudagraph_capture_size,
            )
        if bound and max_model_len > VALIDATED_CONTEXT:
            logger.info_once(
                "ROCM_ATTN asm decode: contexts above %d tokens (max_model_len %d) are "
                "not validated on hardware",
                VALIDATED_CONTEXT,
                max_model_len,
            )


def scale_table_keys(
    impl: RocmAttentionImpl, layer: Any, kv_cache: torch.Tensor
) -> tuple[TableKey, TableKey]:
    """The tables a layer's binding will use, shaped as the kernel indexes them (K's
    block count, KV heads and block size) at the layer's final scales: its own where
    its scales come from the checkpoint, else shared with the layers of equal scale (K's
    tables apart from V's)."""
    num_blocks, num_kv_heads, _, block_size, _ = split_cache(impl, kv_cache)[0].shape
    shape = (num_blocks, num_kv_heads, block_size)
    owner = layer.layer_name if checkpoint_scales(layer) else ""
    return (
        table_key(kv_cache.device, *shape, layer._k_scale_float, f"{owner}:K"),
        table_key(kv_cache.device, *shape, layer._v_scale_float, f"{owner}:V"),
    )


def make_binding(
    impl: RocmAttentionImpl,
    layer: Any,
    kv_cache: torch.Tensor,
    query_dtype: torch.dtype,
    tables: AsmScaleTables,
    aliased: bool | None = None,
) -> AsmLayerBinding:
    """The views and tables an eligible layer's asm decode reads (makes its tables
    when they do not exist yet; ``aliased=False`` allocates them)."""
    key_cache, value_pages = split_cache(impl, kv_cache)
    num_blocks, num_kv_heads, _, block_size, _ = key_cache.shape
    own = checkpoint_scales(layer)
    k_table, v_table = tables.get(
        layer, (num_blocks, num_kv_heads, block_size), own, aliased
    )
    return AsmLayerBinding(
        kv_cache=kv_cache,
        key_cache=key_cache.view(impl.fp8_dtype),
        value_pages=value_pages.view(impl.fp8_dtype),
        k_scale=float(layer._k_scale_float),
        v_scale=float(layer._v_scale_float),
        k_scale_table=k_table,
        v_scale_table=v_table,
        query_dtype=query_dtype,
        owns_tables=own,
    )


def decide_layers(
    entries: list[tuple[Any, torch.Tensor]],
    kernel: AsmKernel,
    model_config: ModelConfig,
    memory_fraction: float | None = None,
) -> AsmBindings:
    """Decide decoder layers (with their bound caches) for asm or HIP; returns the
    bindings of those bound for asm, and leaves every layer's reasons in
    ``impl.asm_rejections``.

    Each layer is checked against the rule and the guards. The tables of those that
    pass are aliased where the device offers GPU virtual memory (probed once with a
    table of the first layer's shape), up to the process's mapping bound. The others
    are allocated, budgeted in layer order against one memory reading of their device
    (:func:`~.scale_tables.table_memory`, with ``memory_fraction`` vLLM's
    ``gpu_memory_utilization``), and the layers whose tables do not fit keep HIP; so do
    those whose aliased tables the driver refused (nothing budgeted an allocation for
    them).
    """
    candidates = []
    old_aiter_kept_hip = False
    for layer, kv_cache in entries:
        impl = layer.impl
        reasons = rejection_reasons(
            impl, kv_cache, model_config, kernel.table, kernel.aiter
        )
        impl.asm_rejections = reasons
        if not reasons:
            candidates.append((layer, kv_cache))
        elif FP16_UNPROVEN in reasons or (
            (
                problem := kernel.aiter.block_id_problem(
                    kv_cache.shape[0], kv_page_bytes(impl, kv_cache)
                )
            )
            and problem in reasons
        ):
            old_aiter_kept_hip = True
    if old_aiter_kept_hip:
        logger.warning_once("ROCM_ATTN asm decode: %s", TRUST_HINT)
    bindings = AsmBindings()
    if not candidates:
        return bindings
    device = candidates[0][1].device
    keys = [scale_table_keys(layer.impl, layer, kv) for layer, kv in candidates]
    query_dtype = cast(torch.dtype, model_config.dtype)
    # Strict: an aliased table the driver refuses is not allocated in its place.
    tables = bindings.tables = AsmScaleTables(device, strict=True)
    aliased = tables.probe(keys[0][0][1:4])
    allocated = []  # candidates whose tables are allocated: budgeted below
    bound = None  # the mapping bound, once a table passed it
    for i, (layer, kv_cache) in enumerate(candidates):
        if not aliased:
            allocated.append(i)
            continue
        try:
            bindings.layers[layer.layer_name] = make_binding(
                layer.impl, layer, kv_cache, query_dtype, tables
            )
        except MappingLimitError as exc:
            allocated.append(i)
            bound = exc.bound
        except RuntimeError as exc:  # an aliased table the driver refused
            layer.impl.asm_rejections = [f"scale tables could not be mapped ({exc})"]
    budget = fit_tables(
        [keys[i] for i in allocated],
        table_memory(device, memory_fraction) if allocated else None,
    )
    for i, fits in zip(allocated, budget.fits, strict=True):
        layer, kv_cache = candidates[i]
        if fits:
            bindings.layers[layer.layer_name] = make_binding(
                layer.impl, layer, kv_cache, query_dtype, tables, aliased=False
            )
            continue
        layer.impl.asm_rejections = [
            "scale tables that do not fit in the device memory vLLM does not "
            f"count on ({mib(budget.free or 0)} on {device}, {mib(budget.margin)} "
            "kept spare)"
        ]
    _prove_page_span(bindings, candidates, kernel)
    if not bindings.layers:
        return AsmBindings()  # the tables go with the bindings that needed them
    logger.info(
        "ROCM_ATTN asm decode: %d scale table(s) for %d layer(s) (%d with tables of "
        "their own, refilled in place on a weight reload), %s",
        sum(t.aliased for t in tables.tables()) + budget.tables,
        len(candidates),
        len(tables.owners),
        _describe_tables(tables, candidates, entries, budget, len(allocated), bound),
    )
    return bindings


def _prove_page_span(
    bindings: AsmBindings, candidates: list[tuple[Any, torch.Tensor]], kernel: AsmKernel
) -> None:
    """Keep on HIP the bound layers whose cache can hold pages too far apart for AITER's
    rebase (:mod:`.page_span`) unless the probe on the first one's cache, or the trust
    switch, says this GPU reads them right; note the outcome for the start-up line."""
    reaching = [
        (layer, binding)
        for layer, _ in candidates
        if (binding := bindings.layers.get(layer.layer_name)) is not None
        and page_span.reaches(binding.key_cache)
    ]
    if not reaching:
        return
    layer, binding = reaching[0]
    span = page_span.describe(binding.key_cache)
    if kernel.aiter.trusted:
        bindings.span_note = f"pages {span} apart trusted ({settings.TRUST_ENV}=1)"
        return
    problem = page_span.proven(binding, layer.impl.num_heads)
    if problem is None:
        bindings.span_note = f"pages {span} apart read right by the bind-time probe"
        return
    for layer, _ in reaching:
        del bindings.layers[layer.layer_name]
        layer.impl.asm_rejections = [problem]
    logger.warning_once("ROCM_ATTN asm decode: %s", TRUST_HINT)


def _describe_tables(
    tables: AsmScaleTables,
    candidates: list[tuple[Any, torch.Tensor]],
    entries: list[tuple[Any, torch.Tensor]],
    budget: TableBudget,
    num_allocated: int,
    bound: int | None,
) -> str:
    """The scale tables' part of the start-up line: how they are made, what they take
    and, where some are allocated, why."""
    made = tables.tables()
    aliased = [t for t in made if t.aliased]
    aliased_full = sum(t.tensor.numel() * 4 for t in aliased)
    full = aliased_full + budget.bytes
    kv_bytes = sum(
        {kv.data_ptr(): kv.numel() * kv.element_size() for _, kv in entries}.values()
    )
    share = f"{100 * full / max(kv_bytes, 1):.3f} % of their KV cache"
    if not made and not num_allocated:
        return "none made: the driver refused every aliased table"
    if not aliased:
        fitting = sum(budget.fits)
        return f"allocated ({tables.problem}), {mib(budget.bytes)}, {share}" + (
            ""
            if fitting == len(candidates)
            else f"; {mib(budget.new_bytes)} of them fit for {fitting} layer(s)"
        )
    text = (
        f"aliased, {mib(sum(t.nbytes for t in aliased))} of device memory "
        f"({sum(t.mappings for t in aliased)} mappings, each table read back, made in "
        f"{1e3 * tables.seconds:.1f} ms) where allocated tables would take "
        f"{mib(aliased_full)}, {share}"
    )
    if num_allocated:
        text += (
            f"; {len(made) - len(aliased)} allocated ({mib(budget.new_bytes)}) for "
            f"{sum(budget.fits)} of {num_allocated} layer(s) past the bound of "
            f"{bound} mappings"
        )
    return text


class RocmAsmDecodeBackend(RocmAttentionBackend):
    """``ROCM_ATTN`` (same name, layouts and selection) with the asm decode."""

    @staticmethod
    def get_impl_cls() -> type[RocmAsmDecodeImpl]:
        return RocmAsmDecodeImpl

    @staticmethod
    def get_builder_cls() -> type[RocmAsmDecodeMetadataBuilder]:
        return RocmAsmDecodeMetadataBuilder
