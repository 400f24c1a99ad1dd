"""The entry point and ``register()``: vLLM reads the platform and AITER switches at
import, so each case runs in a fresh Python process with its own environment; vLLM is
real in all of them, only the hardware query and the kernel library are stand-ins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
STOCK = {
    "ROCM_ATTN": "vllm.v1.attention.backends.rocm_attn.RocmAttentionBackend",
    "ROCM_AITER_FA": "vllm.v1.attention.backends.rocm_aiter_fa.AiterFlashAttentionBackend",
}
PLUGIN = "vllm_rocm_asm_decode.backend.RocmAsmDecodeBackend"

PROBE = textwrap.dedent("""
    import json, logging, os, sys, tempfile
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    import rocm_emulation
    arch = rocm_emulation.activate(gpu={gpu}, aiter={aiter})
    import pytest, torch
    records = []
    class H(logging.Handler):
        def emit(self, r): records.append(r.getMessage())
    logging.getLogger("vllm.rocm_asm_decode").addHandler(H())
    logging.getLogger("vllm.rocm_asm_decode").setLevel(logging.INFO)
    from vllm.v1.attention.backends.registry import AttentionBackendEnum as E
    def all_paths():
        out = {{}}
        for m in E:
            try:
                out[m.name] = m.get_path()
            except ValueError:  # members with no class until one is registered
                out[m.name] = None
        return out
    stock = all_paths()
    result = {{"error": None}}
    try:
        if {via_vllm}:
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
    result["rocm_attn"] = paths["ROCM_ATTN"]
    result["changed"] = sorted(k for k in paths if paths[k] != stock[k])
    result["stock_aiter_fa"] = E.ROCM_AITER_FA.get_path()
    result["log"] = records
    if {run_decode} and result["error"] is None:
        import harness
        rocm_emulation.patch_compute_units(arch)
        log = harness.install_kernel_standins(pytest.MonkeyPatch())
        model = harness.build_model(Path(tempfile.mkdtemp()), num_layers=1)
        batch = harness.make_batch(model, [40] * 32)
        harness.fill_context(model, batch)
        md = model.builder.build(0, batch.common)
        harness.run_layer(model, model.names[0], batch, md)
        result["backend"] = f"{{model.backend.__module__}}.{{model.backend.__name__}}"
        result["asm_calls"] = len(harness.asm_calls())
        result["hip_calls"] = log.hip_decode
    print("RESULT " + json.dumps(result))
""")


def probe(
    env: dict[str, str],
    *,
    gpu: bool = True,
    aiter: bool = True,
    via_vllm: bool = False,
    run_decode: bool = False,
) -> dict:
    script = PROBE.format(
        tests=str(TESTS), gpu=gpu, aiter=aiter, via_vllm=via_vllm, run_decode=run_decode
    )
    full_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "ASM_DECODE_TEST_NOOP"))
    }
    full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(TESTS),
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_entry_point_is_installed():
    from importlib.metadata import entry_points

    points = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert points.get("rocm_asm_decode") == "vllm_rocm_asm_decode.plugin:register"


def test_registers_on_rocm_with_aiter_and_changes_only_rocm_attn():
    r = probe({"VLLM_ROCM_USE_AITER": "1"}, run_decode=True)
    assert r["error"] is None and r["rocm_attn"] == PLUGIN
    assert r["changed"] == ["ROCM_ATTN"]  # ROCM_AITER_FA, UNIFIED, SEGMENTED untouched
    assert r["stock_aiter_fa"] == STOCK["ROCM_AITER_FA"]
    assert r["idempotent"] is True
    assert r["backend"] == PLUGIN and r["asm_calls"] == 1 and r["hip_calls"] == 0
    assert sum("plugin registered" in m for m in r["log"]) == 1


def test_vllms_own_plugin_loader_runs_it():
    r = probe({"VLLM_ROCM_USE_AITER": "1"}, via_vllm=True)
    assert r["error"] is None and r["rocm_attn"] == PLUGIN


def test_vllm_plugins_allow_list_can_leave_it_out():
    r = probe(
        {"VLLM_ROCM_USE_AITER": "1", "VLLM_PLUGINS": "lora_filesystem_resolver"}, via_vllm=True
    )
    assert r["rocm_attn"] == STOCK["ROCM_ATTN"] and r["changed"] == []


@pytest.mark.parametrize(
    ("env", "kw", "reason"),
    [
        (
            {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MHA": "0"},
            {},
            "VLLM_ROCM_USE_AITER_MHA=0",
        ),
        ({"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_ASM_DECODE": "0"}, {}, "VLLM_ROCM_ASM_DECODE=0"),
        ({"VLLM_ROCM_USE_AITER": "0"}, {}, "AITER is off"),
        ({"VLLM_ROCM_USE_AITER": "1"}, {"aiter": False}, "aiter package is not installed"),
    ],
    ids=["mha-off", "plugin-switch-off", "aiter-off", "aiter-missing"],
)
def test_switches_keep_stock_rocm_attn_and_every_batch_on_hip(env, kw, reason):
    r = probe(env, run_decode=True, **kw)
    assert r["error"] is None and r["changed"] == []
    assert r["backend"] == STOCK["ROCM_ATTN"]
    assert r["asm_calls"] == 0 and r["hip_calls"] == 1
    assert any(reason in m for m in r["log"]), r["log"]


def test_not_rocm_registers_nothing():
    r = probe({"VLLM_ROCM_USE_AITER": "1"}, gpu=False)
    assert r["error"] is None and r["changed"] == []
    assert any("not ROCm" in m for m in r["log"]), r["log"]


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("VLLM_ROCM_ASM_DECODE_CUT", "lots"),
        ("VLLM_ROCM_ASM_DECODE", "maybe"),
        ("VLLM_ROCM_ASM_DECODE_TRUST_AITER", "always"),
    ],
)
def test_bad_setting_is_a_startup_error_naming_it(var, value):
    r = probe({"VLLM_ROCM_USE_AITER": "1", var: value})
    assert r["error"] is not None and var in r["error"] and repr(value) in r["error"]
    assert r["changed"] == []
