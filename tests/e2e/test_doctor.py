"""``doctor``: the environment part everywhere (exit 2 without a GPU), the self-test's
verdicts when the probes run (here on the CPU, through the backend, on the contract
model), and one JSON object in every case."""

from __future__ import annotations

import json
import shutil

import pytest

import background
import harness
from conftest import ARCH
from rocm_emulation import COMPUTE_UNITS, KERNEL_STANDIN
from vllm_rocm_asm_decode.tools import doctor
from vllm_rocm_asm_decode.tools.cli import main


def doctor_json(capsys) -> tuple[int, dict]:
    code = main(["doctor", "--json"])
    return code, json.loads(capsys.readouterr().out)


def checks(report: dict) -> dict[str, dict]:
    assert all(set(c) == {"name", "ok", "detail"} for c in report["checks"])
    return {c["name"]: c for c in report["checks"]}


background.declare(
    "doctor-plain",
    __file__,
    ["test_plain_machine_without_rocm_or_aiter_reports_and_exits_2"],
    lambda env: harness.run_console("doctor", "--json", env=env),
    seconds=6,
    slow=True,  # a whole command in a fresh process
)


@pytest.mark.slow
def test_plain_machine_without_rocm_or_aiter_reports_and_exits_2():
    """The installed command in a plain environment (no stand-ins): this CPU machine."""
    proc = background.result("doctor-plain")
    assert proc.returncode == 2, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["aiter_version"] is None and report["block_id_fix"] is None
    assert report["gpu"] is None and report["self_test"].startswith("not run: ")
    assert report["scale_tables"] is None  # no GPU: how tables are made is not known
    by_name = checks(report)
    assert by_name["vllm"]["ok"] and by_name["vllm"]["detail"].startswith("vLLM 0.33.")
    assert not by_name["aiter"]["ok"] and "not installed" in by_name["aiter"]["detail"]
    assert not by_name["plugin"]["ok"] and "not ROCm" in by_name["plugin"]["detail"]
    assert {s["name"] for s in report["settings"]} >= {
        "VLLM_ROCM_USE_AITER",
        "VLLM_ROCM_USE_AITER_MHA",
        "VLLM_ROCM_ASM_DECODE",
        "VLLM_ROCM_ASM_DECODE_CUT",
        "VLLM_ROCM_ASM_DECODE_TRUST_AITER",
        "VLLM_PLUGINS",
    }


@pytest.mark.parametrize(
    ("version", "fix", "ok"),
    [("0.1.16.post5", False, False), ("0.1.20", True, True), (None, None, False)],
    ids=["old", "fixed", "unknown"],
)
def test_stand_in_rocm_reports_aiter_version_arch_table_and_files(
    aiter_version, capsys, version, fix, ok
):
    aiter_version(version)
    code, report = doctor_json(capsys)
    assert code == 2  # torch here has no ROCm: the self-test cannot run
    assert report["aiter_installed"] is True
    assert report["aiter_version"] == version and report["block_id_fix"] is fix
    assert report["gpu"] == {"arch": ARCH, "compute_units": COMPUTE_UNITS[ARCH]}
    by_name = checks(report)
    assert by_name["aiter-block-id-fix"]["ok"] is ok
    if version == "0.1.16.post5":
        assert "predates the KV block-id fix of 0.1.17" in by_name["aiter-block-id-fix"]["detail"]
    assert by_name["plugin"]["ok"] and by_name["aiter"]["ok"] and by_name["kernel-table"]["ok"]
    assert report["kernel_table"].endswith(f"{ARCH}/pa/pa_asm.csv")
    files = {(r["query"], r["co_name"]): r for r in report["kernel_files"]}
    assert set(files) == {
        ("bf16", "standin_bf16_fp8_gqa8_hp2.co"),
        ("fp16", "standin_fp16_fp8_gqa8_hp2.co"),
    }
    assert all(r["installed"] and r["gqa"] == list(range(1, 9)) for r in files.values())


@pytest.mark.parametrize(
    ("imported", "distribution", "ok"),
    [("0.33.0", "0.33.0+rocm722", True), ("0.33.1.dev5+gabc", "0.33.1.dev5+gabc.rocm722", True),
     ("0.34.0", "0.33.0+rocm722", False)],
    ids=["rocm-release", "rocm-dev-build", "another-version"],
)  # fmt: skip
def test_a_rocm_builds_local_tag_is_the_same_vllm(
    aiter_version, monkeypatch, capsys, imported, distribution, ok
):
    """vLLM's setup writes the plain version into vllm/_version.py and adds +rocmNNN to
    its distribution's only: one vLLM, not another first on the path."""
    from vllm_rocm_asm_decode import vllm_support

    aiter_version("0.1.20")
    monkeypatch.setattr(vllm_support, "installed_vllm_version", lambda: distribution)
    monkeypatch.setattr(doctor, "_version", lambda n: distribution if n == "vllm" else None)
    monkeypatch.setattr(doctor, "_imported_vllm", lambda: (imported, "/somewhere/vllm"))
    _, report = doctor_json(capsys)
    check = checks(report)["vllm"]
    assert check["ok"] is ok and ("keep one vLLM on the path" in check["detail"]) is not ok


@pytest.mark.parametrize(
    ("version", "drop", "says"),
    [
        ("0.34.0.dev3+rocm700", None, "vLLM 0.34.0.dev3+rocm700 is not 0.33.x"),
        (None, "def get_impl_cls(", "moved what the plugin extends: "),
    ],
    ids=["other-series", "moved-method"],
)
def test_another_vllm_is_a_failed_check_saying_stock_serves(
    aiter_version, monkeypatch, capsys, version, drop, says
):
    """doctor says what register() decides: the same reason, on the vllm and plugin
    checks."""
    from vllm_rocm_asm_decode import vllm_support

    aiter_version("0.1.20")
    if version is not None:
        monkeypatch.setattr(vllm_support, "installed_vllm_version", lambda: version)
        monkeypatch.setattr(doctor, "_version", lambda name: version if name == "vllm" else None)
        monkeypatch.setattr(doctor, "_imported_vllm", lambda: (version, "/somewhere/vllm"))
    if drop is not None:
        real = vllm_support.module_source

        def source(module):
            text = real(module)
            return text.replace(drop, "def moved(") if module.endswith("rocm_attn") else text

        monkeypatch.setattr(vllm_support, "module_source", source)
    code, report = doctor_json(capsys)
    assert code == 2
    by_name = checks(report)
    assert not by_name["vllm"]["ok"] and says in by_name["vllm"]["detail"]
    assert by_name["vllm"]["detail"].endswith("the plugin keeps stock ROCM_ATTN")
    assert not by_name["plugin"]["ok"] and says in by_name["plugin"]["detail"]


def test_missing_kernel_file_fails_its_check(aiter_version, monkeypatch, tmp_path, capsys):
    hsa = tmp_path / "hsa"
    shutil.copytree(KERNEL_STANDIN / "aiter" / "hsa", hsa)
    (hsa / ARCH / "pa" / "standin_fp16_fp8_gqa8_hp2.co").unlink()
    monkeypatch.setenv("AITER_ASM_DIR", str(hsa))
    aiter_version("0.1.20")
    code, report = doctor_json(capsys)
    assert code == 2
    detail = checks(report)["kernel-files"]
    assert not detail["ok"] and "standin_fp16_fp8_gqa8_hp2.co" in detail["detail"]
    assert "standin_bf16" not in detail["detail"]


def test_text_report_names_each_switch_and_the_exit_meaning(aiter_version, monkeypatch, capsys):
    aiter_version("0.1.16.post5")
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_CUT", "900")
    assert main(["doctor"]) == 2
    out = capsys.readouterr().out
    assert "VLLM_ROCM_ASM_DECODE_CUT=900: pure-decode steps above 900 query heads run asm" in out
    assert "AITER      0.1.16.post5 (KV block-id fix of 0.1.17: no)" in out
    assert "result     exit 2: the GPU self-test could not run here" in out


def test_bad_setting_is_a_failed_check_not_a_crash(aiter_version, monkeypatch, capsys):
    aiter_version("0.1.20")
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", "sometimes")
    code, report = doctor_json(capsys)
    assert code == 2
    by_name = checks(report)
    assert not by_name["settings"]["ok"] and "'sometimes'" in by_name["settings"]["detail"]
    trust = next(s for s in report["settings"] if s["name"] == "VLLM_ROCM_ASM_DECODE_TRUST_AITER")
    assert trust["effect"].startswith("INVALID")


@pytest.fixture
def gpu_here(monkeypatch, kernels, short_contexts):
    """Let the self-test run on the CPU (the probes go through the backend to the
    contract model); its small block-id pool keeps the test light."""
    from vllm_rocm_asm_decode.tools.validation import gpu

    monkeypatch.setattr(gpu, "rocm_gpu_problem", lambda: None)
    monkeypatch.delenv("VLLM_ROCM_ASM_DECODE_CUT", raising=False)  # restored after the test


def run_doctor() -> doctor.Report:
    report = doctor.environment()
    with harness.untouched_kv_caches():  # the page-span probe's 4 GiB pool, barely touched
        doctor.self_test(report, device="cpu", block_id_heads=(8, 1), block_id_pool=70000)
    return report


def test_self_test_passes_on_a_sound_fixed_aiter(aiter_version, gpu_here, monkeypatch):
    aiter_version("0.1.20")
    monkeypatch.setenv("ASM_DECODE_TEST_AITER_SPAN", "right")  # a GPU that reads them right
    report = run_doctor()
    by_name = {c.name: c for c in report.checks}
    assert report.self_test == "passed" and report.exit_code == 0, report.checks
    assert {
        "selftest-accuracy-bfloat16",
        "selftest-accuracy-float16",
        "selftest-block-id",
        "selftest-page-span",
        "selftest-padding-rows",
        "selftest-scale-tables",
    } <= set(by_name)
    # The fp16 probe ran (trusted for its own run) and passed: the switch is cleared.
    fp16 = by_name["fp16-queries"]
    assert fp16.ok and "the fp16 probe passed on this GPU" in fp16.detail
    assert "VLLM_ROCM_ASM_DECODE_TRUST_AITER=1 lets fp16 models" in fp16.detail


def test_fp16_is_named_unproven_until_the_probe_runs(aiter_version, capsys):
    aiter_version("0.1.20")
    _, report = doctor_json(capsys)
    fp16 = checks(report)["fp16-queries"]
    assert fp16["ok"] and "fp16 queries keep the HIP decode" in fp16["detail"]


def test_self_test_on_an_old_aiter_fails_the_probe_and_exits_1(aiter_version, gpu_here):
    aiter_version("0.1.16.post5")  # the stand-in then misreads blocks >= 65536
    report = run_doctor()
    by_name = {c.name: c for c in report.checks}
    assert report.self_test == "failed" and report.exit_code == 1
    assert not by_name["selftest-block-id"].ok
    assert "read as block 1 (id & 0xFFFF)" in by_name["selftest-block-id"].detail
    assert not by_name["aiter-block-id-fix"].ok


@pytest.mark.slow  # a second whole self-test: test_page_span.py runs the probe
def test_a_kernel_that_misreads_far_pages_fails_the_page_span_probe(aiter_version, gpu_here):
    """The stand-in's default: pages of one wave 2 GiB apart are read at the offset
    wrapped to 32 bits (AITER's rebase, unproven on hardware)."""
    aiter_version("0.1.20")
    report = run_doctor()
    by_name = {c.name: c for c in report.checks}
    span = by_name["selftest-page-span"]
    assert not span.ok and report.exit_code == 1
    assert span.detail.startswith("AITER's asm kernel read KV pages 2.0 GiB apart unlike")
    assert "keep VLLM_ROCM_ASM_DECODE_TRUST_AITER unset" in span.detail
    assert by_name["selftest-block-id"].ok


@pytest.mark.slow  # a second whole self-test
def test_an_old_version_that_passes_the_probe_is_cleared_for_trust(
    aiter_version, gpu_here, monkeypatch
):
    """A build that reports an old version (say 0.1.0, no git metadata) but reads high
    blocks right: the probe is the proof, and doctor says the trust switch is safe."""
    aiter_version("0.1.0")
    monkeypatch.setattr("aiter._truncates_block_ids", lambda: False)
    monkeypatch.setenv("ASM_DECODE_TEST_AITER_SPAN", "right")
    report = run_doctor()
    by_name = {c.name: c for c in report.checks}
    assert by_name["selftest-block-id"].ok
    fix = by_name["aiter-block-id-fix"]
    assert fix.ok and "VLLM_ROCM_ASM_DECODE_TRUST_AITER=1" in fix.detail
    assert report.exit_code == 0


def test_doctor_usage_errors_are_one_line_exit_2(capsys):
    for argv in (["doctor", "--jsn"], ["doctor", "extra"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "error:" in err[0]


def test_trust_without_a_passed_probe_is_flagged(aiter_version, monkeypatch, capsys):
    aiter_version("0.1.16.post5")
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", "1")
    code, report = doctor_json(capsys)
    assert code == 2
    check = checks(report)["aiter-block-id-fix"]
    assert not check["ok"] and "is trusted with every KV block" in check["detail"]
    assert "no block-id probe has passed here" in check["detail"]
    fp16 = checks(report)["fp16-queries"]
    assert not fp16["ok"] and "no fp16 probe has passed here" in fp16["detail"]


def test_every_bad_setting_is_named(aiter_version, monkeypatch, capsys):
    aiter_version("0.1.20")
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", "maybe")
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_CUT", "-3")
    _, report = doctor_json(capsys)
    detail = checks(report)["settings"]["detail"]
    assert "VLLM_ROCM_ASM_DECODE_CUT='-3'" in detail and "TRUST_AITER='maybe'" in detail


def test_the_vllm_reported_is_the_one_imported(aiter_version, monkeypatch, capsys):
    """A vLLM first on the path (here: the imported module claiming 0.34.0) is what
    doctor reports, with its directory; the distribution's metadata says otherwise, and
    the vllm check fails saying so."""
    from pathlib import Path

    import vllm

    aiter_version("0.1.20")
    monkeypatch.setattr(vllm, "__version__", "0.34.0")
    code, report = doctor_json(capsys)
    assert code == 2
    where = str(Path(vllm.__file__).parent)
    assert (report["vllm_version"], report["vllm_path"]) == ("0.34.0", where)
    check = checks(report)["vllm"]
    assert not check["ok"]
    assert check["detail"].startswith(
        f"vLLM 0.34.0 is first on Python's path, at {where}, but the installed vllm "
        "distribution is 0.33."
    )
    assert main(["doctor"]) == 2
    assert f"vLLM       0.34.0 ({where})" in capsys.readouterr().out


def test_the_switch_is_shown_as_written(aiter_version, monkeypatch, capsys):
    aiter_version("0.1.20")
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE", "False")
    assert main(["doctor"]) == 2
    out = capsys.readouterr().out
    assert "  VLLM_ROCM_ASM_DECODE=False: the asm decode is off; nothing else changes" in out
    assert "inactive in this environment: VLLM_ROCM_ASM_DECODE=False" in out
    assert "VLLM_ROCM_ASM_DECODE=0" not in out


@pytest.mark.parametrize(
    ("plugins", "shown", "spaced"),
    [
        ("foo", "VLLM_PLUGINS='foo'", False),
        (" rocm_asm_decode", "VLLM_PLUGINS=' rocm_asm_decode'", True),
        *(  # leading-space's path, the space elsewhere
            pytest.param(*case, marks=pytest.mark.slow)
            for case in (
                ("rocm_asm_decode ,foo", "VLLM_PLUGINS='rocm_asm_decode ,foo'", True),
                ("foo, rocm_asm_decode", "VLLM_PLUGINS='foo, rocm_asm_decode'", True),
            )
        ),
        ("", "VLLM_PLUGINS=''", False),
        ("x" * 101, "VLLM_PLUGINS (101 characters)", False),  # (trial 24) shown once
    ],
    ids=[
        "other-plugin",
        "leading-space",
        "trailing-space",
        "space-after-comma",
        "empty",
        "long",
    ],
)
def test_an_allow_list_without_the_plugin_fails_the_plugin_check(
    aiter_version, monkeypatch, capsys, plugins, shown, spaced
):
    """vLLM splits VLLM_PLUGINS at commas and strips nothing: a list that does not name
    rocm_asm_decode exactly keeps the plugin unloaded, whatever else passes."""
    aiter_version("0.1.20")
    monkeypatch.setenv("VLLM_PLUGINS", plugins)
    code, report = doctor_json(capsys)
    assert code == 2
    plugin = checks(report)["plugin"]
    assert not plugin["ok"]
    assert plugin["detail"] == (
        f"inactive in this environment: {shown} does not name rocm_asm_decode (vLLM "
        "splits it at commas and strips nothing), so vLLM does not load the plugin; add "
        "rocm_asm_decode to the list or unset VLLM_PLUGINS"
    )
    (row,) = [r for r in report["settings"] if r["name"] == "VLLM_PLUGINS"]
    assert ("strips no spaces" in row["effect"]) is spaced, row
    assert main(["doctor"]) == 2
    out = capsys.readouterr().out.splitlines()
    (line,) = [ln for ln in out if ln.split()[1:2] == ["plugin"]]  # the check's line
    assert line.split()[0] == "FAIL" and shown in line
    (row,) = [ln for ln in out if ln.startswith("  VLLM_PLUGINS=")]  # the switch's
    assert row.split(":")[0] == (
        f"  VLLM_PLUGINS={plugins}"
        if len(plugins) <= 100
        else f"  VLLM_PLUGINS={'x' * 80}... (101 characters)"
    ), row


def test_an_allow_list_without_the_plugin_is_said_beside_another_reason(
    aiter_version, monkeypatch, capsys
):
    """(trial 22) One run names every reason the plugin is inactive: the switch off and
    an allow-list without the plugin, not the first alone."""
    aiter_version("0.1.20")
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE", "0")
    monkeypatch.setenv("VLLM_PLUGINS", "foo")
    _, report = doctor_json(capsys)
    assert checks(report)["plugin"]["detail"].startswith(
        "inactive in this environment: VLLM_ROCM_ASM_DECODE=0; and VLLM_PLUGINS='foo' does "
        "not name rocm_asm_decode"
    )


def test_switch_values_with_control_characters_stay_on_their_line(
    aiter_version, monkeypatch, capsys
):
    """(trial 22) A newline or ESC in a variable's value is written escaped in the
    switches rows, as in the FAIL lines: one row each, no escape sequence sent."""
    aiter_version("0.1.20")
    monkeypatch.setenv("VLLM_PLUGINS", "rocm_asm_decode\n")
    monkeypatch.setenv("AITER_ASM_DIR", "/x\x1b[31my")
    monkeypatch.setenv("VLLM_ROCM_USE_AITER_MHA", "\u202eoff")  # (trial 23) bidi: reverses
    monkeypatch.setenv("VLLM_ROCM_USE_AITER", "\t1")  # (trial 23) a tab hides the cause
    main(["doctor"])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "\t" not in out
    assert "\n  VLLM_PLUGINS=rocm_asm_decode\\n: allow-list without" in out
    assert "\n  AITER_ASM_DIR=/x\\x1b[31my: " in out
    assert "\n  VLLM_ROCM_USE_AITER_MHA=\\u202eoff: " in out
    assert "\n  VLLM_ROCM_USE_AITER=\\t1: " in out


def test_an_allow_list_naming_the_plugin_passes_the_plugin_check(
    aiter_version, monkeypatch, capsys
):
    aiter_version("0.1.20")
    monkeypatch.setenv("VLLM_PLUGINS", "foo,rocm_asm_decode")
    _, report = doctor_json(capsys)
    plugin = checks(report)["plugin"]
    assert plugin["ok"] and plugin["detail"] == "active: vLLM's ROCM_ATTN gets the asm decode"


BAD_LEVEL = (
    "VLLM_LOGGING_LEVEL='bogus' is not a logging level (DEBUG, INFO, WARNING, ERROR, CRITICAL)"
)


@pytest.mark.parametrize(
    ("level", "says"),
    [
        ("bogus", BAD_LEVEL),
        (" info", "VLLM_LOGGING_LEVEL=' info' is not a logging level"),  # vLLM strips nothing
    ],
    ids=["bogus", "leading-space"],
)
def test_a_bad_logging_level_is_a_failed_check(aiter_version, monkeypatch, level, says):
    """vLLM's logging set-up (vllm serve's, each engine process's) refuses a name that
    is not a level: doctor fails a check naming the variable."""
    aiter_version("0.1.20")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", level)
    report = doctor.run()
    check = {c.name: c for c in report.checks}["logging-level"]
    assert not check.ok and check.detail.startswith(says)
    assert report.exit_code == 2  # no GPU here: the self-test could not run
    assert f"FAIL  logging-level        {says}" in doctor.render(report)


@pytest.mark.parametrize(
    ("level", "logs_at"),
    [("warning", "WARNING"), ("warn", "WARNING"), ("NOTSET", "WARNING"), ("fatal", "CRITICAL")],
)
def test_a_good_logging_level_passes(aiter_version, monkeypatch, level, logs_at):
    """(trial 24) NOTSET defers to the root logger, WARNING; WARN and FATAL are aliases."""
    aiter_version("0.1.20")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", level)
    check = {c.name: c for c in doctor.environment().checks}["logging-level"]
    assert check.ok and check.detail == f"VLLM_LOGGING_LEVEL={level!r}: vLLM logs at {logs_at}"


@pytest.mark.slow  # a second whole self-test
def test_a_bad_logging_level_fails_doctor_after_a_passed_self_test(
    aiter_version, gpu_here, monkeypatch
):
    aiter_version("0.1.20")
    monkeypatch.setenv("ASM_DECODE_TEST_AITER_SPAN", "right")  # as in the passing self-test
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "bogus")
    report = run_doctor()
    assert report.self_test == "passed" and report.exit_code == 1


def test_doctor_json_prints_its_object_with_a_bad_logging_level(aiter_version, monkeypatch, capsys):
    aiter_version("0.1.20")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "bogus")
    code, report = doctor_json(capsys)
    assert code == 2
    assert checks(report)["logging-level"] == {
        "name": "logging-level",
        "ok": False,
        "detail": BAD_LEVEL,
    }


FOREIGN = {  # another vLLM that imports, but lacks what doctor reads
    "__init__.py": '__version__ = "0.6.0"',
    "envs.py": "",
    "logger.py": "import logging\ninit_logger = logging.getLogger",
    "platforms/__init__.py": "current_platform = None",
}


@pytest.mark.parametrize(
    ("files", "said"),
    [({"__init__.py": 'raise ImportError("boom")'}, "does not import (ImportError: boom)"),
     ({"__init__.py": '__version__ = "0.33.0"'},
      "does not import (ModuleNotFoundError: No module named 'vllm.envs')"),
     (FOREIGN, "is not one the plugin extends (vLLM 0.6.0 is not 0.33.x")],
    ids=["raises", "a-version-only", "another-series"],
)  # fmt: skip
@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_a_vllm_that_cannot_be_used_is_a_failed_check(tmp_path, files, said, json_out):
    """(trial 16, and its review) A vLLM first on the path that fails to import, or
    imports but is another series doctor cannot read, is reported, not a one-line crash:
    a FAIL line for the vllm check naming why, the checks that need no vLLM, no
    self-test, exit 2; ``--json`` still prints its one object."""
    import os
    import subprocess
    import sys

    for name, text in files.items():
        (tmp_path / "vllm" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "vllm" / name).write_text(text + "\n")
    env = os.environ | {"PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_rocm_asm_decode", "doctor", *["--json"] * json_out],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr == "", proc
    detail = f"the vLLM at {tmp_path / 'vllm'} {said}"
    if json_out:
        report = json.loads(proc.stdout)
        assert not checks(report)["vllm"]["ok"] and detail in checks(report)["vllm"]["detail"]
        assert list(checks(report)) == ["settings", "logging-level", "vllm", "entry-point"]
        assert report["self_test"] == doctor.NO_VLLM and report["exit_code"] == 2
    else:
        assert f"  FAIL  vllm                 {detail}" in proc.stdout
        shown = "0.6.0" if files is FOREIGN else "not usable"
        assert f"vLLM       {shown} ({tmp_path / 'vllm'})" in proc.stdout
