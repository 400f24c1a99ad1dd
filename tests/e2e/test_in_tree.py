"""The in-tree form, stage by stage: the end-to-end suite against a vLLM patched by
``upstream --stage N`` with the plugin not loaded; the backends built on ROCM_ATTN's
classes and ``ROCM_AITER_FA`` as stock; the kernel tests written into vLLM, run on the CPU
with AITER's contract model.

Each stage's run is a check of its own (a fresh process on its patched vLLM); the tests
marked ``in_tree_only`` are what those runs add to the suite.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

import background
import harness
import in_tree

E2E = Path(__file__).resolve().parent
in_tree_only = pytest.mark.skipif(
    not harness.IN_TREE, reason="runs in the in-tree sessions of test_in_tree_suite"
)
STAGES = in_tree.STAGES


@pytest.mark.skipif(harness.IN_TREE, reason="runs the in-tree sessions itself")
@pytest.mark.parametrize(
    "stage",
    [pytest.param(n, marks=[pytest.mark.slow] if n > 1 else []) for n in STAGES],
    ids=[f"stage-{n}" for n in STAGES],
)
def test_in_tree_suite(stage):
    """``upstream --stage N`` applies to a copy of the installed vLLM, a second run
    changes nothing, and the e2e suite passes on the patched vLLM without the plugin, on
    the other stand-in arch: same routing, same outputs. Only what the plugin alone has
    (its guards, settings and tools) is skipped."""
    result = background.result(f"in-tree-stage-{stage}")
    first, second, suite = result["first"], result["second"], result["suite"]
    assert first.returncode == 0, first.stderr
    assert "rocm_attn.py" in first.stdout
    assert second.returncode == 0 and "already carries" in second.stdout
    tail = (suite.stdout + suite.stderr)[-3000:]
    assert suite.returncode == 0, tail
    cases = result["cases"]
    others = {name: o for name, o in cases.items() if o != "passed"}
    # Skipped: what the plugin alone has, what another stage has, what needs a GPU.
    expected_skips = ("not in-tree", "stage", "splits mixed steps", "AMD GPU", "gfx942/gfx950")
    unexpected = {n: o for n, o in others.items() if not any(r in o for r in expected_skips)}
    assert not unexpected, unexpected
    # Every e2e module that tests the backend ran and passed there, this one included,
    # and so did the rule's tests of the written test file.
    modules = {p.stem for p in E2E.glob("test_*.py")}
    modules -= {Path(m).stem for m in in_tree.PLUGIN_AND_TOOL_MODULES}
    passed = {name.split("::")[0].rsplit(".", 1)[-1] for name in cases if name not in others}
    assert passed == modules | {"test_rocm_attn_aiter_asm_decode"}, tail
    written = [name for name in cases if "test_rocm_attn_aiter_asm_decode" in name]
    # The rule's test and the builder's 3 run here; the 17 kernel tests skip without
    # AITER on an AMD GPU.
    cpu = 4
    assert len(written) == cpu + 17 and sum(name not in others for name in written) == cpu


# --------------------------------------------------------------------------------------
# What the in-tree session checks on the patched vLLM


@in_tree_only
def test_rocm_attn_is_vllms_own_class_and_the_plugin_is_not_loaded():
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    cls = AttentionBackendEnum.ROCM_ATTN.get_class()
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # as every vLLM process does; VLLM_PLUGINS leaves it out
    cls = AttentionBackendEnum.ROCM_ATTN.get_class()
    assert cls.__module__ == "vllm.v1.attention.backends.rocm_attn"
    assert Path(sys.modules["vllm"].__file__).is_relative_to(os.environ["ASM_DECODE_TEST_TREE"])


@in_tree_only
def test_the_plugin_stays_inactive_on_a_vllm_that_carries_the_change(monkeypatch):
    """Registered anyway (say, VLLM_PLUGINS unset), it says so once and changes nothing;
    its own settings are not read there (a bad one is reported, not raised)."""
    import logging

    from vllm import logger as vllm_logger
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_rocm_asm_decode import plugin

    for fn in (vllm_logger._print_info_once, vllm_logger._print_warning_once):
        fn.cache_clear()
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("vllm.rocm_asm_decode")
    log.addHandler(handler)
    old_level = log.level
    log.setLevel(logging.DEBUG)
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", "maybe")
    try:
        plugin.register()
        plugin.register()
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
    assert AttentionBackendEnum.ROCM_ATTN.get_class().__module__.startswith("vllm.v1.")
    inactive = [m for m in messages if "plugin inactive" in m]
    assert len(inactive) == 1 and "already carries the ROCM_ATTN asm decode" in inactive[0]
    assert "--attention-config.use_aiter_asm_decode=true turns it on there" in inactive[0]
    assert sum("TRUST_AITER='maybe'" in m and "ignored" in m for m in messages) == 1


@in_tree_only
def test_doctors_self_test_leaves_a_vllm_that_carries_the_change_alone(monkeypatch):
    from vllm_rocm_asm_decode.tools import doctor
    from vllm_rocm_asm_decode.tools.validation import gpu

    monkeypatch.setattr(gpu, "rocm_gpu_problem", lambda: None)
    report = doctor.environment()
    doctor.self_test(report, device="cpu")
    assert report.self_test.startswith("not run: the installed vLLM carries the asm decode")
    assert report.exit_code == 2
    assert not harness.asm_calls()


@in_tree_only
def test_plan_says_that_a_vllm_carrying_the_change_leaves_the_plugin_inactive():
    from vllm_rocm_asm_decode.tools import plan

    made = plan.make_plan(gpu="mi355x")
    assert made.vllm_carries_asm_decode and made.to_json()["vllm_carries_asm_decode"]
    note = "the vLLM imported here carries the asm decode itself (vllm.v1.attention.backends"
    assert made.notes[0].startswith(note) and "plugin stays inactive there" in made.notes[0]
    assert f"note: {made.notes[0]}" in plan.render(made).splitlines()


@in_tree_only
@pytest.mark.parametrize("version", ["0.1.16.post5", "0.1.17rc1", "unknown", None], ids=str)
def test_an_aiter_before_0_1_17_keeps_every_layer_on_hip(
    tmp_path, kernels, plugin_log, monkeypatch, version
):
    """AITER before 0.1.17 misreads KV block ids >= 65536 (AITER issue 3062), one of
    unknown version (no ``amd-aiter`` distribution, or one that is no version) may: every layer
    keeps the HIP decode, one warning line says why, and the count line says none decodes
    on asm. From 0.1.17 on, asm."""
    if version is None:
        monkeypatch.delenv("ASM_DECODE_TEST_AITER_VERSION")
    else:
        monkeypatch.setenv("ASM_DECODE_TEST_AITER_VERSION", version)
    model = harness.build_model(tmp_path, num_layers=2)
    batch = harness.make_batch(model, [20] * 64)  # 2560 query heads, above the cut
    assert not model.builder.build(0, batch.common).use_asm_decode
    assert harness.asm_layers(model.builder) == set()
    named = "of unknown version" if version in (None, "unknown") else version
    why = f"ROCM_ATTN: AITER pa_fwd_asm decodes 0 of 2 layers (AITER {named}, need 0.1.17)"
    assert plugin_log.count(why) == 1 and sum("pa_fwd_asm" in m for m in plugin_log) == 1
    assert plugin_log.levels[plugin_log.index(why)] == "WARNING"
    monkeypatch.setenv("ASM_DECODE_TEST_AITER_VERSION", "0.1.17")
    model = harness.build_model(tmp_path / "fixed", num_layers=2)
    assert model.builder.build(0, batch.common).use_asm_decode


@in_tree_only
@pytest.mark.parametrize(
    "module", ["rocm_aiter_unified_attn.py", "rocm_segmented_attn.py", "rocm_aiter_fa.py"]
)
def test_the_other_rocm_backends_files_are_untouched(module):
    if module == "rocm_aiter_fa.py" and (harness.STAGE or 0) >= 3:
        pytest.skip("stage 3 gives ROCM_AITER_FA the same scale tables")
    rel = Path("v1/attention/backends") / module
    patched = Path(os.environ["ASM_DECODE_TEST_TREE"]) / "vllm" / rel
    stock = Path(os.environ["ASM_DECODE_TEST_STOCK_VLLM"]) / rel
    assert patched.read_bytes() == stock.read_bytes()


@in_tree_only
@pytest.mark.parametrize("backend", ["ROCM_AITER_UNIFIED_ATTN", "ROCM_SEGMENTED_ATTN"])
def test_backends_built_on_rocm_attns_classes_keep_their_decode(tmp_path, kernels, backend):
    """Their builders never turn the asm path on (no binding, no scale tables, no
    reorder request); their impls keep their own forward."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.backends.rocm_attn import (
        RocmAttentionImpl,
        RocmAttentionMetadataBuilder,
    )

    cls = AttentionBackendEnum[backend].get_class()
    model = harness.build_model(tmp_path, num_layers=1)
    builder = cls.get_builder_cls()(model.spec, model.names, model.vllm_config, torch.device("cpu"))
    assert isinstance(builder, RocmAttentionMetadataBuilder)
    assert not harness.asm_enabled(builder)
    assert builder.reorder_batch_threshold == type(builder).reorder_batch_threshold
    batch = harness.make_batch(model, [20] * 64)  # 2560 query heads, above the cut
    metadata = builder.build(0, batch.common)
    assert not getattr(metadata, "use_asm_decode", False)
    assert getattr(metadata, "asm_split", None) is None and not getattr(metadata, "asm_scales", {})
    assert builder._asm_scales == {} and builder._asm_filled == {}  # never bound
    assert cls.get_impl_cls().forward is not RocmAttentionImpl.forward


@pytest.mark.skipif(not harness.IN_TREE or (harness.STAGE or 0) < 3, reason="in-tree from stage 3")
@pytest.mark.parametrize("aliased", [True, False], ids=["aliased", "allocated"])
def test_rocm_aiter_fa_makes_its_tables_the_same_way(tmp_path, monkeypatch, request, aliased):
    """Stage 3: ROCM_AITER_FA's tables come from the same helper. Aliased (GPU virtual
    memory: the module's hipMem* path on the HIP stand-in), a layer with checkpoint
    scales owns its tables, which a weight reload refills in place; allocated, tables
    stay shared by value as they were."""
    from types import SimpleNamespace

    from vllm._aiter_ops import rocm_aiter_ops
    from vllm.v1.attention.backends import asm_scale_tables, rocm_aiter_fa

    assert not hasattr(rocm_aiter_fa, "AsmKvScaleTables")
    if aliased:
        request.getfixturevalue("hip_vm")
    monkeypatch.setattr(rocm_aiter_ops, "is_shuffle_kv_cache_enabled", lambda: True)
    model = harness.build_model(tmp_path, num_layers=3, scales=[(0.5, 0.5)] * 3)
    calibrated = model.layers[model.names[0]]
    harness.load_checkpoint_scales(calibrated, 0.75, 0.25)
    builder = SimpleNamespace(  # what _build_asm_kv_scale_tables reads of its builder
        k_scale=None,
        v_scale=None,
        vllm_config=model.vllm_config,
        layer_names=model.names,
        num_heads_kv=model.num_kv_heads,
        block_size=model.block_size,
        device=torch.device("cpu"),
        _asm_tables=asm_scale_tables.AsmScaleTables(torch.device("cpu")),
    )
    build_tables = rocm_aiter_fa.AiterFlashAttentionMetadataBuilder._build_asm_kv_scale_tables
    build_tables(builder)
    first, second, third = model.names
    assert builder.k_scale[second].data_ptr() == builder.k_scale[third].data_ptr()
    assert torch.all(builder.k_scale[first] == calibrated._k_scale_float)
    if not aliased:  # a distinct scale: a table of its own value, shared by value
        assert builder._asm_tables.owners == [] and builder._asm_tables.aliased is False
        return
    assert builder.k_scale[first].data_ptr() != builder.k_scale[second].data_ptr()
    table = builder.k_scale[first]
    calibrated._k_scale_float = 2.0  # a weight reload
    build_tables(builder)  # at the next build: refilled in place, no new table
    assert builder.k_scale[first] is table and torch.all(table == 2.0)
    assert torch.all(builder.k_scale[second] == 0.5)


@in_tree_only
def test_its_attention_config_switch_is_off_by_default_and_turns_it_on(tmp_path, kernels):
    """``--attention-config.use_aiter_asm_decode=true``, as vLLM's own CLI parses it
    (no environment variable of its own); off by default until AMD runs are posted."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    for argv, on in (([], False), (["--attention-config.use_aiter_asm_decode=true"], True)):
        model = harness.build_model(tmp_path / str(on), num_layers=1)
        args = parser.parse_args([*argv, "--model", model.vllm_config.model_config.model])
        config = EngineArgs.from_cli_args(args).attention_config  # as vLLM takes it
        model.vllm_config.attention_config = config  # vLLM makes builders after it
        args = (model.spec, model.names, model.vllm_config, torch.device("cpu"))
        model.builder = type(model.builder)(*args)
        metadata = model.builder.build(0, harness.make_batch(model, [20] * 64).common)
        assert harness.asm_enabled(model.builder) is metadata.use_asm_decode is on


@in_tree_only
def test_aiters_mha_switch_turns_it_off_too(tmp_path, kernels, monkeypatch, plugin_log):
    """``VLLM_ROCM_USE_AITER_MHA=0`` keeps every step on HIP; with the switch on, the
    one warning line says why (reviews 34, 40: a switch turned on must not do nothing
    silently)."""
    from vllm._aiter_ops import rocm_aiter_ops

    monkeypatch.setenv("VLLM_ROCM_USE_AITER_MHA", "0")
    rocm_aiter_ops.refresh_env_variables()
    try:
        model = harness.build_model(tmp_path, num_layers=1)
        metadata = model.builder.build(0, harness.make_batch(model, [20] * 64).common)
        assert not harness.asm_enabled(model.builder) and not metadata.use_asm_decode
        said = "decodes 0 of 1 layers (VLLM_ROCM_USE_AITER(_MHA) is off)"
        lines = [m for m in plugin_log if "pa_fwd_asm decodes" in m]
        assert lines == [f"ROCM_ATTN: AITER pa_fwd_asm {said}"]
        assert plugin_log.levels[plugin_log.index(lines[0])] == "WARNING"
    finally:
        monkeypatch.undo()
        rocm_aiter_ops.refresh_env_variables()
    model = harness.build_model(tmp_path / "on", num_layers=1)
    assert model.builder.build(0, harness.make_batch(model, [20] * 64).common).use_asm_decode


@in_tree_only
def test_pa_fwd_asm_wrapper_passes_aiters_default_precision_unless_asked(monkeypatch):
    """A call without ``high_precision`` reaches AITER with AITER's own default."""
    import aiter
    from vllm._aiter_ops import rocm_aiter_ops

    seen = []
    monkeypatch.setattr(aiter, "pa_fwd_asm", lambda **kwargs: seen.append(kwargs))
    args = dict.fromkeys(
        ("Q", "K", "V", "block_tables", "context_lens", "K_QScale", "V_QScale", "out_")
    )
    rocm_aiter_ops.pa_fwd_asm(block_tables_stride0=1, **args)
    rocm_aiter_ops.pa_fwd_asm(block_tables_stride0=1, high_precision=2, **args)
    assert [s["high_precision"] for s in seen] == [1, 2]


# --------------------------------------------------------------------------------------
# The kernel tests `upstream` writes into vLLM, on the CPU with the contract model


def _kernel_test_module():
    """The generated file in the in-tree sessions; its source here."""
    if harness.IN_TREE:
        path = Path(os.environ["ASM_DECODE_TEST_TREE"]) / (
            "tests/kernels/attention/test_rocm_attn_aiter_asm_decode.py"
        )
        spec = importlib.util.spec_from_file_location("in_tree_kernel_test", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    from vllm_rocm_asm_decode.tools.upstream.in_tree import kernel_test

    return kernel_test


@pytest.fixture
def kernel_tests(monkeypatch, kernels):
    """The kernel tests' module with its tensors on the CPU (they skip here otherwise)."""
    module = _kernel_test_module()
    assert module.requires_asm.args == (True,), "a CPU machine must skip the hardware tests"
    # Through the plugin, fp16 queries wait for doctor's proof; these tests are that
    # proof's kind (in-tree, fp16 is in the rule as in the original change).
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", "1")
    monkeypatch.setattr(module, "DEVICE", "cpu")
    # Contexts up to 255 tokens keep the CPU reference and contract model quick; the GPU
    # runs the whole list.
    monkeypatch.setattr(module, "CONTEXTS", [1, 15, 16, 17, 255])
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _CpuGraph)  # replays what it captured
    monkeypatch.setattr(torch.cuda, "graph", _cpu_capture)
    # No device to sync with: the tests' sync check bites on the GPU alone.
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", _sync_debug_modes.append)
    return module


#: The sync-debug modes the kernel tests set on the CPU, in order.
_sync_debug_modes: list[object] = []


class _CpuGraph:
    """A CUDA graph on the CPU: what it holds are the AITER calls made while it
    captured, which ``replay`` launches again on the same tensors (a graph of
    ``forward``'s one kernel)."""

    def __init__(self) -> None:
        import aiter

        self.launch = aiter.pa_fwd_asm
        self.calls: list[dict] = []

    def replay(self) -> None:
        for kwargs in self.calls:
            self.launch(**kwargs)


@contextlib.contextmanager
def _cpu_capture(graph: _CpuGraph, *args, **kwargs):
    """As a capture on the GPU: the Python runs as it is (through whatever wraps AITER's
    call at the time, a test's spy included), and the graph keeps the kernel's calls."""
    import aiter

    current = aiter.pa_fwd_asm

    def record(**call):
        graph.calls.append(call)
        return current(**call)

    aiter.pa_fwd_asm = record
    try:
        yield
    finally:
        aiter.pa_fwd_asm = current


class _KernelTestsOnTheCpu:
    """A pytest plugin: the written kernel tests as vLLM's CI collects them, their
    skip lifted and their tensors on the CPU (the contract model for AITER)."""

    def pytest_collection_modifyitems(self, items):
        for item in items:
            item.own_markers = [m for m in item.own_markers if m.name != "skipif"]
            item.module.DEVICE = "cpu"
            item.module.CONTEXTS = [1, 15, 16, 17, 255]  # a quick CPU reference


def test_the_kernel_test_file_passes_under_pytest_on_the_contract_model(
    kernel_tests, monkeypatch, kernels
):
    """The written file run by pytest as vLLM's CI would (its own fixtures, imports and
    AITER switch: AITER is off until the file turns it on), on the CPU, CUDA graphs
    replaying the kernel calls they captured. The 4 GiB cache case is left to the GPU."""
    from vllm._aiter_ops import rocm_aiter_ops

    monkeypatch.delenv("VLLM_ROCM_USE_AITER", raising=False)
    rocm_aiter_ops.refresh_env_variables()
    assert not rocm_aiter_ops.is_mha_enabled()
    harness.reset_asm_calls()
    _sync_debug_modes.clear()
    selected = "not 4_gib and (not gqa_ratio or bf16-1 or fp16-5 or bf16-8)"
    if not harness.IN_TREE:  # these read stage 1's shared tables, its metadata, its raise
        selected += " and not (builders_decisions or every_layer_on_hip)"
    args = [kernel_tests.__file__, "-q", "-p", "no:cacheprovider", "-k", selected]
    try:
        code = pytest.main([*args, "--import-mode=importlib", "-W", "ignore"],
                           plugins=[_KernelTestsOnTheCpu()])  # fmt: skip
    finally:  # AITER's switch as the session had it, for the tests after this one
        monkeypatch.undo()
        rocm_aiter_ops.refresh_env_variables()
    assert code == 0
    assert len(harness.asm_calls()) >= 3 * 5  # 3 GQA ratios: warm-up, capture, 3 replays
    assert _sync_debug_modes == ["error", 0] * 3 * 3  # each build of 3 reloads: checked


def wrong_kernel(monkeypatch, mistake):
    """AITER's pa_fwd_asm (the stand-in) called with ``mistake`` applied to its
    arguments, in both forms (the call reaches it by keyword)."""
    import functools

    import aiter

    real = aiter.pa_fwd_asm

    @functools.wraps(real)
    def called(**kwargs):
        return real(**mistake(kwargs))

    monkeypatch.setattr(aiter, "pa_fwd_asm", called)


def test_the_kernel_tests_catch_a_layout_mistake(kernel_tests, tmp_path, monkeypatch):
    """V pages handed over token-major (``[block, head]``) instead of AITER's
    ``[head, block]`` make the accuracy test fail."""

    def token_major(kw):
        v = kw["V"]
        return kw | {"V": v.transpose(-1, -2).contiguous().view(v.shape)}

    wrong_kernel(monkeypatch, token_major)
    with pytest.raises(AssertionError):
        kernel_tests.test_every_admitted_gqa_ratio(tmp_path, 5, torch.bfloat16)


def test_the_kernel_tests_catch_a_scale_mistake(kernel_tests, tmp_path, monkeypatch):
    """K and V scale tables swapped (the layer's scales are 0.5 and 2) make the
    accuracy test fail."""
    wrong_kernel(
        monkeypatch, lambda kw: kw | {"K_QScale": kw["V_QScale"], "V_QScale": kw["K_QScale"]}
    )
    with pytest.raises(AssertionError):
        kernel_tests.test_every_admitted_gqa_ratio(tmp_path, 5, torch.bfloat16)


def test_the_kernel_tests_catch_aiters_default_precision(kernel_tests, tmp_path, monkeypatch):
    """The asm decode called at AITER's default precision (high_precision=1, 0.2-0.9
    GSM8K points below HIP in the original measurements) makes the GQA test fail."""
    if harness.IN_TREE:
        from vllm.v1.attention.backends import rocm_attn

        monkeypatch.setattr(rocm_attn, "_ASM_PRECISION", 1)
    else:
        from vllm_rocm_asm_decode import core

        monkeypatch.setattr(core, "ASM_PRECISION", 1)
    with pytest.raises(AssertionError) as failed:
        kernel_tests.test_every_admitted_gqa_ratio(tmp_path, 5, torch.bfloat16)
    assert '["high_precision"]' in str(failed.traceback[-1].statement)
