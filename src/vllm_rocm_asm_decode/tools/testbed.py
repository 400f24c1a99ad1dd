"""Real vLLM 0.33 objects for the tests and the validation tools: a config from a
``config.json``, attention layers built as a model builds them, a KV cache planned,
allocated and bound as vLLM's worker does, the selected backend's metadata builder,
decode batches, and an fp32 reference. Nothing here is a stand-in: on a GPU these are the
objects a vLLM worker holds (``device="cuda"``); on a CPU they need the tests' stand-ins.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

MODEL_LAYER = "model.layers.{}.self_attn.attn"


# --------------------------------------------------------------------------------------
# Configs, layers, KV cache


def write_model_dir(
    path: Path,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int = 128,
    num_layers: int = 2,
    max_position: int = 40960,
    extra: dict[str, Any] | None = None,
) -> Path:
    """A directory with a Llama-style ``config.json`` (no weights are ever loaded)."""
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": num_heads * head_dim,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "num_hidden_layers": num_layers,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "max_position_embeddings": max_position,
        "torch_dtype": "bfloat16",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
    }
    config.update(extra or {})
    (path / "config.json").write_text(json.dumps(config))
    return path


#: The testbed's ``max_num_seqs``: room for the largest batch its users build (a
#: 512-request capture batch and its padding).
MAX_NUM_SEQS = 1024


def make_vllm_config(
    model_dir: Path,
    *,
    cache_dtype: str = "fp8",
    block_size: int = 16,
    dtype: str = "bfloat16",
    max_model_len: int | None = None,
    layout: str | None = None,
    device: str = "cpu",
):
    """A ``VllmConfig`` of the model in ``model_dir``; on a vLLM that carries the asm
    decode itself (``upstream``), with its ``AttentionConfig`` switch on (off by
    default there). ``max_num_seqs`` is :data:`MAX_NUM_SEQS`: vLLM's runner never
    holds more requests than that, and a builder sizes its buffers by it."""
    from vllm.config import AttentionConfig, CacheConfig, DeviceConfig, ModelConfig, VllmConfig

    model_config = ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, dtype=dtype, max_model_len=max_model_len
    )
    cache_config = CacheConfig(cache_dtype=cache_dtype, block_size=block_size)
    if layout is not None:
        cache_config.kv_cache_layout = layout
    attention_config = AttentionConfig()
    if hasattr(attention_config, "use_aiter_asm_decode"):
        attention_config.use_aiter_asm_decode = True
    vllm_config = VllmConfig(
        model_config=model_config,
        device_config=DeviceConfig(device=device),
        cache_config=cache_config,
        attention_config=attention_config,
    )
    vllm_config.scheduler_config.max_num_seqs = MAX_NUM_SEQS
    return vllm_config


@dataclass
class Model:
    """Attention layers of one model with a bound KV cache and a metadata builder."""

    vllm_config: Any
    layers: dict[str, Any]
    backend: type
    builder: Any
    spec: Any
    layout: Any
    num_blocks: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    device: str = "cpu"

    @property
    def names(self) -> list[str]:
        return list(self.layers)


def build_model(
    tmp_path: Path | None = None,
    *,
    num_heads: int = 40,
    num_kv_heads: int = 8,
    head_size: int = 128,
    num_layers: int = 2,
    cache_dtype: str = "fp8",
    block_size: int = 16,
    dtype: str = "bfloat16",
    num_blocks: int = 256,
    layout: str | None = None,
    max_model_len: int | None = None,
    max_position: int = 40960,
    layer_kwargs: Sequence[dict[str, Any]] = (),
    scales: Sequence[tuple[float, float]] = (),
    device: str = "cpu",
) -> Model:
    """Layers built as a model builds them, a KV cache planned, allocated and bound as
    vLLM's worker does, and the selected backend's metadata builder. Its ``config.json``
    is written under ``tmp_path``, or without one into a folder removed once the config
    has read it."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec
    from vllm.v1.worker.utils import allocate_kv_cache, bind_kv_cache, customize_attention_spec

    with contextlib.ExitStack() as scratch:
        if tmp_path is None:
            tmp_path = Path(scratch.enter_context(tempfile.TemporaryDirectory()))
        model_dir = write_model_dir(
            tmp_path / "model",
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_size,
            num_layers=num_layers,
            max_position=max_position,
        )
        vllm_config = make_vllm_config(
            model_dir,
            cache_dtype=cache_dtype,
            block_size=block_size,
            dtype=dtype,
            max_model_len=max_model_len,
            layout=layout,
            device=device,
        )
    layers = {}
    with set_current_vllm_config(vllm_config):
        for i in range(num_layers):
            kwargs = {"scale": head_size**-0.5}
            if i < len(layer_kwargs):
                kwargs.update(layer_kwargs[i])
            name = MODEL_LAYER.format(i)
            layers[name] = Attention(
                num_heads=num_heads,
                head_size=head_size,
                num_kv_heads=num_kv_heads,
                cache_config=vllm_config.cache_config,
                prefix=name,
                **kwargs,
            )
    for i, layer in enumerate(layers.values()):
        k_scale, v_scale = scales[i] if i < len(scales) else (1.0, 1.0)
        set_layer_scales(layer, k_scale, v_scale)

    backend = next(iter(layers.values())).attn_backend
    assert all(layer.attn_backend is backend for layer in layers.values())
    spec = customize_attention_spec(
        backend, next(iter(layers.values())).get_kv_cache_spec(vllm_config)
    )
    resolved = resolve_kv_cache_layout(
        vllm_config, [[m.name for m in backend.supported_kv_cache_layouts()]], [spec]
    )
    groups = [KVCacheGroupSpec(list(layers), spec)]
    kv_config = get_kv_cache_config_from_groups(
        vllm_config, groups, available_memory=num_blocks * spec.page_size_bytes * num_layers
    )
    caches = allocate_kv_cache(kv_config, torch.device(device), resolved)
    bind_kv_cache(caches, vllm_config.compilation_config.static_forward_context, [])
    if device != "cpu":
        for layer in layers.values():
            layer.to(device)
    builder = backend.get_builder_cls()(spec, list(layers), vllm_config, torch.device(device))
    return Model(
        vllm_config=vllm_config,
        layers=layers,
        backend=backend,
        builder=builder,
        spec=spec,
        layout=resolved,
        num_blocks=kv_config.num_blocks,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        block_size=block_size,
        device=device,
    )


def set_layer_scales(layer, k_scale: float, v_scale: float) -> None:
    """Final per-tensor KV scales, as weight loading leaves them."""
    layer._k_scale.fill_(k_scale)
    layer._v_scale.fill_(v_scale)
    layer._k_scale_float = float(k_scale)
    layer._v_scale_float = float(v_scale)


# --------------------------------------------------------------------------------------
# Batches


@dataclass
class Batch:
    """One step: per-request context lengths (after this step) and query lengths."""

    seq_lens: list[int]
    query_lens: list[int]
    block_table: torch.Tensor
    query: torch.Tensor  # [tokens, H, D]
    key: torch.Tensor  # [tokens, KVH, D], this step's new keys
    value: torch.Tensor
    slot_mapping: torch.Tensor
    common: Any  # CommonAttentionMetadata
    contexts: list[tuple[torch.Tensor, torch.Tensor]]  # full K/V per request [L, KVH, D]

    @property
    def num_tokens(self) -> int:
        return int(sum(self.query_lens))


def make_batch(
    model: Model,
    seq_lens: Sequence[int],
    query_lens: Sequence[int] | None = None,
    *,
    pad_to: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    contexts: bool = True,
    pages: Sequence[Sequence[int]] | None = None,
) -> Batch:
    """A batch whose requests own distinct random blocks (block 0 is vLLM's null block),
    or the blocks ``pages`` names for each request.

    ``pad_to`` appends CUDA-graph padding requests: query length 1, sequence length 0,
    block-table rows of the null block. ``contexts=False`` skips drawing every token's
    K and V (for timing, where the cache content does not matter).
    """
    from vllm.v1.attention.backend import CommonAttentionMetadata

    gen = torch.Generator().manual_seed(seed)
    seq_lens = list(seq_lens)
    query_lens = list(query_lens) if query_lens is not None else [1] * len(seq_lens)
    bs = model.block_size
    counts = [math.ceil(n / bs) for n in seq_lens]
    if pages is None:
        free = (torch.randperm(model.num_blocks - 1, generator=gen) + 1).tolist()
        assert sum(counts) <= len(free), "not enough KV blocks for this batch"
        pages = [free[sum(counts[:i]) : sum(counts[: i + 1])] for i in range(len(counts))]
    assert [len(p) for p in pages] == counts, "one block per started page of each request"
    table = torch.zeros(len(seq_lens), max([*counts, 1]) + 1, dtype=torch.int32)
    for i, blocks in enumerate(pages):
        table[i, : len(blocks)] = torch.tensor(list(blocks), dtype=torch.int32)
    drawn = []
    q_rows, k_rows, v_rows, slots = [], [], [], []
    kvh, hd, h = model.num_kv_heads, model.head_size, model.num_heads
    for i, (seq_len, qlen) in enumerate(zip(seq_lens, query_lens, strict=True)):
        n = seq_len if contexts else qlen
        k = torch.randn(n, kvh, hd, generator=gen)
        v = torch.randn(n, kvh, hd, generator=gen)
        if contexts:
            drawn.append((k, v))
        q_rows.append(torch.randn(qlen, h, hd, generator=gen))
        k_rows.append(k[n - qlen :])
        v_rows.append(v[n - qlen :])
        pos = torch.arange(seq_len - qlen, seq_len)
        slots.append(table[i, pos // bs].long() * bs + pos % bs)
    n_pad = (pad_to - len(seq_lens)) if pad_to else 0
    if n_pad > 0:
        table = torch.cat([table, torch.zeros(n_pad, table.shape[1], dtype=torch.int32)])
        q_rows.append(torch.randn(n_pad, h, hd, generator=gen))
        k_rows.append(torch.zeros(n_pad, kvh, hd))
        v_rows.append(torch.zeros(n_pad, kvh, hd))
        slots.append(torch.full((n_pad,), -1, dtype=torch.long))
        seq_lens = seq_lens + [0] * n_pad
        query_lens = query_lens + [1] * n_pad
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    slot_mapping = torch.cat(slots)
    dev = model.device
    table, slot_mapping = table.to(dev), slot_mapping.to(dev)
    common = CommonAttentionMetadata(
        query_start_loc=qsl.to(dev),
        query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        num_reqs=len(seq_lens),
        num_actual_tokens=int(sum(query_lens)),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=table,
        slot_mapping=slot_mapping,
        seq_lens_cpu_upper_bound=torch.tensor(seq_lens, dtype=torch.int32),
    )
    return Batch(
        seq_lens=seq_lens,
        query_lens=query_lens,
        block_table=table,
        query=torch.cat(q_rows).to(dev, dtype),
        key=torch.cat(k_rows).to(dev, dtype),
        value=torch.cat(v_rows).to(dev, dtype),
        slot_mapping=slot_mapping,
        common=common,
        contexts=drawn,
    )


def fill_context(model: Model, batch: Batch) -> None:
    """Write every request's earlier tokens into every layer's cache with vLLM's writer
    path (``impl.do_kv_cache_update``); this step's tokens are written by ``forward``."""
    for layer in model.layers.values():
        for i, (k, v) in enumerate(batch.contexts):
            seq_len, qlen = batch.seq_lens[i], batch.query_lens[i]
            n = seq_len - qlen
            if n <= 0:
                continue
            pos = torch.arange(n, device=model.device)
            slots = batch.block_table[i, pos // model.block_size].long() * model.block_size
            slots = slots + pos % model.block_size
            kk, vv = (t[:n].to(model.device, batch.key.dtype) for t in (k, v))
            layer.impl.do_kv_cache_update(layer, kk, vv, layer.kv_cache, slots)


def write_step(model: Model, batch: Batch) -> None:
    """Write this step's new tokens into every layer's cache, as ``Attention`` does before
    it calls ``impl.forward`` (padding rows have slot -1 and are skipped)."""
    for layer in model.layers.values():
        layer.impl.do_kv_cache_update(
            layer, batch.key, batch.value, layer.kv_cache, batch.slot_mapping
        )


def run_layer(model: Model, name: str, batch: Batch, metadata) -> torch.Tensor:
    """``Attention.forward`` of one layer under a real forward context: cache update,
    then attention. Returns ``[tokens, H, D]``."""
    from vllm.forward_context import set_forward_context

    layer = model.layers[name]
    # The custom ops behind the indirect call are registered for the CUDA dispatch key
    # only; the direct call runs the same Python functions without the op wrapper.
    layer.use_direct_call = True
    with set_forward_context(
        {name: metadata}, model.vllm_config, slot_mapping={name: batch.slot_mapping}
    ):
        out = layer(
            batch.query.reshape(batch.num_tokens, -1),
            batch.key.reshape(batch.num_tokens, -1),
            batch.value.reshape(batch.num_tokens, -1),
        )
    return out.view(batch.num_tokens, model.num_heads, model.head_size)


def fp32_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """The reference every check compares with: fp32 causal attention of one request's
    last ``len(q)`` tokens over its whole context.

    ``q`` ``[q_len, heads, head]``; ``k``, ``v`` ``[context, kv_heads, head]`` (query heads
    grouped over KV heads in order). Query row ``i`` sits at position
    ``context - q_len + i`` and sees the keys up to it. Returns ``[q_len, heads, head]``.
    """
    q_len, context = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    kk = k.float().repeat_interleave(group, dim=1)
    vv = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,thd->hqt", q.float(), kk) * scale
    position = torch.arange(context - q_len, context)
    future = torch.arange(context)[None, :] > position[:, None]
    probs = torch.softmax(scores.masked_fill(future, -math.inf), dim=-1)
    return torch.einsum("hqt,thd->qhd", probs, vv)


def reference(model: Model, batch: Batch, layer, fp8: bool = True) -> torch.Tensor:
    """:func:`fp32_attention` of every request from the original K/V, rounded through the
    fp8 cache format (so the only differences left are bf16 query/output rounding).
    Padding rows: zeros."""
    from vllm.platforms import current_platform

    out = torch.zeros(batch.num_tokens, model.num_heads, model.head_size)
    query = batch.query.cpu()
    ks, vs = layer._k_scale_float, layer._v_scale_float
    fp8_dtype = current_platform.fp8_dtype()
    row = 0
    for i, (k, v) in enumerate(batch.contexts):
        qlen = batch.query_lens[i]
        if fp8:
            k = (k.to(batch.key.dtype).float() / ks).to(fp8_dtype).float() * ks
            v = (v.to(batch.key.dtype).float() / vs).to(fp8_dtype).float() * vs
        out[row : row + qlen] = fp32_attention(query[row : row + qlen], k, v, layer.impl.scale)
        row += qlen
    return out


class ScaleCheckpoint(torch.nn.Module):
    """A model's attention layers as vLLM's loader and its weight reload see them, for
    their KV scales alone. The layers must be built with an fp8 checkpoint's quantization
    config (``layer_kwargs=[{"quant_config": Fp8Config()}] * n``); loading and reloading
    then run vLLM's own code (``process_weights_after_loading``, ``reload_weights``),
    which copies a reload's scales into the layers' scale tensors in place."""

    def __init__(self, model: Model) -> None:
        from vllm.model_executor.model_loader.reload import record_metadata_for_reloading

        super().__init__()
        self.attn = torch.nn.ModuleList(model.layers.values())
        self._model = model
        record_metadata_for_reloading(self)

    def _weights(self, scales: Sequence[tuple[float, float]]) -> list[tuple[str, Any]]:
        return [
            (f"attn.{i}.{side}_scale", torch.tensor(scale))
            for i, pair in enumerate(scales)
            for side, scale in zip("kv", pair, strict=True)
        ]

    def load_weights(self, weights) -> set[str]:
        """What a model's ``load_weights`` does: each tensor to its parameter's loader."""
        names = set()
        for name, tensor in weights:
            param = self.get_parameter(name)
            param.weight_loader(param, tensor)
            names.add(name)
        return names

    def load(self, scales: Sequence[tuple[float, float]]) -> None:
        """The first load: per-layer (K, V) scales, then vLLM's post-load step."""
        from vllm.model_executor.model_loader.utils import process_weights_after_loading

        self.load_weights(self._weights(scales))
        config = self._model.vllm_config.model_config
        process_weights_after_loading(self, config, torch.device(self._model.device))

    def reload(self, scales: Sequence[tuple[float, float]]) -> None:
        """vLLM's in-place weight reload of these scales."""
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        weights = iter(self._weights(scales))
        reload_weights(self._model.vllm_config, self, weights, None, True)


def load_checkpoint_scales(layer, k_scale: float, v_scale: float) -> None:
    """Per-tensor KV scales as a checkpoint gives them, finalized by vLLM's own
    post-load step (which doubles them for gfx942's e4m3fnuz format)."""
    from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod

    method = BaseKVCacheMethod(quant_config=None)  # type: ignore[arg-type]
    method.create_weights(layer)
    layer.quant_method = method  # as vLLM's Attention does for a quantized model
    layer.k_scale.data.fill_(k_scale)
    layer.v_scale.data.fill_(v_scale)
    method.process_weights_after_loading(layer)


def store_fp8_keys(key_cache: torch.Tensor, slots: torch.Tensor, k_fp8: torch.Tensor) -> None:
    """Store quantized keys ``[n, kv_heads, head]`` at cache ``slots`` through the view's
    real strides, in vLLM's K layout ``[blocks, kv_heads, head/x, block, x]``."""
    block, x = key_cache.shape[3], key_cache.shape[4]
    n, kv_heads = k_fp8.shape[:2]
    key_cache.view(torch.uint8)[slots // block, :, :, slots % block, :] = k_fp8.view(
        torch.uint8
    ).view(n, kv_heads, -1, x)


def store_fp8_tokens(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slots: torch.Tensor,
    k_fp8: torch.Tensor,
    v_fp8: torch.Tensor,
) -> None:
    """Store quantized tokens ``[n, kv_heads, head]`` at cache ``slots`` through the views'
    real strides, in vLLM's layout: K ``[blocks, kv_heads, head/x, block, x]``, V
    ``[blocks, kv_heads, head, block]``."""
    store_fp8_keys(key_cache, slots, k_fp8)
    block = value_cache.shape[3]
    value_cache.view(torch.uint8)[slots // block, :, :, slots % block] = v_fp8.view(torch.uint8)
