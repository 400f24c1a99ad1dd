"""What the plugin takes from the installed AITER only as far as it proves it: the version
(block ids >= 65536), the kernel files, free memory for the scale tables, and the arch.
These are the plugin's guards: none of them goes in-tree (vLLM pins its AITER)."""

from __future__ import annotations

import shutil
import types
from pathlib import Path

import pytest
import torch

import harness
from conftest import ARCH
from rocm_emulation import COMPUTE_UNITS, KERNEL_STANDIN
from vllm_rocm_asm_decode import scale_tables
from vllm_rocm_asm_decode.kernel import current_arch, load_asm_kernel

pytestmark = harness.plugin_only

CUT = 2 * COMPUTE_UNITS[ARCH]
#: One layer, 8 query heads over 1 KV head (GQA 8): 4 KiB per K or V page, so a pool past
#: 65536 blocks costs ~0.6 GB, most of it never touched.
LARGE_POOL = 70000
HEADS, KV_HEADS = 8, 1


def large_pool_model(tmp_path, num_blocks=LARGE_POOL):
    return harness.build_model(
        tmp_path, num_layers=1, num_heads=HEADS, num_kv_heads=KV_HEADS, num_blocks=num_blocks
    )


def decode_batch(model, seed=0):
    """A batch just above the cut, whose block table holds ids on both sides of 65536."""
    n = CUT // HEADS + 1
    batch = harness.make_batch(model, [40, 70, 17] * (n // 3) + [33] * (n % 3), seed=seed)
    harness.fill_context(model, batch)
    return batch


# --------------------------------------------------------------------------------------
# AITER version: block ids >= 65536


@pytest.mark.parametrize(
    ("version", "num_blocks", "asm"),
    [
        ("0.1.16.post5", LARGE_POOL, False),
        pytest.param(None, LARGE_POOL, False, marks=pytest.mark.slow),  # old-large's path
        ("0.1.20", LARGE_POOL, True),
        ("0.1.16.post5", 4096, True),
        (None, 4096, True),
    ],
    ids=["old-large", "unknown-large", "fixed-large", "old-small", "unknown-small"],
)
def test_version_clause_keeps_large_pools_off_unfixed_aiter(
    tmp_path, kernels, plugin_log, aiter_version, version, num_blocks, asm
):
    aiter_version(version)
    model = large_pool_model(tmp_path, num_blocks)
    batch = decode_batch(model)
    layer = model.layers[model.names[0]]
    metadata = model.builder.build(0, batch.common)
    assert metadata.use_asm_decode is asm
    out = harness.run_layer(model, model.names[0], batch, metadata)
    assert (len(harness.asm_calls()), kernels.hip_decode) == ((1, 0) if asm else (0, 1))
    torch.testing.assert_close(
        out.float(), harness.reference(model, batch, layer), atol=2e-2, rtol=0
    )
    if not asm:
        named = f"AITER {version}" if version else "AITER of unknown version"
        assert layer.impl.asm_rejections == [
            f"{named} {'misreads' if version else 'may misread'} KV blocks >= 65536 "
            f"(fixed in 0.1.17); this cache has {model.num_blocks} blocks"
        ]
        # The way out (the plugin's trust switch, after doctor's probe) is the plugin's.
        hint = any("VLLM_ROCM_ASM_DECODE_TRUST_AITER=1" in m and "doctor" in m for m in plugin_log)
        assert hint is not harness.IN_TREE


@harness.plugin_only
def test_the_clause_guards_a_real_misread(tmp_path, kernels, aiter_version, monkeypatch):
    """With the clause overridden, the stand-in 0.1.16.post5 kernel (which reads block id b
    as b & 0xFFFF, as AITER did) answers wrong for sequences with blocks >= 65536, and a
    0.1.20 kernel answers right: what the trust switch is for, and why it defaults off."""
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", "1")
    model = large_pool_model(tmp_path)
    batch = decode_batch(model)
    layer = model.layers[model.names[0]]
    high = [bool((row >= 65536).any()) for row in batch.block_table]
    assert any(high) and not all(high)
    ref = harness.reference(model, batch, layer)
    errors = {}
    for version in ("0.1.16.post5", "0.1.20"):
        aiter_version(version)
        model.builder.asm_layers_bound = False  # decide again with this AITER
        metadata = model.builder.build(0, batch.common)
        assert metadata.use_asm_decode
        out = harness.run_layer(model, model.names[0], batch, metadata)
        errors[version] = (out.float() - ref).abs().amax(dim=(1, 2))
    wrong = errors["0.1.16.post5"] > 0.1
    assert wrong.tolist() == high
    assert float(errors["0.1.20"].max()) < 2e-2


# --------------------------------------------------------------------------------------
# Kernel files


def test_a_table_row_without_its_kernel_file_keeps_hip_and_names_the_file(
    tmp_path, kernels, plugin_log, monkeypatch, aiter_version
):
    hsa = tmp_path / "hsa"
    shutil.copytree(KERNEL_STANDIN / "aiter" / "hsa", hsa)
    missing = hsa / ARCH / "pa" / "standin_bf16_fp8_gqa8_hp2.co"
    missing.unlink()
    monkeypatch.setenv("AITER_ASM_DIR", str(hsa))
    aiter_version(None)
    bf16 = harness.build_model(tmp_path / "bf16", num_layers=1)
    assert not bf16.builder.build(0, harness.make_batch(bf16, [40] * 20).common).use_asm_decode
    reason = f"kernel file {missing} not installed (listed in pa_asm.csv)"
    assert bf16.layers[bf16.names[0]].impl.asm_rejections == [reason]
    assert any(reason in m for m in plugin_log)
    # fp16 queries (trusted: see test_fp16_queries_wait_for_proof) take another row,
    # whose file is there.
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", "1")
    load_asm_kernel.cache_clear()
    fp16 = harness.build_model(tmp_path / "fp16", num_layers=1, dtype="float16")
    batch = harness.make_batch(fp16, [40] * 20, dtype=torch.float16)
    assert fp16.builder.build(0, batch.common).use_asm_decode


# --------------------------------------------------------------------------------------
# Scale tables: aliased where the device offers virtual memory, else allocated within a
# budget that never takes what vLLM counts on


@pytest.fixture
def device_memory(monkeypatch):
    """``torch.accelerator.get_memory_info`` and ``memory_reserved`` answering chosen
    figures for any device (the CPU has none); records every query."""
    queries: list[object] = []
    answer = {"free": 0, "total": 192 * 1024**3, "reserved": 0}

    def get_memory_info(device=None):
        queries.append(device)
        return answer["free"], answer["total"]

    monkeypatch.setattr(torch.accelerator, "get_memory_info", get_memory_info)
    monkeypatch.setattr(
        torch.accelerator, "memory_reserved", lambda device=None: answer["reserved"]
    )
    return answer, queries


def table_bytes(model) -> int:
    return model.num_blocks * model.num_kv_heads * model.block_size * 4


def calibrated(tmp_path, num_layers=4, **kw):
    """Layers with scales from the checkpoint, different per layer: a K and a V table
    each."""
    model = harness.build_model(tmp_path, num_layers=num_layers, num_blocks=64, **kw)
    for i, layer in enumerate(model.layers.values()):
        harness.load_checkpoint_scales(layer, 0.5 + i / 64, 0.25 + i / 64)
    return model


def bound(model) -> list[bool]:
    return [model.builder.binding(name) is not None for name in model.names]


def test_allocated_tables_that_do_not_fit_keep_hip_never_oom(
    tmp_path, kernels, plugin_log, device_memory
):
    """gpu_memory_utilization: the budget is the free memory less the part of vLLM's
    share this process has not used yet (its activation and CUDA-graph headroom)."""
    answer, queries = device_memory
    model = calibrated(tmp_path)
    one = table_bytes(model)
    util = model.vllm_config.cache_config.gpu_memory_utilization
    answer["reserved"] = int(util * answer["total"]) - 10 * one  # 10 tables of headroom
    # Free: that headroom, the margin and room for two layers' K and V tables.
    answer["free"] = 10 * one + scale_tables.MEMORY_MARGIN + 5 * one
    batch = harness.make_batch(model, [40] * 20)
    metadata = model.builder.build(0, batch.common)
    assert metadata.use_asm_decode and bound(model) == [True, True, False, False]
    budget = scale_tables.MEMORY_MARGIN + 5 * one  # what table_memory leaves
    rejected = model.layers[model.names[2]].impl.asm_rejections
    assert rejected == [
        "scale tables that do not fit in the device memory vLLM does not count on "
        f"({budget / 1024**2:.1f} MiB on cpu, 512.0 MiB kept spare)"
    ]
    assert any("layers with scale tables that do not fit" in m for m in plugin_log)
    kv = sum(layer.kv_cache.numel() for layer in model.layers.values())  # fp8: 1 byte
    line = [m for m in plugin_log if "scale table(s)" in m]
    assert line == [
        "ROCM_ATTN asm decode: 8 scale table(s) for 4 layer(s) (2 with tables of their own, "
        "refilled in place on a weight reload), allocated (no GPU virtual memory for cpu "
        f"tensors), {8 * one / 1024**2:.1f} MiB, "
        f"{100 * 8 * one / kv:.3f} % of their KV cache; {4 * one / 1024**2:.1f} MiB of them "
        "fit for 2 layer(s)"
    ]
    model.builder.build(0, batch.common)
    model.builder.build(0, harness.make_batch(model, [40] * 4).common)
    assert len(queries) == 1  # once at bind time, not per step
    harness.run_layer(model, model.names[2], batch, metadata)
    assert kernels.hip_decode == 1 and len(harness.asm_calls()) == 0


def test_memory_another_process_holds_is_never_taken(tmp_path, kernels, device_memory):
    """The same headroom, with another process on the GPU: free memory shrinks by what it
    holds; vLLM's headroom is still kept, so no table fits."""
    answer, _ = device_memory
    model = calibrated(tmp_path)
    one = table_bytes(model)
    util = model.vllm_config.cache_config.gpu_memory_utilization
    answer["reserved"] = int(util * answer["total"]) - 10 * one
    answer["free"] = 10 * one + scale_tables.MEMORY_MARGIN + 1  # the rest: the other's
    model.builder.build(0, harness.make_batch(model, [40] * 20).common)
    assert bound(model) == [False] * 4


def test_with_kv_cache_memory_bytes_the_free_memory_is_vllms(tmp_path, kernels, device_memory):
    """--kv-cache-memory-bytes: vLLM sizes nothing else and counts on all free memory
    for activations and CUDA graphs: allocated tables get none of it."""
    answer, _ = device_memory
    model = calibrated(tmp_path)
    model.vllm_config.cache_config.kv_cache_memory_bytes = 2**30
    model = harness.Model(**{**vars(model), "builder": rebuild(model)})
    # vLLM has reserved its whole share (the KV cache it sized): were the budget read as
    # with gpu_memory_utilization, no headroom would be left to keep and 100 GiB would fit.
    util = model.vllm_config.cache_config.gpu_memory_utilization
    answer["reserved"] = int(util * answer["total"])
    answer["free"] = 100 * 1024**3
    model.builder.build(0, harness.make_batch(model, [40] * 20).common)
    assert bound(model) == [False] * 4


def rebuild(model):
    return model.backend.get_builder_cls()(
        model.spec, model.names, model.vllm_config, torch.device("cpu")
    )


def test_equal_fixed_scales_need_one_k_and_one_v_table_whatever_the_layer_count(
    tmp_path, kernels, plugin_log, device_memory
):
    answer, _ = device_memory
    model = harness.build_model(tmp_path, num_layers=4, num_blocks=64, scales=[(0.5, 0.5)] * 4)
    util = model.vllm_config.cache_config.gpu_memory_utilization
    answer["reserved"] = int(util * answer["total"])
    answer["free"] = scale_tables.MEMORY_MARGIN + 2 * table_bytes(model)  # exactly two tables
    model.builder.build(0, harness.make_batch(model, [40] * 20).common)
    assert all(bound(model))
    assert any(
        "2 scale table(s) for 4 layer(s) (0 with tables of their own" in m for m in plugin_log
    )


def test_a_device_without_a_memory_figure_skips_the_budget(tmp_path, kernels):
    """On the CPU there is no memory figure: every eligible layer binds."""
    assert scale_tables.table_memory(torch.device("cpu"), 0.9) is None
    model = calibrated(tmp_path, num_layers=3)
    model.builder.build(0, harness.make_batch(model, [40] * 20).common)
    assert all(bound(model))


def test_aliased_tables_need_no_budget_and_say_so(
    tmp_path, kernels, plugin_log, monkeypatch, hip_vm
):
    """On GPU virtual memory (ROCm's hipMem* calls on the HIP stand-in), per-layer tables
    cost a chunk each, are read back, and are not budgeted; the log says aliased, and
    what allocated ones would have taken."""
    monkeypatch.setattr(
        torch.accelerator, "get_memory_info", lambda device=None: pytest.fail("budgeted")
    )
    chunk = 2 * 1024**2  # a power of two of at least 2 MiB, whatever the 4 KiB granule
    model = calibrated(tmp_path)
    model.builder.build(0, harness.make_batch(model, [40] * 20).common)
    assert all(bound(model))
    (line,) = [m for m in plugin_log if "scale table(s)" in m]
    assert "8 scale table(s) for 4 layer(s) (4 with tables of their own" in line
    assert f"aliased, {8 * chunk / 1024**2:.1f} MiB of device memory (8 mappings" in line
    assert f"where allocated tables would take {8 * table_bytes(model) / 1024**2:.1f} MiB" in line
    assert hip_vm.live_mappings() == 8 and hip_vm.physical_bytes() == 8 * chunk
    first = model.builder.binding(model.names[0])
    assert torch.all(first.k_scale_table == model.layers[model.names[0]]._k_scale_float)


def test_tables_past_the_mapping_bound_are_allocated_within_the_budget(
    tmp_path, kernels, plugin_log, monkeypatch, hip_vm, device_memory
):
    """The process's tables hold at most the mapping bound (ROCm makes a CPU mapping for
    every hipMemMap): past it, tables are allocated, budgeted as ever."""
    from vllm_rocm_asm_decode import asm_scale_tables

    answer, queries = device_memory
    monkeypatch.setattr(asm_scale_tables, "mapping_bound", lambda: 5)  # the probe's + 2 layers'
    model = calibrated(tmp_path)
    answer["free"] = scale_tables.MEMORY_MARGIN + 3 * table_bytes(model)  # one more layer's
    util = model.vllm_config.cache_config.gpu_memory_utilization
    answer["reserved"] = int(util * answer["total"])
    model.builder.build(0, harness.make_batch(model, [40] * 20).common)
    assert bound(model) == [True, True, True, False]
    assert hip_vm.live_mappings() == 4 <= asm_scale_tables.mapping_bound()
    kinds = [model.builder.binding(name).k_scale_table for name in model.names[:3]]
    assert [t.data_ptr() == hip_vm_ptr(t) for t in kinds] == [True, True, False]
    (line,) = [m for m in plugin_log if "scale table(s)" in m]
    assert "2 allocated (0.1 MiB) for 1 of 2 layer(s) past the bound of 5 mappings" in line
    assert len(queries) == 1


def hip_vm_ptr(table: torch.Tensor) -> int:
    """The address of a table if it lies in host memory the HIP stand-in maps (its
    reservations are 2 MiB aligned), else -1."""
    ptr = table.data_ptr()
    return ptr if ptr % (2 * 1024**2) == 0 else -1


def test_a_map_that_maps_nothing_is_caught_and_the_tables_are_allocated(
    tmp_path, kernels, plugin_log, hip_vm, monkeypatch
):
    """An older ROCm runtime reports hipMemMap done when the mapping failed underneath:
    the probe's read-back sees it, and the tables are allocated (budgeted) instead.
    (4 KiB chunks here, so that these small tables span several.)"""
    from vllm_rocm_asm_decode import asm_scale_tables

    monkeypatch.setattr(asm_scale_tables, "MIN_CHUNK", 4096)
    hip_vm.configure(clr=2024, silent_map=True)
    model = calibrated(tmp_path)
    batch = harness.make_batch(model, [40] * 20)
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    assert metadata.use_asm_decode and all(bound(model))
    (line,) = [m for m in plugin_log if "scale table(s)" in m]
    assert "allocated (an aliased table of" in line and "read back wrong" in line
    assert hip_vm.live_mappings() == 0 and hip_vm.reservations() == 0
    out = harness.run_layer(model, model.names[1], batch, metadata)
    ref = harness.reference(model, batch, model.layers[model.names[1]])
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=0)


# --------------------------------------------------------------------------------------
# Architecture


def test_arch_falls_back_to_torch_then_to_unknown(tmp_path, kernels, plugin_log, monkeypatch):
    from vllm.platforms import rocm

    monkeypatch.setattr(rocm, "_GCN_ARCH", "")
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device=0: types.SimpleNamespace(gcnArchName=f"{ARCH}:sramecc+:xnack-"),
    )
    assert current_arch() == ARCH

    def no_gpu(device=0):
        raise RuntimeError("no GPU")

    monkeypatch.setattr(torch.cuda, "get_device_properties", no_gpu)
    assert current_arch() == ""
    model = harness.build_model(tmp_path, num_layers=1)
    assert not model.builder.build(0, harness.make_batch(model, [40] * 20).common).use_asm_decode
    reasons = model.layers[model.names[0]].impl.asm_rejections
    assert reasons == ["a GPU other than gfx942/gfx950 (unknown)"]
    assert any("on an unknown GPU architecture" in m for m in plugin_log)


def test_standin_hsa_lists_only_installed_files():
    """The stand-in tables name only files that exist (as an installed AITER's do), so
    every other test runs with the kernel-file clause satisfied."""
    for arch in ("gfx942", "gfx950"):
        pa = Path(KERNEL_STANDIN) / "aiter" / "hsa" / arch / "pa"
        names = [line.split(",")[8] for line in (pa / "pa_asm.csv").read_text().splitlines()[1:]]
        assert names and all((pa / n).is_file() for n in names)


# --------------------------------------------------------------------------------------
# fp16 queries


def test_fp16_queries_wait_for_proof(tmp_path, kernels, plugin_log, aiter_version, monkeypatch):
    """AITER's accuracy test runs the ultra-precision kernel for bf16 queries only: fp16 layers
    keep HIP, saying why and how to lift it, until the trust switch (this AITER build
    passed doctor, whose self-test has an fp16 probe) admits them."""
    from vllm_rocm_asm_decode.eligibility import FP16_UNPROVEN

    aiter_version("0.1.27")  # a fixed AITER: fp16 is the only question
    model = harness.build_model(tmp_path / "default", num_layers=1, dtype="float16")
    batch = harness.make_batch(model, [40] * 16, dtype=torch.float16)
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    assert not metadata.use_asm_decode
    assert model.layers[model.names[0]].impl.asm_rejections == [FP16_UNPROVEN]
    assert harness.kept_on_hip(plugin_log, "fp16 queries")
    assert any("VLLM_ROCM_ASM_DECODE_TRUST_AITER=1" in m for m in plugin_log)
    out = harness.run_layer(model, model.names[0], batch, metadata)
    assert harness.asm_calls() == [] and kernels.hip_decode == 1
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", "1")
    load_asm_kernel.cache_clear()
    trusted = harness.build_model(tmp_path / "trusted", num_layers=1, dtype="float16")
    harness.fill_context(trusted, batch)
    metadata = trusted.builder.build(0, batch.common)
    assert metadata.use_asm_decode
    out = harness.run_layer(trusted, trusted.names[0], batch, metadata)
    ref = harness.reference(trusted, batch, trusted.layers[trusted.names[0]])
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=0)
    # bf16 needs no trust.
    monkeypatch.delenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER")
    load_asm_kernel.cache_clear()
    bf16 = harness.build_model(tmp_path / "bf16", num_layers=1)
    assert bf16.builder.build(0, harness.make_batch(bf16, [40] * 16).common).use_asm_decode


def test_an_aliased_table_the_driver_refuses_keeps_its_layer_on_hip(
    tmp_path, kernels, plugin_log, monkeypatch, hip_vm
):
    """Aliased tables are not budgeted: one that reads back wrong (the driver reported a
    mapping it did not make, after the probe passed) is never allocated in its place;
    its layer keeps HIP with the reason, the others bind."""
    from vllm_rocm_asm_decode import asm_scale_tables

    monkeypatch.setattr(asm_scale_tables, "MIN_CHUNK", 4096)  # tables of several chunks
    real, made = asm_scale_tables._aliased_table, []

    def flaky(vm, device, shape, scale):
        made.append(scale)  # the probe's, then each layer's K and V
        hip_vm.configure(clr=2024, silent_map=len(made) == 4)  # the second layer's K
        return real(vm, device, shape, scale)

    monkeypatch.setattr(asm_scale_tables, "_aliased_table", flaky)
    model = calibrated(tmp_path)
    model.builder.build(0, harness.make_batch(model, [40] * 20).common)
    assert bound(model) == [True, False, True, True]
    (second,) = model.layers[model.names[1]].impl.asm_rejections
    assert second.startswith("scale tables could not be mapped (an aliased table of")
    assert "read back wrong" in second
