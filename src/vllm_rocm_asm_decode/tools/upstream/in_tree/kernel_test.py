"""ROCM_ATTN's decode on AITER's pa_fwd_asm (high_precision=2) over its fp8 KV cache."""

import importlib.metadata
import json
from dataclasses import replace
from unittest import mock

import pytest
import torch
from packaging.version import InvalidVersion, Version
from torch.utils._python_dispatch import TorchDispatchMode

from vllm import config as cfg
from vllm._aiter_ops import rocm_aiter_ops
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.quantization.fp8 import Fp8Config
from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
from vllm.model_executor.model_loader.reload.inplace import reload_weights
from vllm.model_executor.model_loader.utils import process_weights_after_loading
from vllm.platforms import current_platform
from vllm.utils.math_utils import cdiv
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends import rocm_attn
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm_rocm_asm_decode.core import asm_decode_rejections

HEAD, BLOCK, PAD = 128, 16, 8
CONTEXTS = [1, 15, 16, 17, 255, 1000, 4000, 40960]  # to the rule's max_model_len
# asm vs HIP: the sum of their errors vs fp32 on MI355X with headroom, times the V scale
ASM_MAX, ASM_MEAN = 0.05, 0.002  # asm 0.026 / 0.00078, HIP 0.0072 / 0.00018 (max/mean)
try:  # PackageNotFoundError is an ImportError; vllm.platforms.rocm imports on ROCm only
    ASM = Version(importlib.metadata.version("amd-aiter")) >= Version("0.1.17")
    ASM = ASM and importlib.import_module("vllm.platforms.rocm").on_mi3xx()
    ASM &= torch.accelerator.is_available()
except (ImportError, InvalidVersion):
    ASM = False
requires_asm = pytest.mark.skipif(not ASM, reason="needs AITER 0.1.17+, gfx942/gfx950")
pytestmark = pytest.mark.skipif(not current_platform.is_rocm(), reason="ROCm only")
DEVICE = "cuda" if ASM else "cpu"  # the builder's host-side tests run on any ROCm host
AITER = {"amd-aiter": "0.1.17"}  # the version the host tests' builders read


@pytest.fixture(autouse=True)
def _aiter_on_seeded(monkeypatch):
    torch.manual_seed(0)
    monkeypatch.setattr(rocm_aiter_ops, "_AITER_ENABLED", True)
    monkeypatch.setattr(rocm_aiter_ops, "_MHA_ENABLED", True)


@pytest.fixture
def gfx942(monkeypatch):
    """Stubs of what the builder reads of the GPU and AITER: gfx942, AITER 0.1.17."""
    monkeypatch.setattr("vllm.platforms.rocm.on_mi3xx", lambda: True)
    real = importlib.metadata.version  # AITER's metadata (AITER itself is not imported)
    monkeypatch.setattr("importlib.metadata.version", lambda x: AITER.get(x) or real(x))
    monkeypatch.setattr(current_platform, "num_compute_units", lambda i=0: 304)
    monkeypatch.setattr(rocm_aiter_ops, "is_mha_enabled", lambda: True)


class NoSync(TorchDispatchMode):
    """Fails a host read of a tensor's value (item, int, bool): on a GPU, a sync (the
    GPU test's sync debug mode sees the others, .tolist() and .cpu())."""

    def __torch_dispatch__(self, op, types, args=(), kwargs=None):
        assert op != torch.ops.aten._local_scalar_dense.default, "a host read"
        return op(*args, **(kwargs or {}))


def llama(path, heads=40, kvh=8, **kw):
    sizes = dict(num_attention_heads=heads, num_key_value_heads=kvh, head_dim=HEAD)
    sizes |= dict(hidden_size=heads * HEAD, num_hidden_layers=1, model_type="llama")
    sizes |= dict(architectures=["LlamaForCausalLM"], max_position_embeddings=2**20)
    (path / "config.json").write_text(json.dumps(sizes))
    return cfg.ModelConfig(str(path), skip_tokenizer_init=True, **kw)


def kv_scales(*layers):  # [(k, v), ...] as a checkpoint's weights
    names = [f"layers.{i}.{kv}_scale" for i in range(len(layers)) for kv in "kv"]
    return list(zip(names, map(torch.tensor, sum(layers, ())), strict=True))


class Model(torch.nn.Module):
    """ROCM_ATTN layers of an fp8 checkpoint, one random fp8 KV cache, a builder."""

    def __init__(self, path, heads, kvh, blocks, dtype, scales=((0.5, 2.0),)):
        super().__init__()
        model = llama(path, heads, kvh, dtype=dtype, max_model_len=CONTEXTS[-1])
        cache = cfg.CacheConfig(cache_dtype="fp8", block_size=BLOCK)
        device = cfg.DeviceConfig(DEVICE)
        self.config = cfg.VllmConfig(model, cache, device_config=device)
        self.config.attention_config.use_aiter_asm_decode = True  # off by default
        kw = dict(cache_config=cache, quant_config=Fp8Config())
        kw |= dict(attn_backend=AttentionBackendEnum.ROCM_ATTN.get_class())
        with cfg.set_current_vllm_config(self.config):
            self.layers = torch.nn.ModuleList(
                Attention(heads, HEAD, HEAD**-0.5, kvh, **kw, prefix=f"layers.{i}")
                for i in range(len(scales))
            )
        record_metadata_for_reloading(self)
        self.load_weights(kv_scales(*scales))
        process_weights_after_loading(self, model, device.device)
        self.attn, names = self.layers[0], [x.layer_name for x in self.layers]
        spec = self.attn.get_kv_cache_spec(self.config)  # the builder first, as in vLLM
        self.args = (spec, names, self.config, device.device)  # the builder's
        self.builder = self.attn.attn_backend.get_builder_cls()(*self.args)
        shape = (2, blocks, BLOCK, kvh * HEAD)  # 8.6 GB for pages 4 GiB apart
        codes = torch.randint(1, 65, shape, dtype=torch.uint8, device=DEVICE)  # <= 2.0
        codes[..., 1::2] |= 128  # half negative; never 0x80 (fnuz's NaN); in place
        for layer in self.to(DEVICE).layers:
            layer.kv_cache = codes.transpose(0, 1)  # vLLM's [blocks, 2, ...] view

    def load_weights(self, weights):  # as a model's: each through its loader
        for name, tensor in weights:
            self.get_parameter(name).weight_loader(self.get_parameter(name), tensor)

    def reload(self, *scales):  # new K and V scales through vLLM's in-place reload
        reload_weights(self.config, self, kv_scales(*scales), None, True)

    def run(self, query, meta, out=None, scale=None, layer=0):  # NaN: torch.empty's
        out = torch.full_like(query, torch.nan) if out is None else out
        kv, layer = query[:, : self.attn.num_kv_heads], self.layers[layer]  # kv: unread
        layer.impl.forward(layer, query, kv, kv, layer.kv_cache, meta, out, scale)
        return out


def common(seq_lens, pages, query_lens=None, on=DEVICE):  # one query token a request
    n, query_lens = len(seq_lens), query_lens or [1] * len(seq_lens)
    start = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    lens, width = torch.tensor(seq_lens, dtype=torch.int32), max(map(len, pages)) + 1
    table = torch.tensor([p + [0] * (width - len(p)) for p in pages], dtype=torch.int32)
    # On the device, copies: a capture zeroes query_start_loc and fills seq_lens with 1.
    gpu = dict(query_start_loc=start, block_table_tensor=table)
    gpu |= dict(slot_mapping=torch.full((sum(query_lens),), -1))  # no KV written
    gpu = {name: x.to(on, copy=True) for name, x in gpu.items()}  # "meta": none read
    gpu |= dict(block_table_tensor=gpu["block_table_tensor"][:, :-1])  # a column slice
    gpu |= dict(seq_lens=lens.to(DEVICE, copy=True))  # an asm step's build() clamps it
    host = dict(query_start_loc_cpu=start, seq_lens_cpu_upper_bound=lens, num_reqs=n)
    host |= dict(num_actual_tokens=sum(query_lens), max_query_len=max(query_lens))
    return CommonAttentionMetadata(**gpu, **host, max_seq_len=max(seq_lens))


@requires_asm
@pytest.mark.parametrize("gqa", range(1, 9))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_every_admitted_gqa_ratio(tmp_path, gqa, dtype):
    """A captured step above the cut with PAD rows of FULL-graph padding, replayed after
    reloads of K/V scales 0.5/2 (a swap is off 4x, a loss 2x), V's alone, then both."""
    import aiter

    heads, n = 8 * gqa, 2 * current_platform.num_compute_units() // (8 * gqa) + 1
    seq_lens = [CONTEXTS[i % len(CONTEXTS)] for i in range(n)] + [0] * PAD
    pages = [cdiv(s, BLOCK) for s in seq_lens]
    free = (torch.randperm(sum(pages)) + 1).tolist()
    model = Model(tmp_path, heads, 8, len(free) + 1, dtype)
    step = common(seq_lens, [[free.pop() for _ in range(p)] for p in pages])
    query = torch.randn(n + PAD, heads + 16, HEAD).to(DEVICE, dtype)[:, :heads]  # view
    metadata = model.builder.build_for_cudagraph_capture(step)
    step.seq_lens.copy_(step.seq_lens_cpu_upper_bound)  # as vLLM's runner does
    step.query_start_loc.copy_(step.query_start_loc_cpu)
    out, graph = torch.zeros_like(query), torch.cuda.CUDAGraph()  # padding rows: 0
    with mock.patch.object(aiter, "pa_fwd_asm", wraps=aiter.pa_fwd_asm) as pa:
        model.run(query, metadata, out)  # warm up
        with torch.cuda.graph(graph):
            model.run(query, metadata, out)
    assert [call.kwargs["high_precision"] for call in pa.call_args_list] == [2, 2]
    for k, v in ((0.5, 2.0), (0.5, 0.5), (0.25, 4.0)):
        model.reload((k, v))
        torch.cuda.set_sync_debug_mode("error")  # build() reads host integers alone
        eager = replace(model.builder.build(0, step), use_asm_decode=False)  # refills
        torch.cuda.set_sync_debug_mode(0)
        with mock.patch.object(rocm_aiter_ops, "pa_fwd_asm", side_effect=RuntimeError):
            hip = model.run(query, eager)[:-PAD].float()  # the reference: HIP's
        out[:-PAD] = torch.nan  # rows the kernel leaves unwritten stay NaN
        graph.replay()  # padding rows: left as they were, or written finite
        torch.testing.assert_close(out[:-PAD].float(), hip, atol=ASM_MAX * v, rtol=0)
        assert (out[:-PAD] - hip).abs().mean() <= ASM_MEAN * v
        assert out[-PAD:].isfinite().all()  # a dynamic quant after attention reads them


@requires_asm
def test_pages_over_4_gib_apart_read_as_adjacent_ones(tmp_path):
    """AITER's own test (test_pa_block_id_truncation.py) reads one page a sequence."""
    model = Model(tmp_path, 64, 8, 2**32 // (8 * HEAD * BLOCK) + 2, torch.bfloat16)
    end = model.attn.kv_cache.shape[0] - 1
    far, near = [p for i in range(16) for p in (1 + i, end - i)], list(range(17, 49))
    for plane in model.attn.kv_cache.unbind(1):  # the same content on adjacent pages
        plane[near] = plane[far]
    n = 2 * (current_platform.num_compute_units() // 64 + 1)  # above the cut
    query = torch.randn(1, 64, HEAD).to(DEVICE, torch.bfloat16).expand(n, -1, -1)
    metadata = model.builder.build(0, common([512] * n, [far, near] * (n // 2)))
    out = model.run(query.contiguous(), metadata)
    assert metadata.use_asm_decode and torch.equal(out[0], out[1])


@pytest.mark.parametrize(("parted", "no_full"), [("K", "PIECEWISE"), ("V", "NONE")])
def test_the_builders_decisions(tmp_path, gfx942, parted, no_full):
    """asm for one token a request above 2 x CUs query heads, read on the host from host
    integers alone; padding rows: length 1. A reload parting a K or V table's layers
    raises under FULL graphs, else they run HIP (no_full: graphs of HIP steps alone)."""
    model = Model(tmp_path, 16, 8, 3, torch.bfloat16, scales=[(0.5, 0.5)] * 2)  # GQA 2
    n = 2 * current_platform.num_compute_units() // 16  # requests at the cut
    for lens in ([1] * n, [1] * n + [0, 2], [1] * (n + 1) + [0], [1] * (n + 1)):
        step = common([16] * len(lens), [[1, 2]] * len(lens), lens, on="meta")
        with NoSync():
            metadata = model.builder.build(0, step)
        assert metadata.use_asm_decode is (lens == [1] * (n + 1))
    pad = common([16] * (n + 1) + [0], [[1]] * (n + 2), on="meta")  # a padding row
    captured = model.builder.build_for_cudagraph_capture(step)  # what graphs hold
    with NoSync():
        lens = model.builder.build(0, pad).seq_lens  # refilled in place, floored at 1
    assert lens.data_ptr() == captured.seq_lens.data_ptr()
    assert lens.tolist() == [16] * (n + 1) + [1]  # 0 may come out as NaN
    model.reload((0.25, 0.5), (0.25, 0.5))  # both K move: the K table is refilled
    model.builder.build(0, step)
    written = captured.asm_scales[model.layers[0]]["KV".index(parted)]._version
    kv = ((0.25, 4.0), (0.5, 4.0)) if parted == "K" else ((4.0, 0.5), (4.0, 2.0))
    model.reload(*kv)  # layers.1 parts the table: HIP; their other table moves
    graphs = model.config.compilation_config  # their FULL graphs may hold asm
    for mode in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "FULL"):  # FULL: MRV2 drafts
        graphs.cudagraph_mode = cfg.CUDAGraphMode[mode]
        with pytest.raises(RuntimeError, match=r"layers\.1 left .* restart with"):
            model.builder.build(0, step)
    graphs.cudagraph_mode = cfg.CUDAGraphMode[no_full]
    with mock.patch.object(rocm_attn.logger, "error") as error:  # one line
        metadata = model.builder.build(0, step)
    [(layer, (k, v))] = metadata.asm_scales.items()
    held = captured.asm_scales[layer]  # what graphs hold, the moved table refilled
    assert layer is model.layers[0] and k is held[0] and v is held[1]
    assert (k == layer._k_scale).all() and (v == layer._v_scale).all()
    assert error.call_count == 1 and "layers.1 left" in str(error.call_args)
    assert held["KV".index(parted)]._version == written  # the parted table: unwritten
    hip = mock.patch.object(rocm_attn, "chunked_prefill_paged_decode")
    with hip as stock, mock.patch.object(rocm_aiter_ops, "pa_fwd_asm") as pa:
        model.run(torch.zeros(n + 1, 16, HEAD, device=DEVICE), metadata, layer=1)
    assert metadata.use_asm_decode and stock.called and not pa.called  # HIP, no crash


def test_what_keeps_every_layer_on_hip(tmp_path, gfx942):
    """No table, so HIP whatever the step: switch off, AITER's MHA off, not gfx942/950,
    AITER before 0.1.17 or of no version, max_num_seqs x heads at the cut, a derived
    builder, more than 4 tables. An output quant fused in: HIP; else asm, the
    ultra-precision kernel on the layer's K and V tables."""
    model = Model(tmp_path, 16, 8, 3, torch.bfloat16)
    n, builder = 2 * current_platform.num_compute_units() // 16 + 1, type(model.builder)
    step = common([16] * n, [[1]] * n, on="meta")  # above the cut
    gates = [mock.patch.object(model.config, "attention_config", cfg.AttentionConfig())]
    gates += [mock.patch.object(rocm_aiter_ops, "is_mha_enabled", lambda: None)]
    gates += [mock.patch("vllm.platforms.rocm.on_mi3xx", lambda: False)]  # gfx90a, ...
    gates += [mock.patch.dict(AITER, {"amd-aiter": v}) for v in ("0.1.16.post6", "dev")]
    gates += [mock.patch.object(model.config.scheduler_config, "max_num_seqs", n - 1)]
    for gate in gates:
        with gate:
            assert not builder(*model.args).build(0, step).asm_scales
    derived = type("Derived", (builder,), {})  # a backend built on ROCM_ATTN's
    assert not derived(*model.args).build(0, step).asm_scales
    for layers in (3, 4):  # 3 K tables and a V, each layer's own; 4 and a V: none
        scales = [(2.0**i, 3.0) for i in range(layers)]  # rising: a misfiled one shows
        many = Model(tmp_path, 16, 8, 3, torch.bfloat16, scales)
        bound = many.builder.build(0, step).asm_scales.items()  # the budget: 4 tables
        held = {x: (k.unique().item(), v.unique().item()) for x, (k, v) in bound}
        own = {x: (x._k_scale_float, x._v_scale_float) for x in many.layers}
        assert held == (own if layers == 3 else {})
    metadata = model.builder.build(0, step)
    hip = mock.patch.object(rocm_attn, "chunked_prefill_paged_decode")
    query, quant = torch.zeros(n, 16, HEAD, device=DEVICE), torch.ones(())  # fused in
    with hip as stock, mock.patch.object(rocm_aiter_ops, "pa_fwd_asm") as pa:
        model.run(query, metadata, scale=quant)
        model.run(query, replace(metadata, use_asm_decode=False))  # below the cut
    assert metadata.use_asm_decode and stock.call_count == 2 and not pa.called
    with mock.patch.object(rocm_aiter_ops, "pa_fwd_asm") as pa:  # no quant: asm
        model.run(query, metadata)
    kw, (k, v) = pa.call_args.kwargs, metadata.asm_scales[model.attn]  # the layer's
    assert kw["K_QScale"] is k and kw["V_QScale"] is v and kw["high_precision"] == 2
    assert k.shape == v.shape == (3, 8, BLOCK)  # [blocks, KV heads, 16]: none short
    planes = [x.data_ptr() for x in model.attn.kv_cache.unbind(1)]  # read in place
    assert [kw["K"].data_ptr(), kw["V"].data_ptr()] == planes
    assert kw["V"].shape == (3, 8, 1, HEAD, BLOCK)  # AITER's [B, H, 1, D, 16]
    assert kw["context_lens"] is metadata.seq_lens and kw["block_tables_stride0"] == 2


def rule(path, head=HEAD, block=BLOCK, lbhnc=False, mi3xx=True, model=None, n=4, **kw):
    kw = dict(num_heads=40, num_kv_heads=8, scale=HEAD**-0.5, kv_cache_dtype="fp8") | kw
    kw = dict(alibi_slopes=None, sliding_window=None) | kw
    impl = rocm_attn.RocmAttentionImpl(head_size=head, **kw)
    shape = (2, n, block, impl.num_kv_heads * head)
    pages = torch.empty(shape, dtype=torch.uint8, device="meta")
    kv_cache = pages.view(n, 2, block, -1) if lbhnc else pages.transpose(0, 1)
    model = llama(path, **dict(max_model_len=4096) | (model or {}))
    return asm_decode_rejections(impl, kv_cache, model, mi3xx)


def test_the_rule(tmp_path):
    """The edge of every clause admitted; one past it, 14 distinct reasons."""
    edge = dict(
        num_heads=64, kv_cache_dtype="fp8_e4m3", n=2**22 - 1, scale=1 / 128**0.5
    )
    edge |= dict(model=dict(dtype=torch.float16, max_model_len=40960))  # tables < 2 GiB
    assert rule(tmp_path, **edge) == []
    wrong = dict(mi3xx=False, kv_cache_dtype="fp8_e5m2", block=32, head=256, n=2**22)
    wrong |= dict(scale=1.001 / 256**0.5, sliding_window=64, lbhnc=True, num_heads=72)
    wrong |= dict(alibi_slopes=[0.5] * 72, logits_soft_cap=30.0, sinks=torch.zeros(72))
    wrong |= dict(model=dict(dtype=torch.float32, max_model_len=40961))
    assert len(set(rule(tmp_path, **wrong))) == 14
    assert rule(tmp_path, attn_type="encoder_only") == ["not decoder self-attention"]
