"""Real vLLM 0.33 objects for the tests: configs, layers, a KV cache laid out as vLLM lays
it out, metadata from the real builder, and torch stand-ins for the device kernels.

The stand-in kernels (installed by :func:`install_kernel_standins`) replace only what
cannot run on a CPU: vLLM's native cache writer ``reshape_and_cache``, the HIP decode
``paged_attention_rocm`` and the Triton prefill ``context_attention_fwd``. Each reads
and writes vLLM's own cache layout through the tensors' real strides, so they behave
as the device kernels do for any layout vLLM hands them.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import background
from vllm_rocm_asm_decode.tools.testbed import (  # noqa: F401 - the tests use them via harness
    MODEL_LAYER,
    Batch,
    Model,
    ScaleCheckpoint,
    build_model,
    fill_context,
    fp32_attention,
    load_checkpoint_scales,
    make_batch,
    make_vllm_config,
    reference,
    run_layer,
    set_layer_scales,
    store_fp8_keys,
    store_fp8_tokens,
    write_model_dir,
    write_step,
)

# --------------------------------------------------------------------------------------
# Which form of the change runs: the plugin on stock vLLM, or vLLM patched by `upstream`

#: ``plugin`` (default): the plugin registered on the installed vLLM. ``in-tree``: the
#: vLLM on ``PYTHONPATH`` carries stages 1..``ASM_DECODE_TEST_STAGE`` of the change
#: (``vllm-rocm-asm-decode upstream --stage N``) and the plugin is not loaded.
FORM = os.environ.get("ASM_DECODE_TEST_FORM", "plugin")
IN_TREE = FORM == "in-tree"
#: The in-tree stage under test; None for the plugin.
STAGE = int(os.environ.get("ASM_DECODE_TEST_STAGE", "1")) if IN_TREE else None
#: Whether mixed prefill+decode steps split (the plugin, and in-tree from stage 2).
SPLITS_MIXED = STAGE is None or STAGE >= 2
#: The logger the asm decode's lines go to in this form.
LOGGER_NAME = "vllm.v1.attention.backends.rocm_attn" if IN_TREE else "vllm.rocm_asm_decode"
#: For tests of what only the plugin has: its guards (AITER version and kernel files,
#: signature checks, table memory), its settings, its bindings and its log lines.
plugin_only = pytest.mark.skipif(IN_TREE, reason="the plugin's own guard; not in-tree")
#: For tests of the mixed split (the plugin, and in-tree from stage 2).
splits_mixed = pytest.mark.skipif(not SPLITS_MIXED, reason="mixed steps stay whole before stage 2")


def rule(name: str):
    """A name :mod:`vllm_rocm_asm_decode.core` or ``.mixed`` defines, from where this
    form has it (in-tree: ``rocm_attn.py``, where stages 1 and 2 write them)."""
    if IN_TREE:
        from vllm.v1.attention.backends import rocm_attn

        return getattr(rocm_attn, f"_{name}")  # private in vLLM
    from vllm_rocm_asm_decode import core, mixed

    return getattr(core, name) if hasattr(core, name) else getattr(mixed, name)


def asm_enabled(builder) -> bool:
    """Whether this builder may run the asm decode at all (ROCM_ATTN's own builder, its
    switch and AITER's MHA on)."""
    if IN_TREE:
        from vllm._aiter_ops import rocm_aiter_ops
        from vllm.v1.attention.backends.rocm_attn import RocmAttentionMetadataBuilder

        own = type(builder) is RocmAttentionMetadataBuilder
        on = builder.vllm_config.attention_config.use_aiter_asm_decode  # its switch
        return own and on and bool(rocm_aiter_ops.is_mha_enabled())
    return builder.asm_settings is not None


def asm_layers(builder) -> set[str]:
    """The layers the builder bound for the asm decode (after its first build)."""
    if IN_TREE:
        return {layer.layer_name for layer in builder._asm_scales}
    return set(builder.asm_bindings.layers)


def scale_tables(builder, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V scale tables the asm decode of layer ``name`` reads."""
    if IN_TREE:
        by_name = {layer.layer_name: t for layer, t in builder._asm_scales.items()}
        return by_name[name]
    return builder.binding(name).scales


def kept_on_hip(log: list[str], reason: str) -> bool:
    """Whether the asm decode's log says that layers with ``reason`` keep the HIP decode
    (the plugin at info level, in-tree at debug level)."""
    return any(("HIP decode" in m or "keeps HIP" in m) and reason in m for m in log)


def spy_stock_path(monkeypatch) -> list[dict[str, Any]]:
    """Record the calls that reach the stock path's attention kernel
    (``rocm_attn.chunked_prefill_paged_decode``, whose Triton fallbacks cannot run on a
    CPU) instead of running it. The same place in both forms: the plugin's
    ``super().forward`` and the in-tree ``forward`` after its asm branch. (From stage
    2 a split step's prefill goes there too, with ``prefill_only=True``; the plugin
    calls the prefill kernel itself.)"""
    from vllm.v1.attention.backends import rocm_attn

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(rocm_attn, "chunked_prefill_paged_decode", lambda **kw: calls.append(kw))
    return calls


def stock_layers(calls: list[dict[str, Any]], model: Model) -> list[str]:
    """The layers whose calls :func:`spy_stock_path` recorded, by their KV scale."""
    names = {id(layer._k_scale): name for name, layer in model.layers.items()}
    return [names[id(call["k_scale"])] for call in calls]


def asm_backend() -> type:
    """The class ``ROCM_ATTN`` resolves to when the asm decode is on in this form."""
    if IN_TREE:
        from vllm.v1.attention.backends.rocm_attn import RocmAttentionBackend

        return RocmAttentionBackend
    from vllm_rocm_asm_decode.backend import RocmAsmDecodeBackend

    return RocmAsmDecodeBackend


@contextlib.contextmanager
def untouched_kv_caches() -> Iterator[None]:
    """vLLM's KV-cache allocation left unzeroed (``torch.zeros`` of 64 Mi elements or
    more read as ``torch.empty`` while this holds; ``allocate_kv_cache`` makes one such
    call): a pool of several GiB, as the page-span guard needs, costs only the pages a
    test writes (fresh pages of a large host allocation read zeros). Smaller tensors (a
    block table's null rows) are zeroed as asked."""
    real = torch.zeros

    def zeros(*size: Any, **kwargs: Any) -> torch.Tensor:
        shape = size[0] if len(size) == 1 and not isinstance(size[0], int) else size
        return (torch.empty if math.prod(shape) >= 2**26 else real)(*size, **kwargs)

    torch.zeros = zeros
    try:
        yield
    finally:
        torch.zeros = real


def build_untouched_model(tmp_path, **kw) -> Model:
    """:func:`build_model` with :func:`untouched_kv_caches`."""
    with untouched_kv_caches():
        return build_model(tmp_path, **kw)


# --------------------------------------------------------------------------------------
# Kernel stand-ins (vLLM's layout: K [nb, nkv, hd/x, bs, x], V [nb, nkv, hd, bs])


@dataclass
class KernelLog:
    """Which stand-in kernels ran."""

    hip_decode: int = 0
    prefill: int = 0
    cache_writes: int = 0


KERNELS = KernelLog()


def interleaved_v_pages(value_cache: torch.Tensor) -> torch.Tensor:
    """vLLM's V view ``[nb, nkv, hd, bs]`` re-read as the interleaved V the fused RoPE +
    cache writer stores after ``set_interleaved_v_cache()``: each page
    ``[bs/x, hd, x]`` with ``x = 16 / element size`` (token slot ``s`` of dim ``d`` at
    ``(s // x, d, s % x)``), through the view's real block and head strides."""
    nb, nkv, hd, bs = value_cache.shape
    x = 16 // value_cache.element_size()
    return torch.as_strided(
        value_cache,
        (nb, nkv, bs // x, hd, x),
        (value_cache.stride(0), value_cache.stride(1), hd * x, x, 1),
        value_cache.storage_offset(),
    )


def _gather_kv(
    key_cache, value_cache, block_row, seq_len, k_scale, v_scale, fp8_dtype, interleaved=False
):
    """[nkv, seq_len, hd] K and V of one sequence, dequantized to fp32, via real strides."""
    bs = value_cache.shape[3]
    n_pages = (seq_len + bs - 1) // bs
    pages = block_row[:n_pages].long()
    kc, vc = key_cache, value_cache
    if kc.dtype == torch.uint8:
        kc, vc = kc.view(fp8_dtype), vc.view(fp8_dtype)
    k = kc[pages].float()  # [p, nkv, hd/x, bs, x]
    nkv = k.shape[1]
    k = k.permute(1, 0, 3, 2, 4).reshape(nkv, n_pages * bs, -1)[:, :seq_len]
    if interleaved:  # [p, nkv, bs/x, hd, x] -> [nkv, p, bs/x, x, hd]
        v = interleaved_v_pages(vc)[pages].float().permute(1, 0, 2, 4, 3)
    else:  # [p, nkv, hd, bs] -> [nkv, p, bs, hd]
        v = vc[pages].float().permute(1, 0, 3, 2)
    v = v.reshape(nkv, n_pages * bs, -1)[:, :seq_len]
    return k * float(k_scale), v * float(v_scale)


def hip_decode_reference(
    out,
    exp_sum,
    max_logits,
    tmp_out,
    query,
    key_cache,
    value_cache,
    num_kv_heads,
    scale,
    block_tables,
    seq_lens,
    query_start_loc,
    block_size,
    max_seq_len,
    alibi_slopes,
    kv_cache_dtype,
    k_scale,
    v_scale,
    fp8_out_scale=None,
    mfma_type="f16",
    use_interleaved_v_cache=False,
) -> None:
    """Torch stand-in for ``ops.paged_attention_rocm``: decode rows (query length 1)."""
    from vllm.platforms import current_platform

    KERNELS.hip_decode += 1
    qsl = query_start_loc.tolist() if query_start_loc is not None else None
    for i, seq_len in enumerate(seq_lens.tolist()):
        row = qsl[i] if qsl is not None else i
        if qsl is not None and qsl[i + 1] - qsl[i] != 1:
            continue  # prefill rows are the prefill kernel's
        if seq_len <= 0:
            continue
        k, v = _gather_kv(
            key_cache,
            value_cache,
            block_tables[i],
            seq_len,
            k_scale,
            v_scale,
            current_platform.fp8_dtype(),
            interleaved=use_interleaved_v_cache,
        )
        # _gather_kv gives [kv_heads, tokens, head]; fp32_attention takes [tokens, ...].
        res = fp32_attention(query[row : row + 1], k.transpose(0, 1), v.transpose(0, 1), scale)
        out[row] = res[0].to(out.dtype)


def prefill_reference(
    q,
    k,
    v,
    o,
    kv_cache_dtype,
    k_cache,
    v_cache,
    b_loc,
    b_start_loc,
    b_seq_len,
    max_seq_len,
    max_input_len,
    k_scale,
    v_scale,
    alibi_slopes=None,
    sliding_window=None,
    sm_scale=None,
    skip_decode=False,
    fp8_out_scale=None,
    sinks=None,
    is_block_table_ptr=False,
    interleaved_v_pack_factor=0,
    causal=True,
) -> None:
    """Torch stand-in for Triton ``context_attention_fwd``: causal prefill rows, reading
    the context (including this step's tokens, already written) from the cache."""
    from vllm.platforms import current_platform

    KERNELS.prefill += 1
    starts = b_start_loc.tolist()
    for i, seq_len in enumerate(b_seq_len.tolist()):
        qlen = starts[i + 1] - starts[i]
        if qlen == 0 or (skip_decode and qlen == 1):
            continue
        kk, vv = _gather_kv(
            k_cache,
            v_cache,
            b_loc[i],
            seq_len,
            k_scale,
            v_scale,
            current_platform.fp8_dtype(),
            interleaved=interleaved_v_pack_factor > 0,
        )
        qq = q[starts[i] : starts[i + 1]]
        res = fp32_attention(qq, kk.transpose(0, 1), vv.transpose(0, 1), sm_scale)
        o[starts[i] : starts[i + 1]] = res.to(o.dtype)


def cache_writer(
    key,
    value,
    key_cache,
    value_cache,
    slot_mapping,
    kv_cache_dtype,
    k_scale,
    v_scale,
    interleaved_v=False,
) -> None:
    """Torch stand-in for ``ops.reshape_and_cache``: quantize and store through the
    cache's real strides (vLLM's K [nb, nkv, hd/x, bs, x] and V [nb, nkv, hd, bs], or
    with ``interleaved_v`` the V layout of :func:`interleaved_v_pages`)."""
    from vllm.platforms import current_platform

    KERNELS.cache_writes += 1
    fp8 = current_platform.fp8_dtype()
    slots = slot_mapping.long()
    keep = slots >= 0
    k_fp8 = (key[keep].float() / float(k_scale)).to(fp8)
    v_fp8 = (value[keep].float() / float(v_scale)).to(fp8)
    if not interleaved_v:
        store_fp8_tokens(key_cache, value_cache, slots[keep], k_fp8, v_fp8)
        return
    store_fp8_keys(key_cache, slots[keep], k_fp8)
    block = value_cache.shape[3]
    blk, off = slots[keep] // block, slots[keep] % block
    v_pages = interleaved_v_pages(value_cache.view(torch.uint8))
    x = v_pages.shape[-1]
    v_pages[blk, :, off // x, :, off % x] = v_fp8.view(torch.uint8)


def install_kernel_standins(monkeypatch) -> KernelLog:
    """Replace the three device kernels with the stand-ins above for one test."""
    from vllm import _custom_ops
    from vllm.v1.attention.ops import chunked_prefill_paged_decode as cppd

    log = KernelLog()
    monkeypatch.setattr(sys.modules[__name__], "KERNELS", log)
    monkeypatch.setattr(_custom_ops, "paged_attention_rocm", hip_decode_reference)
    monkeypatch.setattr(_custom_ops, "reshape_and_cache", cache_writer)
    monkeypatch.setattr(cppd, "context_attention_fwd", prefill_reference)
    return log


def asm_calls() -> list[dict[str, Any]]:
    """Calls of the stand-in ``aiter.pa_fwd_asm`` (none where aiter is absent)."""
    try:
        import aiter
    except ImportError:
        return []
    return aiter.CALLS


def reset_asm_calls() -> None:
    asm_calls().clear()


def run_console(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed ``vllm-rocm-asm-decode`` command in a plain environment (none of the
    tests' stand-ins or settings), as a user on this CPU machine runs it."""
    base = os.environ if env is None else env
    plain = {k: v for k, v in base.items() if not k.startswith(("VLLM_", "ASM_DECODE"))}
    plain |= {"HIP_VISIBLE_DEVICES": ""} | background.ONE_THREAD
    exe = os.path.join(os.path.dirname(sys.executable), "vllm-rocm-asm-decode")
    return background.run([exe, *args], plain, timeout=600)
