"""Per-slot scale tables: one per distinct scale (in-tree before stage 3, and wherever
tables are allocated there), or one per layer where the scales come from the checkpoint
(the plugin; in-tree from stage 3 where tables are aliased); refilled in place when a
weight reload changes them, in every form. Reloads go through vLLM's own reload path."""

from __future__ import annotations

import weakref

import pytest
import torch

import harness

#: Where layers with checkpoint scales own their tables: the plugin, in-tree from stage 3.
OWNS_TABLES = harness.STAGE is None or harness.STAGE >= 3
owns_tables = pytest.mark.skipif(not OWNS_TABLES, reason="tables shared by value in stage 1")


#: Stage 3 in vLLM gives layers tables of their own only where tables are aliased (GPU
#: virtual memory); allocated ones stay shared by value, as vLLM's were.
IN_TREE_OWNS_ONLY_ALIASED = harness.IN_TREE and (harness.STAGE or 0) >= 3


@pytest.fixture(autouse=True)
def aliased_stand_in(request):
    """In-tree from stage 3, on the CPU: the module's own hipMem* path on the HIP stand-in
    aliases the tables, so that ownership and the refill run (the tests named
    ``..._allocated_...`` see the CPU as it is)."""
    if IN_TREE_OWNS_ONLY_ALIASED and "allocated" not in request.node.name:
        request.getfixturevalue("hip_vm")


def bind(model):
    batch = harness.make_batch(model, [20] * 16)
    model.builder.build(0, batch.common)
    return [harness.scale_tables(model.builder, name) for name in model.names]


#: Stage 1 caps its tables at four a builder (stage 3 counts them in the budget).
STAGE_1_CAP = harness.IN_TREE and (harness.STAGE or 0) < 3


def test_equal_scales_share_one_k_and_one_v_allocation(tmp_path):
    """K's tables apart from V's, even at one scale: a reload may part them."""
    model = harness.build_model(tmp_path, num_layers=4, num_blocks=48, scales=[(0.75, 0.75)] * 4)
    bindings = bind(model)
    ptrs = {t.data_ptr() for b in bindings for t in b}
    assert len(ptrs) == 2
    assert len({b[0].data_ptr() for b in bindings}) == len({b[1].data_ptr() for b in bindings}) == 1
    table = bindings[0][0]
    assert table.dtype == torch.float32 and table.is_contiguous()
    assert tuple(table.shape) == (model.layers[model.names[0]].kv_cache.shape[0], 8, 16)
    assert torch.all(table == 0.75)


def test_different_scales_get_their_own_tables(tmp_path):
    scales = [(0.5, 0.25), (0.5, 0.25), (2.0, 0.25)]
    model = harness.build_model(tmp_path, num_layers=3, num_blocks=48, scales=scales)
    bindings = bind(model)
    for (k_table, v_table), (k, v) in zip(bindings, scales, strict=True):
        assert torch.all(k_table == k) and torch.all(v_table == v)
    assert bindings[0][0].data_ptr() == bindings[1][0].data_ptr()
    assert bindings[0][0].data_ptr() != bindings[2][0].data_ptr()
    assert bindings[0][1].data_ptr() == bindings[2][1].data_ptr()


def test_qwen3_14b_shape_costs_at_most_a_tenth_of_a_percent_of_the_kv_cache(tmp_path):
    """Qwen3-14B: 40 layers, 40 query / 8 KV heads of 128; scales fixed (not from a
    checkpoint), K and V different: two allocated tables in all."""
    model = harness.build_model(
        tmp_path,
        num_layers=40,
        num_heads=40,
        num_kv_heads=8,
        num_blocks=64,
        scales=[(1.0, 0.5)] * 40,
    )
    bindings = bind(model)
    tables = {t.data_ptr(): t for b in bindings for t in b}
    table_bytes = sum(t.numel() * t.element_size() for t in tables.values())
    kv_bytes = sum(
        layer.kv_cache.numel() * layer.kv_cache.element_size() for layer in model.layers.values()
    )
    share = table_bytes / kv_bytes
    assert len(tables) == 2
    assert share <= 0.001, share


def checkpoint_model(tmp_path, scales, num_layers=None):
    model = harness.build_model(tmp_path, num_layers=num_layers or len(scales), num_blocks=64)
    for layer, (k, v) in zip(model.layers.values(), scales, strict=True):
        harness.load_checkpoint_scales(layer, k, v)  # as a quantized checkpoint loads them
    return model


def fp8_checkpoint(tmp_path, scales):
    """Layers of an fp8 checkpoint whose KV scales vLLM's loader loaded (and reloads)."""
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    model = harness.build_model(
        tmp_path,
        num_layers=len(scales),
        num_blocks=64,
        layer_kwargs=[{"quant_config": Fp8Config()}] * len(scales),
    )
    checkpoint = harness.ScaleCheckpoint(model)
    checkpoint.load(scales)
    return model, checkpoint


def test_a_weight_reload_refills_the_tables_the_captured_step_reads(tmp_path, kernels):
    """After vLLM's weight reload (no eager forward in between), the next build() refills,
    in place, the very tensors the earlier step handed the kernel as K_QScale/V_QScale
    (what a captured CUDA graph holds); the next asm decode matches fp32 at the new
    scales, and the other layer's tables are left as they were."""
    model, checkpoint = fp8_checkpoint(tmp_path, [(0.5, 0.25), (1.0, 0.75)])
    first, second = model.names
    batch = harness.make_batch(model, [40] * 16)
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    harness.run_layer(model, first, batch, metadata)
    captured = harness.asm_calls()[-1]
    k_table, v_table = captured["K_QScale"], captured["V_QScale"]
    old_second = harness.scale_tables(model.builder, second)
    checkpoint.reload([(2.0, 1.0), (1.0, 0.75)])
    layer = model.layers[first]
    batch = harness.make_batch(model, [40] * 16, seed=1)
    harness.fill_context(model, batch)  # the cache holds tokens at the new scales
    metadata = model.builder.build(0, batch.common)
    assert metadata.use_asm_decode
    assert torch.all(k_table == layer._k_scale_float) and torch.all(v_table == layer._v_scale_float)
    out = harness.run_layer(model, first, batch, metadata)
    call = harness.asm_calls()[-1]
    assert call["K_QScale"].data_ptr() == k_table.data_ptr()
    torch.testing.assert_close(
        out.float(), harness.reference(model, batch, layer), atol=2e-2, rtol=0
    )
    now_second = harness.scale_tables(model.builder, second)
    assert [t.data_ptr() for t in now_second] == [t.data_ptr() for t in old_second]
    assert torch.all(old_second[0] == model.layers[second]._k_scale_float)


def assert_every_layer_decodes_on_asm_at_its_scales(model, plugin_log, seed: int) -> None:
    """The next step after a reload: every layer on asm, each matching fp32 at its
    layer's scales now, and no line about tables left behind."""
    batch = harness.make_batch(model, [40] * 16, seed=seed)
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    for name, layer in model.layers.items():
        out = harness.run_layer(model, name, batch, metadata)
        torch.testing.assert_close(
            out.float(), harness.reference(model, batch, layer), atol=2e-2, rtol=0
        )
    assert len(harness.asm_calls()) == len(model.layers)
    assert not any("left their shared asm scale tables" in m for m in plugin_log)


def test_a_reload_moving_every_layer_to_one_scale_is_followed(tmp_path, kernels, plugin_log):
    """Layers of one scale (in stage 1, one shared K and one V table), all moved by vLLM's
    reload to one new scale: their tables are refilled, every layer decodes on asm and
    matches fp32 at the new scales, and no error is logged."""
    model, checkpoint = fp8_checkpoint(tmp_path, [(0.5, 0.25)] * 3)
    model.builder.build(0, harness.make_batch(model, [40] * 16).common)
    checkpoint.reload([(1.5, 0.75)] * 3)
    assert_every_layer_decodes_on_asm_at_its_scales(model, plugin_log, seed=2)


@pytest.mark.parametrize("moved", [(1.5, 0.25), (0.5, 0.75)], ids=["only-k-moves", "only-v-moves"])
def test_a_reload_of_one_side_alone_is_followed(tmp_path, kernels, plugin_log, moved):
    """A reload that changes the K scale alone, or the V scale alone (every layer the
    same way): the next build() refills that side's tables, every layer decodes on asm
    and matches fp32 at the new scales, nothing is logged as diverging."""
    model, checkpoint = fp8_checkpoint(tmp_path, [(0.5, 0.25)] * 2)
    model.builder.build(0, harness.make_batch(model, [40] * 16).common)
    checkpoint.reload([moved] * 2)
    batch = harness.make_batch(model, [40] * 16, seed=4)
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    assert metadata.use_asm_decode
    for name, layer in model.layers.items():
        out = harness.run_layer(model, name, batch, metadata)
        torch.testing.assert_close(
            out.float(), harness.reference(model, batch, layer), atol=2e-2, rtol=0
        )
    assert len(harness.asm_calls()) == 2
    assert not any("left their shared asm scale tables" in m for m in plugin_log)


@pytest.mark.skipif(not harness.IN_TREE, reason="the plugin gives such layers their own tables")
@pytest.mark.parametrize("mode", ["NONE", "PIECEWISE"])
def test_a_diverging_reload_of_allocated_shared_tables_sends_those_layers_to_hip(
    tmp_path, kernels, plugin_log, monkeypatch, mode
):
    """Stage 1 shares tables by value (so does stage 3 where tables are allocated): one
    layer reloaded to another scale than the others of its table cannot be right in a
    FULL graph of asm; where no graph holds attention (eager steps, piecewise graphs) it
    falls back. The table keeps its scale, right for the layers that kept theirs
    (here the first, and the third whose V scale is the others' K scale): they keep asm.
    One error line names the moved layer; its eager steps run HIP. The step after
    neither refills nor says it again."""
    from vllm.config import CUDAGraphMode

    from op_audit import OpRecorder

    stock = harness.spy_stock_path(monkeypatch)
    model, checkpoint = fp8_checkpoint(tmp_path, [(0.5, 0.25)] * 2 + [(1.0, 0.5)])
    model.vllm_config.compilation_config.cudagraph_mode = CUDAGraphMode[mode]
    model.builder.build(0, harness.make_batch(model, [40] * 16).common)
    checkpoint.reload([(0.5, 0.25), (2.0, 0.25), (1.0, 0.5)])
    batch = harness.make_batch(model, [40] * 16, seed=3)
    metadata = model.builder.build(0, batch.common)
    with OpRecorder() as ops:  # the step after: the reload is followed once
        model.builder.build(0, batch.common)
    assert not any("fill" in str(op) for op in ops.ops)
    ((level, line),) = [
        (level, m)
        for m, level in zip(plugin_log, plugin_log.levels, strict=True)
        if "left their shared asm scale tables" in m
    ]
    assert level == "ERROR"
    first, second, third = model.names
    assert f"KV scales of {second} left" in line
    assert line.endswith("they use the HIP decode until a restart")
    assert harness.asm_layers(model.builder) == {first, third}
    harness.fill_context(model, batch)
    for name in model.names:
        out = harness.run_layer(model, name, batch, metadata)
        if name != second:  # the stock kernel is only recorded here
            reference = harness.reference(model, batch, model.layers[name])
            torch.testing.assert_close(out.float(), reference, atol=2e-2, rtol=0)
    assert len(harness.asm_calls()) == 2 and harness.stock_layers(stock, model) == [second]


@pytest.mark.skipif(not harness.IN_TREE, reason="the plugin gives such layers their own tables")
@pytest.mark.parametrize(
    ("mode", "capture"),
    [("FULL_AND_PIECEWISE", True), ("FULL", False)],
    ids=["decode-graphs-captured", "full-graphs-from-plain-build"],
)
def test_a_diverging_reload_of_allocated_shared_tables_stops_vllm_where_graphs_hold_them(
    tmp_path, kernels, plugin_log, mode, capture
):
    """Where FULL graphs are on, a graph may hold asm and the shared table: the target
    model's decode graphs (build_for_cudagraph_capture() of a step above the cut), and
    (review 34) Model Runner V2's drafters, whose FULL graphs are captured around a plain
    build(). No fallback can make the moved layer right there, so the next build()
    raises, naming it and the remedy, before any table is refilled (here the V table
    both layers moved to 1.0 together)."""
    from vllm.config import CUDAGraphMode

    model, checkpoint = fp8_checkpoint(tmp_path, [(0.5, 0.25)] * 2)
    model.vllm_config.compilation_config.cudagraph_mode = CUDAGraphMode[mode]
    step = harness.make_batch(model, [40] * 16).common  # 16 x 40 query heads: above the cut
    bind = model.builder.build_for_cudagraph_capture if capture else model.builder.build
    assert (bind(step) if capture else bind(0, step)).use_asm_decode
    v_table = harness.scale_tables(model.builder, model.names[0])[1]
    v_before = v_table.clone()
    checkpoint.reload([(0.5, 1.0), (2.0, 1.0)])
    batch = harness.make_batch(model, [40] * 16)
    with pytest.raises(RuntimeError, match=f"KV scales of {model.names[1]} left") as raised:
        model.builder.build(0, batch.common)
    assert str(raised.value).endswith(
        " (under FULL graphs); restart with -ac.use_aiter_asm_decode=false or "
        "-cc.cudagraph_mode=PIECEWISE"
    )
    assert torch.equal(v_table, v_before)  # not refilled: nothing changed before the raise


def test_k_and_v_at_one_scale_reloaded_apart_under_full_graphs(tmp_path, kernels, plugin_log):
    """Every layer at K = V = 1.0 (an fp8 checkpoint without KV scales, or --kv-cache-dtype
    fp8), then reloaded to calibrated scales, K and V different, under FULL graphs: every
    table is refilled in place (none is shared by K and V), nothing raises, every layer
    decodes on asm at the new scales."""
    from vllm.config import CUDAGraphMode

    model, checkpoint = fp8_checkpoint(tmp_path, [(1.0, 1.0)] * 2)
    model.vllm_config.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    model.builder.build(0, harness.make_batch(model, [40] * 16).common)
    checkpoint.reload([(0.5, 0.25)] * 2)
    assert_every_layer_decodes_on_asm_at_its_scales(model, plugin_log, seed=4)


@pytest.mark.skipif(not STAGE_1_CAP, reason="the cap is stage 1's (tables outside the budget)")
@pytest.mark.parametrize("tables", [4, 5])
def test_four_scale_tables_bind_and_five_keep_every_layer_on_hip(
    tmp_path, kernels, plugin_log, tables
):
    """At most four tables a builder, all or none: three layers whose K and V scales
    would need five keep HIP, and no table is made; two layers' four bind."""
    scales = [(0.5, 0.25), (1.0, 2.0), (3.0, 0.25)][: tables - 2]
    model = harness.build_model(tmp_path, num_layers=len(scales), num_blocks=48, scales=scales)
    model.builder.build(0, harness.make_batch(model, [20] * 16).common)
    assert len(harness.asm_layers(model.builder)) == (2 if tables == 4 else 0)
    why = "decodes 0 of 3 layers (5 tables > 4)" if tables == 5 else "decodes 2 of 2 layers"
    assert (
        sum(why in m for m in plugin_log) == 1 and sum("pa_fwd_asm" in m for m in plugin_log) == 1
    )


def test_no_reload_no_refill_and_the_check_reads_nothing_on_the_device(tmp_path, monkeypatch):
    from op_audit import OpRecorder

    monkeypatch.setenv("ASM_DECODE_TEST_NOOP_KERNELS", "1")
    model = checkpoint_model(tmp_path, [(0.5, 0.25)] * 4)
    batch = harness.make_batch(model, [40] * 16, contexts=False)
    model.builder.build(0, batch.common)
    with OpRecorder() as ops:
        model.builder.build(0, batch.common)
    assert ops.ops == [] or (ops.host_reads == [] and ops.allocations == []), ops.ops
    assert not any("fill" in str(op) for op in ops.ops)


def test_a_builder_releases_its_tables(tmp_path):
    """vLLM drops the builders of its CUDA-graph profiling pass: their tables go with
    them instead of outliving the pass."""
    model = checkpoint_model(tmp_path, [(0.5, 0.25)] * 2)
    bindings = bind(model)
    gone = weakref.ref(bindings[0][0].untyped_storage())
    del bindings
    model.builder = None  # no reference cycle holds them: freed at once, no gc pass
    assert gone() is None


@pytest.mark.skipif(not IN_TREE_OWNS_ONLY_ALIASED, reason="vLLM from stage 3")
def test_in_vllm_allocated_tables_stay_shared_by_value(tmp_path):
    """Where tables cannot be aliased (here: the CPU), stage 3 keeps vLLM's sharing:
    layers of equal checkpoint scales share one K and one V table, no layer owns one."""
    model = checkpoint_model(tmp_path, [(0.5, 0.25)] * 3)
    bindings = bind(model)
    assert len({t.data_ptr() for b in bindings for t in b}) == 2
    tables = model.builder._asm_tables
    assert tables.owners == [] and tables.aliased is False


def test_the_driver_library_is_the_loaded_copy_named_as_it_is(tmp_path):
    """The copy torch loaded, matched on its file name: a library whose name only
    starts like it (libcudart for libcuda) or a folder named like it is not it."""
    from vllm_rocm_asm_decode.asm_scale_tables import _loaded_library

    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 0 08:01 1 /opt/libcuda/lib/libcudart.so.13\n"
        "7f01-7f02 r-xp 0 08:01 2 /usr/lib/libcuda.so.580.159.04\n"
        "7f02-7f03 rw-p 0 00:00 0 [heap]\n"
        "7f03-7f04 r-xp 0 08:01 3 /opt/rocm/lib/libamdhip64-2f1e.so.6\n"
    )
    assert _loaded_library("libcuda", str(maps)) == "/usr/lib/libcuda.so.580.159.04"
    assert _loaded_library("libamdhip64", str(maps)) == "/opt/rocm/lib/libamdhip64-2f1e.so.6"
    assert _loaded_library("libnvrtc", str(maps)) is None
    assert _loaded_library("libcuda", str(tmp_path / "absent")) is None
