"""The entry point and ``register()`` in processes of their own: vLLM resolves the
platform when it is imported, and caches its backend choice and loaded plugins per
process. One process imports vLLM per environment that must differ at import (the ROCm
stand-in with AITER, without AITER, no ROCm at all); it then forks a child per case, which
sets the case's switches before anything is registered or selected, so every case starts
as a fresh vLLM process would. vLLM is real in all of them; only the hardware query and
the kernel library are stand-ins."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import background

TESTS = Path(__file__).resolve().parents[1]
STOCK = {
    "ROCM_ATTN": "vllm.v1.attention.backends.rocm_attn.RocmAttentionBackend",
    "ROCM_AITER_FA": "vllm.v1.attention.backends.rocm_aiter_fa.AiterFlashAttentionBackend",
}
PLUGIN = "vllm_rocm_asm_decode.backend.RocmAsmDecodeBackend"

#: Imports vLLM once, then runs each case of ``CASES_JSON`` in a forked child that sets
#: the case's environment first (and re-reads vLLM's AITER switches, which vLLM reads at
#: import) and prints one ``RESULT <name> <json>`` line.
PROBE = textwrap.dedent("""
    import json, logging, os, sys
    sys.path.insert(0, {tests!r})
    import rocm_emulation
    arch = rocm_emulation.activate(gpu={gpu}, aiter={aiter})
    import pytest, torch
    from vllm.platforms import current_platform
    from vllm._aiter_ops import rocm_aiter_ops
    from vllm.v1.attention.backends.registry import AttentionBackendEnum as E
    # vLLM's modules the decode cases build their model from, loaded once here (a
    # worker has them loaded anyway): the forked cases do not import them again each.
    import vllm.model_executor.layers.attention, vllm.v1.worker.utils
    import vllm.v1.core.kv_cache_planning

    def all_paths():
        out = {{}}
        for m in E:
            try:
                out[m.name] = m.get_path()
            except ValueError:  # members with no class until one is registered
                out[m.name] = None
        return out

    def watch_runtime_imports():
        # Every import a runtime module (package root) makes of a tool module, loaded
        # already or not: the import statement itself is recorded.
        import builtins, importlib.util
        real = builtins.__import__
        crossings = []
        def spy(name, globals=None, locals=None, fromlist=(), level=0):
            importer = (globals or {{}}).get("__name__") or ""
            runtime = importer.startswith("vllm_rocm_asm_decode") and ".tools" not in importer
            if runtime:
                target = name
                if level:
                    package = (globals or {{}}).get("__package__") or importer
                    target = importlib.util.resolve_name("." * level + name, package)
                names = [target, *(f"{{target}}.{{f}}" for f in fromlist or ())]
                if any(n.startswith("vllm_rocm_asm_decode.tools") for n in names):
                    crossings.append([importer, target])
            return real(name, globals, locals, fromlist, level)
        builtins.__import__ = spy
        return crossings

    def fake_vllm(version, drop):
        # Another vLLM as the guard sees it: its version, and its rocm_attn.py with one
        # name renamed away.
        from vllm_rocm_asm_decode import vllm_support
        real = vllm_support.module_source
        if version:
            vllm_support.installed_vllm_version = lambda: version
        if drop:
            def source(module):
                text = real(module)
                if module.endswith("rocm_attn") and text:
                    text = text.replace(drop, drop + "_moved")
                return text
            vllm_support.module_source = source

    def run(case):
        crossings = watch_runtime_imports()
        os.environ.update(case["env"])
        fake_vllm(case["vllm_version"], case["vllm_drop"])
        rocm_aiter_ops.refresh_env_variables()
        records = []
        class H(logging.Handler):
            def emit(self, r): records.append(r.getMessage())
        logging.getLogger("vllm.rocm_asm_decode").addHandler(H())
        logging.getLogger("vllm.rocm_asm_decode").setLevel(logging.INFO)
        stock = all_paths()
        result = {{"error": None}}
        try:
            if case["via_vllm"]:
                from vllm.plugins import load_general_plugins
                load_general_plugins()
            else:
                from vllm_rocm_asm_decode.plugin import register
                register()
                after_once = all_paths()
                register()
                result["idempotent"] = after_once == all_paths()
        except Exception as exc:
            result["error"] = f"{{type(exc).__name__}}: {{exc}}"
        paths = all_paths()
        if case["via_vllm"] and result["error"] is None:
            E.ROCM_ATTN.get_class()  # vLLM resolving the backend imports its module
        # Before the tests' own helpers come in: what vLLM loading the plugin imported.
        result["tool_modules"] = sorted(
            m for m in sys.modules if m.startswith("vllm_rocm_asm_decode.tools")
        )
        result["rocm_attn"] = paths["ROCM_ATTN"]
        result["changed"] = sorted(k for k in paths if paths[k] != stock[k])
        result["stock_aiter_fa"] = E.ROCM_AITER_FA.get_path()
        result["log"] = records
        if case["run_decode"] and result["error"] is None:
            import harness
            rocm_emulation.patch_compute_units(arch)
            log = harness.install_kernel_standins(pytest.MonkeyPatch())
            model = harness.build_model(num_layers=1)
            batch = harness.make_batch(model, [40] * 32)
            harness.fill_context(model, batch)
            md = model.builder.build(0, batch.common)
            harness.run_layer(model, model.names[0], batch, md)
            result["backend"] = f"{{model.backend.__module__}}.{{model.backend.__name__}}"
            result["asm_calls"] = len(harness.asm_calls())
            result["hip_calls"] = log.hip_decode
        result["runtime_imported_tools"] = crossings
        return result

    for name, case in json.loads({cases!r}).items():
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            import signal
            signal.alarm(300)  # a hung case dies instead of outliving the run
            code = 0
            try:
                print("RESULT " + name + " " + json.dumps(run(case)), flush=True)
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.waitpid(pid, 0)
""")

AITER_ON = {"VLLM_ROCM_USE_AITER": "1"}
#: Every case: (environment, options). Cases with equal ``gpu``/``aiter`` share a process.
CASES: dict[str, tuple[dict[str, str], dict[str, bool]]] = {
    "registers": (AITER_ON, {"run_decode": True}),
    "via-vllm": (AITER_ON, {"via_vllm": True}),
    "allow-list": (AITER_ON | {"VLLM_PLUGINS": "lora_filesystem_resolver"}, {"via_vllm": True}),
    "mha-off": (AITER_ON | {"VLLM_ROCM_USE_AITER_MHA": "0"}, {"run_decode": True}),
    "plugin-switch-off": (AITER_ON | {"VLLM_ROCM_ASM_DECODE": "0"}, {"run_decode": True}),
    "aiter-off": ({"VLLM_ROCM_USE_AITER": "0"}, {"run_decode": True}),
    "aiter-missing": (AITER_ON, {"run_decode": True, "aiter": False}),
    "not-rocm": (AITER_ON, {"gpu": False}),
    "bad-cut": (AITER_ON | {"VLLM_ROCM_ASM_DECODE_CUT": "lots"}, {}),
    "bad-switch": (AITER_ON | {"VLLM_ROCM_ASM_DECODE": "maybe"}, {}),
    "bad-trust": (AITER_ON | {"VLLM_ROCM_ASM_DECODE_TRUST_AITER": "always"}, {}),
    "bad-not-rocm": (AITER_ON | {"VLLM_ROCM_ASM_DECODE_CUT": "lots"}, {"gpu": False}),
    "vllm-0.34": (AITER_ON, {"run_decode": True, "vllm_version": "0.34.0+rocm700"}),
    "vllm-moved": (AITER_ON, {"run_decode": True, "vllm_drop": "output_block_scale"}),
    "bad-vllm-0.34": (
        AITER_ON | {"VLLM_ROCM_ASM_DECODE": "maybe"},
        {"vllm_version": "0.34.0.dev3+rocm700"},
    ),
}


def _run_group(
    gpu: bool, aiter: bool, names: list[str], base_env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    cases = {
        name: {
            "env": CASES[name][0],
            "via_vllm": CASES[name][1].get("via_vllm", False),
            "run_decode": CASES[name][1].get("run_decode", False),
            "vllm_version": CASES[name][1].get("vllm_version"),
            "vllm_drop": CASES[name][1].get("vllm_drop"),
        }
        for name in names
    }
    script = PROBE.format(tests=str(TESTS), gpu=gpu, aiter=aiter, cases=json.dumps(cases))
    env = {
        k: v for k, v in base_env.items() if not k.startswith(("VLLM_", "ASM_DECODE_TEST_NOOP"))
    } | background.ONE_THREAD
    return background.run(
        [sys.executable, "-c", script], env, cwd=str(TESTS), timeout=900, preloaded=True
    )


def _groups() -> dict[tuple[bool, bool], list[str]]:
    """The cases by import-time environment (ROCm stand-in?, AITER?)."""
    groups: dict[tuple[bool, bool], list[str]] = {}
    for name, (_, options) in CASES.items():
        key = (options.get("gpu", True), options.get("aiter", True))
        groups.setdefault(key, []).append(name)
    return groups


#: The tests that read the probes.
PROBE_TESTS = (
    "test_registers_on_rocm_with_aiter_and_changes_only_rocm_attn",
    "test_vllms_own_plugin_loader_runs_it_and_loads_no_tool",
    "test_vllm_plugins_allow_list_can_leave_it_out",
    "test_switches_keep_stock_rocm_attn_and_every_batch_on_hip",
    "test_not_rocm_registers_nothing",
    "test_a_bad_setting_where_the_plugin_cannot_act_stops_nothing",
    "test_bad_setting_is_a_startup_error_naming_it",
    "test_another_vllm_keeps_stock_rocm_attn_and_says_why_in_one_line",
)
for _key, _names in _groups().items():  # each environment's process runs in the background
    background.declare(
        f"plugin-probes-{_key}",
        __file__,
        PROBE_TESTS,
        lambda env, key=_key, names=_names: _run_group(*key, names, env),
        seconds=3 * len(_names) + 8,  # a vLLM import, then a few seconds a case
    )


@pytest.fixture(scope="module")
def probes() -> dict[str, dict]:
    """Every case's result (or the failing process's stderr)."""
    results: dict[str, dict] = {}
    for key, names in _groups().items():
        proc = background.result(f"plugin-probes-{key}")
        found = {}
        for line in proc.stdout.splitlines():
            if line.startswith("RESULT "):
                name, payload = line[len("RESULT ") :].split(" ", 1)
                found[name] = json.loads(payload)
        for name in names:
            results[name] = found.get(name, {"missing": proc.stderr[-4000:]})
    return results


def probe(probes, name: str) -> dict:
    result = probes[name]
    assert "missing" not in result, result.get("missing")
    return result


def test_entry_point_is_installed():
    from importlib.metadata import entry_points

    points = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert points.get("rocm_asm_decode") == "vllm_rocm_asm_decode.plugin:register"


def test_registers_on_rocm_with_aiter_and_changes_only_rocm_attn(probes):
    r = probe(probes, "registers")
    # The plugin registered and a layer ran (asm): no runtime module imported a tool on
    # the way (the test bed and stand-ins do, as tools; they are not the runtime).
    assert r["runtime_imported_tools"] == []
    assert r["error"] is None and r["rocm_attn"] == PLUGIN
    assert r["changed"] == ["ROCM_ATTN"]  # ROCM_AITER_FA, UNIFIED, SEGMENTED untouched
    assert r["stock_aiter_fa"] == STOCK["ROCM_AITER_FA"]
    assert r["idempotent"] is True
    assert r["backend"] == PLUGIN and r["asm_calls"] == 1 and r["hip_calls"] == 0
    assert sum("plugin registered" in m for m in r["log"]) == 1


def test_vllms_own_plugin_loader_runs_it_and_loads_no_tool(probes):
    r = probe(probes, "via-vllm")
    assert r["error"] is None and r["rocm_attn"] == PLUGIN
    assert r["tool_modules"] == []  # the runtime never imports vllm_rocm_asm_decode.tools


def test_vllm_plugins_allow_list_can_leave_it_out(probes):
    r = probe(probes, "allow-list")
    assert r["rocm_attn"] == STOCK["ROCM_ATTN"] and r["changed"] == []


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("mha-off", "VLLM_ROCM_USE_AITER_MHA=0"),
        ("plugin-switch-off", "VLLM_ROCM_ASM_DECODE=0"),
        ("aiter-off", "AITER is off"),
        ("aiter-missing", "aiter package is not installed"),
    ],
)
def test_switches_keep_stock_rocm_attn_and_every_batch_on_hip(probes, case, reason):
    r = probe(probes, case)
    assert r["error"] is None and r["changed"] == []
    assert r["backend"] == STOCK["ROCM_ATTN"]
    assert r["asm_calls"] == 0 and r["hip_calls"] == 1
    assert any(reason in m for m in r["log"]), r["log"]


def test_not_rocm_registers_nothing(probes):
    r = probe(probes, "not-rocm")
    assert r["error"] is None and r["changed"] == []
    assert any("not ROCm" in m for m in r["log"]), r["log"]


def test_a_bad_setting_where_the_plugin_cannot_act_stops_nothing(probes):
    """Not ROCm: vLLM starts; the bad value is said once and the plugin stays out."""
    r = probe(probes, "bad-not-rocm")
    assert r["error"] is None and r["changed"] == []
    assert any("VLLM_ROCM_ASM_DECODE_CUT='lots'" in m and "ignored" in m for m in r["log"])
    assert any("inactive: not ROCm" in m for m in r["log"]), r["log"]


@pytest.mark.parametrize(
    ("case", "var", "value"),
    [
        ("bad-cut", "VLLM_ROCM_ASM_DECODE_CUT", "lots"),
        ("bad-switch", "VLLM_ROCM_ASM_DECODE", "maybe"),
        ("bad-trust", "VLLM_ROCM_ASM_DECODE_TRUST_AITER", "always"),
    ],
)
def test_bad_setting_is_a_startup_error_naming_it(probes, case, var, value):
    r = probe(probes, case)
    assert r["error"] is not None and var in r["error"] and repr(value) in r["error"]
    assert r["changed"] == []


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("vllm-0.34", "vLLM 0.34.0+rocm700 is not 0.33.x, the vLLM this release extends"),
        (
            "vllm-moved",
            "moved what the plugin extends: RocmAttentionImpl.forward takes (layer, query, "
            "key, value, kv_cache, attn_metadata, output, output_scale, "
            "output_block_scale_moved)",
        ),
        ("bad-vllm-0.34", "vLLM 0.34.0.dev3+rocm700 is not 0.33.x"),
    ],
)
def test_another_vllm_keeps_stock_rocm_attn_and_says_why_in_one_line(probes, case, reason):
    """A vLLM of another series, or one whose classes moved, keeps stock ROCM_ATTN (and
    its decode) with the reason in one line; a bad setting there stops nothing."""
    r = probe(probes, case)
    assert r["error"] is None and r["changed"] == [] and r["rocm_attn"] == STOCK["ROCM_ATTN"]
    inactive = [m for m in r["log"] if "plugin inactive" in m]
    assert len(inactive) == 1 and reason in inactive[0], r["log"]
    assert inactive[0].endswith("; stock ROCM_ATTN serves") and "\n" not in inactive[0]
    if "run_decode" in CASES[case][1]:
        assert r["backend"] == STOCK["ROCM_ATTN"] and r["asm_calls"] == 0
    if case.startswith("bad-"):
        assert any("VLLM_ROCM_ASM_DECODE='maybe'" in m and "ignored" in m for m in r["log"])
