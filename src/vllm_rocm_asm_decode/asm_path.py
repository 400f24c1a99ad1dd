"""The asm decode path of ``ROCM_ATTN``: what its metadata builder and its impl add.

Data flow, decide once and run many:

1. At the first ``build()`` after the KV cache is bound, the builder loads the AITER
   kernel (:mod:`.kernel`) and decides its layers (:func:`decide_layers`): each layer is
   checked against :mod:`.eligibility`; the scale tables of those that pass are budgeted
   against the device memory vLLM did not claim (:mod:`.scale_tables`); the layers that
   fit get an :class:`AsmLayerBinding` (the cache views the kernel reads and their
   tables), the rest keep the HIP decode.
2. Every ``build()`` decides the step from host data (:mod:`.decision`) and records
   it in the metadata, with a reference to the builder's bindings, so a captured CUDA
   graph holds one decode kernel: a pure-decode step above the cut runs asm; a mixed
   step whose leading decode requests are above the cut is split
   (:class:`MixedSplit`, views made once per step): decodes on asm, prefills on
   vLLM's prefill kernel.
3. ``forward`` combines the step with its layer's binding and the call's arguments and
   either calls ``pa_fwd_asm`` (and, for a split step, vLLM's ``context_attention_fwd``)
   on views made at bind time, or leaves the call to the stock ``forward``.

The bindings belong to the builder, as ``ROCM_AITER_FA``'s scale tables do: vLLM drops
the builders of its CUDA-graph profiling pass with that pass's small KV cache, and the
bindings (which hold that cache) go with them. A binding whose cache was re-bound or
whose scales were reloaded is never used: ``forward`` takes the stock path and marks the
bindings stale, and the next ``build()`` (never inside a graph capture) decides again.

:class:`AsmDecodeBuilderMixin` and :class:`AsmDecodeImplMixin` go in front of
``RocmAttentionMetadataBuilder`` and ``RocmAttentionImpl`` in their class bases; the
builder calls :meth:`~AsmDecodeBuilderMixin.init_asm_decode` at the end of
``__init__`` and :meth:`~AsmDecodeBuilderMixin.decide_asm_step` at the end of
``build()``, and ``forward`` starts with :meth:`~AsmDecodeImplMixin.forward_asm_decode`.
The metadata carries ``use_asm_decode``, ``asm_split`` and ``asm_bindings``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
from vllm.config import CUDAGraphMode, VllmConfig, get_layers_from_vllm_config
from vllm.model_executor.layers.attention import Attention
from vllm.v1.attention.backend import AttentionType, CommonAttentionMetadata
from vllm.v1.attention.ops import chunked_prefill_paged_decode as stock_ops
from vllm.v1.attention.ops.chunked_prefill_paged_decode import (
    has_native_kv_cache_layout,
)
from vllm.v1.attention.ops.paged_attn import PagedAttention
from vllm.v1.kv_cache_interface import AttentionSpec, SlidingWindowSpec

from .decision import (
    call_uses_asm,
    describe_cut,
    leading_decodes,
    mixed_step_uses_asm,
    prefill_view_start,
    resolve_cut,
    step_uses_asm,
)
from .eligibility import (
    ASM_BLOCK_SIZE,
    ASM_HEAD_SIZE,
    E4M3_CACHE_DTYPES,
    VALIDATED_CONTEXT,
    LayerFacts,
    rejection_reasons,
)
from .kernel import AsmKernel, current_arch, load_asm_kernel, unavailable_reason
from .kernel_table import ULTRA_PRECISION
from .log import logger
from .scale_tables import (
    TableKey,
    existing_tables,
    fit_tables,
    mib,
    scale_tables,
    table_key,
    table_memory,
)

if TYPE_CHECKING:
    from vllm.v1.attention.backends.rocm_attn import RocmAttentionMetadata


@dataclass(frozen=True)
class AsmDecodeSettings:
    """How the asm decode is set up in this process (read once per builder)."""

    #: ``VLLM_ROCM_ASM_DECODE_CUT``: query heads above which a decode runs asm; None
    #: for the default of 2 x compute units.
    cut: int | None = None
    #: The setting's name, for the log line that says where the cut comes from.
    cut_source: str = "VLLM_ROCM_ASM_DECODE_CUT"
    #: Take the installed AITER as reading every KV block right whatever its version.
    trust_aiter: bool = False
    #: Logged once when an old AITER keeps layers on HIP: how to lift that.
    trust_hint: str | None = None


def asm_decode_settings(switch: bool, cut: int | None) -> AsmDecodeSettings | None:
    """The settings vLLM's own switches give (``VLLM_ROCM_ASM_DECODE``,
    ``VLLM_ROCM_ASM_DECODE_CUT``); None where the asm decode is switched off or cannot
    run in this process (why, once, at debug level)."""
    if not switch:
        return None
    if cut is not None and cut <= 0:
        raise ValueError(
            f"VLLM_ROCM_ASM_DECODE_CUT={cut} is not a positive number of query heads"
        )
    reason = unavailable_reason()
    if reason is not None:
        logger.debug_once("ROCM_ATTN asm decode is off: %s", reason)
        return None
    return AsmDecodeSettings(cut=cut)


@dataclass(frozen=True)
class AsmLayerBinding:
    """What one layer's asm decode reads, made once when its KV cache is bound."""

    kv_cache: torch.Tensor  # the bound cache these views were made from
    key_cache: torch.Tensor  # [num_blocks, num_kv_heads, head_size/16, 16, 16], fp8
    value_cache: torch.Tensor  # [num_blocks, num_kv_heads, 1, head_size, 16], fp8
    value_pages: torch.Tensor  # vLLM's V view [num_blocks, num_kv_heads, head_size, 16]
    k_scale: float
    v_scale: float
    k_scale_table: torch.Tensor  # [num_blocks, num_kv_heads, 16], fp32, shared
    v_scale_table: torch.Tensor
    query_dtype: torch.dtype
    kernel: AsmKernel


@dataclass
class AsmBindings:
    """The asm bindings of one builder's layers, by layer name."""

    layers: dict[str, AsmLayerBinding] = field(default_factory=dict)
    #: Set by ``forward`` when a layer's cache or scales changed since binding: the next
    #: ``build()`` decides every layer again.
    stale: bool = False


@dataclass(frozen=True)
class MixedSplit:
    """A mixed step cut in two, as views made once per step: the leading decode requests
    (one query token each, rows ``[0, num_decodes)``) for the asm kernel, the requests
    from :func:`~.decision.prefill_view_start` on for vLLM's prefill kernel, which reads
    absolute query rows from its start locations and skips one-token requests."""

    num_decodes: int
    decode_seq_lens: torch.Tensor  # seq_lens[:num_decodes]
    decode_block_table: torch.Tensor  # block_table[:num_decodes]
    prefill_query_start_loc: torch.Tensor  # query_start_loc[start:]
    prefill_seq_lens: torch.Tensor  # seq_lens[start:]
    prefill_block_table: torch.Tensor  # block_table[start:]


class AsmDecodeImplMixin:
    """The impl half: a layer's facts and binding, and the asm branch of ``forward``.

    Goes before ``RocmAttentionImpl`` in the bases; reads its attributes.
    """

    #: Always 2 (ultra precision) in serving; a benchmark may set 1 to time AITER's
    #: default-precision kernel on the same path.
    asm_high_precision: int = ULTRA_PRECISION
    #: Why this layer keeps the HIP decode (empty when bound); None until decided.
    asm_rejections: list[str] | None = None

    # Set by RocmAttentionImpl.__init__.
    num_heads: int
    num_kv_heads: int
    head_size: int
    scale: float
    kv_cache_dtype: str
    fp8_dtype: torch.dtype
    sliding_window: tuple[int, int]
    alibi_slopes: torch.Tensor | None
    logits_soft_cap: float
    sinks: torch.Tensor | None
    attn_type: str
    _use_interleaved_v_cache: bool

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
            # The block stride the launcher hands the kernel, in bytes.
            kv_page_bytes=key_cache.stride(0) * key_cache.element_size(),
        )

    def _split(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return PagedAttention.split_kv_cache(
            kv_cache.transpose(0, 1), self.num_kv_heads, self.head_size
        )

    def scale_table_keys(
        self, layer: Any, kv_cache: torch.Tensor
    ) -> tuple[TableKey, TableKey]:
        """The shared tables this layer's binding will use, shaped as the kernel indexes
        them: K's block count, KV heads and block size, at the layer's final scales."""
        num_blocks, num_kv_heads, _, block_size, _ = self._split(kv_cache)[0].shape
        device = kv_cache.device
        shape = (num_blocks, num_kv_heads, block_size)
        return (
            table_key(device, *shape, layer._k_scale_float),
            table_key(device, *shape, layer._v_scale_float),
        )

    def make_binding(
        self,
        layer: Any,
        kv_cache: torch.Tensor,
        kernel: AsmKernel,
        query_dtype: torch.dtype,
    ) -> AsmLayerBinding:
        """The views and tables an eligible layer's asm decode reads (allocates its
        tables when they do not exist yet)."""
        key_cache, value_pages = self._split(kv_cache)
        key_cache = key_cache.view(self.fp8_dtype)
        value_pages = value_pages.view(self.fp8_dtype)
        # [nb, nkv, head_size, 16] is AITER's shuffled [nb, nkv, 16/16, head_size, 16].
        value_cache = value_pages.unsqueeze(2)
        k_scale, v_scale = float(layer._k_scale_float), float(layer._v_scale_float)
        num_blocks, num_kv_heads, _, block_size, _ = key_cache.shape
        k_table, v_table = scale_tables(
            kv_cache.device, num_blocks, num_kv_heads, block_size, k_scale, v_scale
        )
        return AsmLayerBinding(
            kv_cache=kv_cache,
            key_cache=key_cache,
            value_cache=value_cache,
            value_pages=value_pages,
            k_scale=k_scale,
            v_scale=v_scale,
            k_scale_table=k_table,
            v_scale_table=v_table,
            query_dtype=query_dtype,
            kernel=kernel,
        )

    def forward_asm_decode(
        self,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        kv_cache: torch.Tensor,
        attn_metadata: RocmAttentionMetadata | None,
        output: torch.Tensor,
        output_quant_requested: bool,
    ) -> bool:
        """Run this call's decode on ``pa_fwd_asm`` when the step chose it and the call
        can (and, for a split step, its prefills on vLLM's prefill kernel); True when it
        did, False to leave the whole call to the stock ``forward``."""
        # The step's choice first (one attribute read each), so steps that stay on stock
        # pay next to nothing; then the layer's binding (one dict lookup).
        split = None
        if not getattr(attn_metadata, "use_asm_decode", False) and not (
            split := getattr(attn_metadata, "asm_split", None)
        ):
            return False
        assert attn_metadata is not None
        bindings = attn_metadata.asm_bindings
        assert bindings is not None  # set with the step's choice
        binding = bindings.layers.get(layer.layer_name)
        if binding is None or not self._call_runs_asm(
            binding, bindings, layer, query, kv_cache, output, output_quant_requested
        ):
            return False
        if split is None:
            self._asm_decode(
                binding,
                query,
                output,
                attn_metadata.num_actual_tokens,
                attn_metadata.seq_lens,
                attn_metadata.block_table,
            )
        else:
            self._split_step(
                binding, split, layer, query, key, value, attn_metadata, output
            )
        return True

    def _call_runs_asm(
        self,
        binding: AsmLayerBinding,
        bindings: AsmBindings,
        layer: Any,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        output: torch.Tensor,
        output_quant_requested: bool,
    ) -> bool:
        """For a step that chose asm on a bound layer: whether this call runs it."""
        if (
            kv_cache is not binding.kv_cache
            or layer._k_scale_float != binding.k_scale
            or layer._v_scale_float != binding.v_scale
        ):
            bindings.stale = True  # decided again at the next build(), never here
            return False
        return call_uses_asm(
            step_asm=True,
            layer_eligible=True,
            output_quant_requested=output_quant_requested,
            # The kernel gets Q's row stride only (heads and dims dense) and writes out_
            # densely from its base.
            tensors_ok=query.dtype == binding.query_dtype
            and query.stride(-1) == 1
            and query.stride(-2) == self.head_size
            and output.is_contiguous(),
        )

    def _asm_decode(
        self,
        binding: AsmLayerBinding,
        query: torch.Tensor,
        output: torch.Tensor,
        num_rows: int,
        seq_lens: torch.Tensor,
        block_table: torch.Tensor,
    ) -> None:
        """``pa_fwd_asm`` over the first ``num_rows`` query rows, one request each."""
        binding.kernel.run(
            Q=query[:num_rows],
            K=binding.key_cache,
            V=binding.value_cache,
            block_tables=block_table,
            context_lens=seq_lens,
            block_tables_stride0=block_table.stride(0),
            K_QScale=binding.k_scale_table,
            V_QScale=binding.v_scale_table,
            out_=output[:num_rows],
            high_precision=self.asm_high_precision,
        )

    def _split_step(
        self,
        binding: AsmLayerBinding,
        split: MixedSplit,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        attn_metadata: RocmAttentionMetadata,
        output: torch.Tensor,
    ) -> None:
        """A mixed step: the prefill requests through vLLM's own prefill kernel, with
        the arguments stock ``forward`` passes it, on the prefill requests' views; the
        leading decode rows through ``pa_fwd_asm``. No HIP decode is launched.

        The prefill kernel indexes absolute rows from its start locations, so it gets
        the whole ``q/k/v/o`` (``key``/``value`` may be None: it then reads the new
        tokens from the cache, as in stock)."""
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
        self._asm_decode(
            binding,
            query,
            output,
            split.num_decodes,
            split.decode_seq_lens,
            split.decode_block_table,
        )


class AsmDecodeBuilderMixin:
    """The builder half: binds its layers once and decides each step.

    Goes before ``RocmAttentionMetadataBuilder`` in the bases; reads its attributes.
    """

    #: None: the asm decode is off for this builder (until :meth:`init_asm_decode`).
    asm_settings: AsmDecodeSettings | None = None

    # Set by RocmAttentionMetadataBuilder.__init__.
    vllm_config: VllmConfig
    layer_names: list[str]
    num_heads_q: int

    def init_asm_decode(
        self, settings: AsmDecodeSettings | None, kv_cache_spec: AttentionSpec
    ) -> None:
        """Set the builder up for the asm decode (``settings``), or leave it off for
        good (None). Called at the end of ``__init__``."""
        self.asm_settings = settings
        self.asm_layers_bound = False
        self.asm_bindings = AsmBindings()
        self.asm_cut = 0
        self._asm_capturing = False
        self.asm_split_allowed = False
        self.asm_split_off: str | None = "the asm decode is off"
        if settings is None:
            return
        self._resolve_split()
        if self.asm_split_allowed and _may_split(kv_cache_spec, self.vllm_config):
            # Decode requests lead the batch (the V1 runner reorders on this; Model
            # Runner V2 always does), so a mixed step splits at one boundary. Only where
            # a split can happen: the runner takes the lowest threshold of all builders.
            self._init_reorder_batch_threshold(1)  # type: ignore[attr-defined]

    def _resolve_split(self) -> None:
        """Whether mixed steps may be split: a FULL mixed CUDA-graph mode would freeze a
        host-side split into its graph; speculative decoding has multi-token decodes.
        Decided again at bind time (Model Runner V2 resolves the graph mode after it
        makes the builders)."""
        config = self.vllm_config
        mode = config.compilation_config.cudagraph_mode
        full_mixed = mode.mixed_mode() == CUDAGraphMode.FULL
        speculative = config.speculative_config is not None
        self.asm_split_allowed = not full_mixed and not speculative
        #: For the log: why mixed steps are not split.
        self.asm_split_off = (
            "cudagraph_mode is FULL for mixed steps"
            if full_mixed
            else "speculative decoding is on"
            if speculative
            else None
        )

    @contextlib.contextmanager
    def asm_capture_build(self) -> Iterator[None]:
        """Around the ``build()`` of ``build_for_cudagraph_capture``: a capture build
        never splits a step (its batch is a dummy)."""
        self._asm_capturing = True
        try:
            yield
        finally:
            self._asm_capturing = False

    def decide_asm_step(
        self, metadata: RocmAttentionMetadata, common: CommonAttentionMetadata
    ) -> None:
        """Record this step's decode kernel in ``metadata`` (``use_asm_decode``,
        ``asm_split``, ``asm_bindings``), from host data only. Binds the layers first
        when their KV cache is new or changed."""
        if self.asm_settings is None:
            return
        if not self.asm_layers_bound or self.asm_bindings.stale:
            self._bind_layers()
        metadata.asm_bindings = self.asm_bindings
        if not self.asm_bindings.layers:
            return
        metadata.use_asm_decode = step_uses_asm(
            max_query_len=metadata.max_query_len,
            num_tokens=metadata.num_actual_tokens,
            num_reqs=metadata.seq_lens.shape[0],
            num_heads=self.num_heads_q,
            cut=self.asm_cut,
        )
        if metadata.max_query_len > 1 and self.asm_split_allowed:
            metadata.asm_split = self._mixed_split(metadata, common)

    def _mixed_split(
        self, metadata: RocmAttentionMetadata, common: CommonAttentionMetadata
    ) -> MixedSplit | None:
        """The split of a mixed step, decided on host data (``query_start_loc_cpu``), or
        None when its decode part stays on the stock path."""
        if (common.num_reqs - 1) * self.num_heads_q <= self.asm_cut:
            return None  # at least one request is a prefill: too few decodes
        starts = common.query_start_loc_cpu.numpy()[: common.num_reqs + 1]
        num_decodes = leading_decodes(starts)
        if not mixed_step_uses_asm(
            max_query_len=metadata.max_query_len,
            num_decodes=num_decodes,
            num_heads=self.num_heads_q,
            cut=self.asm_cut,
            split_allowed=self.asm_split_allowed,
            capturing=self._asm_capturing,
        ):
            return None
        assert num_decodes is not None
        start = prefill_view_start(num_decodes)
        return MixedSplit(
            num_decodes=num_decodes,
            decode_seq_lens=metadata.seq_lens[:num_decodes],
            decode_block_table=metadata.block_table[:num_decodes],
            prefill_query_start_loc=metadata.query_start_loc[start:],
            prefill_seq_lens=metadata.seq_lens[start:],
            prefill_block_table=metadata.block_table[start:],
        )

    def binding(self, layer_name: str) -> AsmLayerBinding | None:
        """The asm binding of one of this builder's layers; None when it keeps HIP."""
        return self.asm_bindings.layers.get(layer_name)

    def _bind_layers(self) -> None:
        settings = self.asm_settings
        assert settings is not None
        layers = [
            layer
            for layer in get_layers_from_vllm_config(
                self.vllm_config, Attention, self.layer_names
            ).values()
            if isinstance(layer.impl, AsmDecodeImplMixin)
        ]
        impls = {layer: cast(AsmDecodeImplMixin, layer.impl) for layer in layers}
        cached = [
            layer for layer in layers if impls[layer].attn_type == AttentionType.DECODER
        ]
        if any(layer.kv_cache.dim() != 4 for layer in cached):
            return  # the KV cache is not bound yet: decide at a later build
        again = self.asm_layers_bound
        self.asm_layers_bound = True
        self.asm_bindings = AsmBindings()
        self._resolve_split()
        arch = current_arch()
        kernel, why_not = load_asm_kernel(arch, settings.trust_aiter)
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

        compute_units = num_compute_units()
        self.asm_cut = resolve_cut(compute_units, settings.cut)
        for layer in layers:
            if impls[layer].attn_type != AttentionType.DECODER:
                # Encoder attention has no paged KV cache to decode from.
                impls[layer].asm_rejections = ["not decoder self-attention"]
        cache_config = self.vllm_config.cache_config
        model_config = self.vllm_config.model_config
        self.asm_bindings.layers = decide_layers(
            [(layer, layer.kv_cache) for layer in cached],
            kernel,
            cast(torch.dtype, model_config.dtype),
            model_config.max_model_len,
            # Tables may take only memory vLLM did not claim for itself.
            None
            if cache_config.kv_cache_memory_bytes
            else cache_config.gpu_memory_utilization,
            settings.trust_hint,
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
        settings = self.asm_settings
        assert settings is not None
        max_model_len = self.vllm_config.model_config.max_model_len
        bound = len(self.asm_bindings.layers)
        blocks = sorted({layer.kv_cache.shape[0] for layer in cached})
        mixed = (
            "so do the leading decode requests of mixed steps"
            if self.asm_split_allowed
            else f"mixed steps stay whole on the stock path ({self.asm_split_off})"
        )
        logger.info_once(
            "ROCM_ATTN asm decode: %d of %d layers eligible on %s (KV cache of %s "
            "blocks); pure-decode steps above %d query heads (%s) run "
            "aiter.pa_fwd_asm with high_precision=%d, the rest the HIP decode; %s",
            bound,
            total,
            arch or "an unknown GPU architecture",
            "/".join(map(str, blocks)) or "no",
            self.asm_cut,
            describe_cut(
                compute_units, settings.cut_source if settings.cut is not None else None
            ),
            ULTRA_PRECISION,
            mixed,
        )
        if bound and max_model_len > VALIDATED_CONTEXT:
            logger.info_once(
                "ROCM_ATTN asm decode: contexts above %d tokens (max_model_len %d) are "
                "not validated on hardware",
                VALIDATED_CONTEXT,
                max_model_len,
            )


def _may_split(spec: AttentionSpec, vllm_config: VllmConfig) -> bool:
    """Whether this builder's layers could be eligible at all (so that asking vLLM to
    put decodes first can pay off): an fp8 e4m3 cache of 16-token blocks, head size
    128, no sliding window."""
    return (
        vllm_config.cache_config.cache_dtype in E4M3_CACHE_DTYPES
        and spec.block_size == ASM_BLOCK_SIZE
        and spec.head_size == ASM_HEAD_SIZE
        and not isinstance(spec, SlidingWindowSpec)
    )


def decide_layers(
    entries: list[tuple[Any, torch.Tensor]],
    kernel: AsmKernel,
    query_dtype: torch.dtype,
    max_model_len: int,
    memory_fraction: float | None = None,
    trust_hint: str | None = None,
) -> dict[str, AsmLayerBinding]:
    """Decide decoder layers (with their bound caches) for asm or HIP; returns the
    bindings of those bound for asm, by layer name, and leaves every layer's reasons in
    ``impl.asm_rejections``.

    Each layer is checked against the rule; the scale tables of those that pass are
    budgeted, in layer order, against one memory reading of their device (capped to
    what ``memory_fraction``, vLLM's ``gpu_memory_utilization``, left unclaimed), and
    the layers whose tables do not fit keep the HIP decode too. ``trust_hint`` is
    logged once when an old AITER keeps layers on HIP.
    """
    candidates = []
    old_aiter_kept_hip = False
    for layer, kv_cache in entries:
        facts = layer.impl.layer_facts(kv_cache, query_dtype, max_model_len)
        reasons = rejection_reasons(facts, kernel.table, kernel.aiter)
        layer.impl.asm_rejections = reasons
        if not reasons:
            candidates.append((layer, kv_cache))
        elif kernel.aiter.block_id_problem(facts.num_blocks or 0, facts.kv_page_bytes):
            old_aiter_kept_hip = True
    bindings: dict[str, AsmLayerBinding] = {}
    if candidates:
        device = candidates[0][1].device
        budget = fit_tables(
            [layer.impl.scale_table_keys(layer, kv) for layer, kv in candidates],
            table_memory(device, memory_fraction),
            existing_tables(),
        )
        kv_bytes = sum(
            {
                kv.data_ptr(): kv.numel() * kv.element_size() for _, kv in entries
            }.values()
        )
        fitting = sum(budget.fits)
        logger.info(
            "ROCM_ATTN asm decode: %d scale table(s) for %d layer(s), %s, %.3f %% of "
            "their KV cache%s",
            budget.tables,
            len(candidates),
            mib(budget.bytes),
            100 * budget.bytes / max(kv_bytes, 1),
            ""
            if fitting == len(candidates)
            else f"; {mib(budget.new_bytes)} of them fit for {fitting} layer(s)",
        )
        no_room = (
            f"scale tables that do not fit in the free device memory vLLM left "
            f"({mib(budget.free or 0)} on {device}, {mib(budget.margin)} kept spare)"
        )
        for (layer, kv_cache), fits in zip(candidates, budget.fits, strict=True):
            if fits:
                bindings[layer.layer_name] = layer.impl.make_binding(
                    layer, kv_cache, kernel, query_dtype
                )
            else:
                layer.impl.asm_rejections = [no_room]
    if old_aiter_kept_hip and trust_hint:
        logger.warning_once("ROCM_ATTN asm decode: %s", trust_hint)
    return bindings
