"""doctor: what an operator runs before turning the plugin on.

It reports the environment the plugin will trust (the version and place of the vLLM
Python imports, AITER's version and
whether it carries the KV block-id fix of 0.1.17, the GPU, AITER_ASM_DIR and the kernel
table, the .co files of the rows the plugin would pick, the switches in effect and what
each does (a VLLM_PLUGINS list vLLM would not load the plugin from fails the plugin
check), whether vLLM takes VLLM_LOGGING_LEVEL, and how scale tables are made on this
GPU) and checks each. On a
gfx942/gfx950 GPU with AITER it then runs a self-test of a few seconds through the
backend (real vLLM layers, KV cache and builder; about 9 GB of free GPU memory): asm
against fp32 for bf16 and fp16 queries, high KV blocks (a pool past 4 GiB of pages),
CUDA-graph padding rows left finite, and per-layer scale tables (aliased where the GPU
offers virtual memory) refilled after a weight reload between two graph replays.

Exit status: 0 when every check passed, the self-test included; 1 when a check failed;
2 when the GPU self-test could not run (no gfx942/gfx950 GPU, or no AITER), whether or
not a check of the environment failed: that part is still reported, FAIL lines
included.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from importlib.util import find_spec
from typing import Any

from .. import settings
from ..aiter_version import BLOCK_ID_LIMIT, FIRST_FIXED, AiterBuild, describe, installed_version
from ..kernel_table import ULTRA_PRECISION, KernelTable
from ..skew import ASM_SKEW_HEAD_TOKENS, ASM_SKEW_RATIO
from .choices import one_line
from .validation.check import NO_VLLM, Check

ENTRY_POINT = settings.ENTRY_POINT
EXIT_MEANINGS = {
    0: "every check passed, the GPU self-test included",
    1: "a check failed (see FAIL above)",
    2: "the GPU self-test could not run here (whatever the checks above say: FAIL "
    "lines name what else is wrong)",
}
#: The GQA ratios the shipped ultra-precision kernels serve (each rounds up to 8).
GQA_RATIOS = range(1, 9)


@dataclass
class Report:
    #: ``vllm.__version__`` of the vLLM this Python imports, and its directory.
    vllm_version: str | None
    vllm_path: str | None
    aiter_installed: bool
    aiter_version: str | None
    block_id_fix: bool | None
    #: ``{"arch", "compute_units"}`` on a ROCm platform; None elsewhere.
    gpu: dict[str, Any] | None
    asm_dir: str | None
    kernel_table: str | None
    kernel_files: list[dict[str, Any]]
    settings: list[dict[str, Any]]
    checks: list[Check] = field(default_factory=list)
    #: How the scale tables are made on this GPU: "aliased" (GPU virtual memory maps one
    #: chunk over each table) or "allocated"; None without a GPU.
    scale_tables: str | None = None
    #: "passed", "failed", or "not run: <why>".
    self_test: str = "not run"
    exit_code: int = 2

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _imported_vllm() -> tuple[str | None, str | None]:
    """The version and directory of the vLLM this Python imports (the first on its
    path, which need not be the installed distribution); Nones without one."""
    try:
        import vllm
    except ImportError:
        return None, None
    where = getattr(vllm, "__file__", None)
    return getattr(vllm, "__version__", None), None if where is None else os.path.dirname(where)


def _effect(parse: Callable[[], Any], describe_value: Callable[[Any], str]) -> str:
    """What a plugin setting does now, or why its value is invalid."""
    try:
        return describe_value(parse())
    except settings.SettingError as exc:
        return f"INVALID: {exc}"


#: The most characters of a variable's value the text report shows (JSON shows all).
SHOWN_CHARS = 100


def _clipped(value: str) -> str:
    """``value``, or for a longer one its start and how long it is: a long variable is
    shown once, readably."""
    if len(value) <= SHOWN_CHARS:
        return value
    return f"{value[: SHOWN_CHARS - 20]}... ({len(value)} characters)"


def switches() -> list[dict[str, Any]]:
    """Every switch the plugin reads or depends on: raw value and what it does now."""
    import vllm.envs as envs

    def raw(name: str) -> str | None:
        return os.environ.get(name)

    rows = []
    if envs.VLLM_ROCM_USE_AITER:
        aiter_effect = "AITER kernels on: the plugin can activate"
    elif raw("VLLM_ROCM_USE_AITER") is None:
        aiter_effect = "AITER off (the default): the plugin stays inactive; set 1"
    else:
        aiter_effect = "AITER off (vLLM reads only 1 or true here): the plugin stays inactive"
    rows.append(("VLLM_ROCM_USE_AITER", aiter_effect))
    if envs.VLLM_ROCM_USE_AITER_MHA:
        mha_effect = "AITER attention on: the asm decode is allowed"
    else:
        mha_effect = (
            "AITER attention off (vLLM reads only 1 or true here): the asm decode is off, "
            "and vLLM changes other attention choices"
        )
    rows.append(("VLLM_ROCM_USE_AITER_MHA", mha_effect))
    rows.append(
        (
            settings.SWITCH_ENV,
            _effect(
                settings.asm_decode_switch,
                lambda on: (
                    "asm decode on (the default): large pure-decode steps run the asm kernel"
                    if on
                    else "the asm decode is off; nothing else changes"
                ),
            ),
        )
    )
    rows.append(
        (
            settings.CUT_ENV,
            _effect(
                settings.cut_override,
                lambda cut: (
                    "the cut is 2 x compute units (the default)"
                    if cut is None
                    else f"pure-decode steps above {cut} query heads run asm"
                ),
            ),
        )
    )
    rows.append(
        (
            settings.SKEW_ENV,
            _effect(
                settings.skew_override,
                lambda skew: (
                    f"steps whose longest context x {ASM_SKEW_RATIO} passes their "
                    f"head-tokens + {ASM_SKEW_HEAD_TOKENS} keep HIP (the default)"
                    if skew is None
                    else "0: the skew clause is off"
                    if skew == 0
                    else f"steps whose longest context x {skew} passes their head-tokens "
                    f"+ {ASM_SKEW_HEAD_TOKENS} keep HIP"
                ),
            ),
        )
    )
    rows.append(
        (
            settings.TRUST_ENV,
            _effect(
                settings.trust_aiter,
                lambda trust: (
                    f"1: AITER is trusted with KV blocks >= {BLOCK_ID_LIMIT} whatever its "
                    "version, with pages 2 GiB apart unprobed, and with fp16 queries"
                    if trust
                    else f"only AITER {FIRST_FIXED} and later is trusted with KV blocks "
                    f">= {BLOCK_ID_LIMIT}; pages 2 GiB apart are probed at bind time (the "
                    "default)"
                ),
            ),
        )
    )
    if settings.plugins_allow_list() is None:
        plugins_effect = "every installed plugin loads, this one included (the default)"
    elif not settings.left_out_by_vllm_plugins():
        plugins_effect = f"allow-list names {ENTRY_POINT}: it loads"
    else:
        plugins_effect = f"allow-list without {ENTRY_POINT}: vLLM does not load the plugin"
        if any(name.strip() == ENTRY_POINT for name in settings.plugins_allow_list() or []):
            plugins_effect += " (vLLM splits the list at commas and strips no spaces)"
    rows.append(("VLLM_PLUGINS", plugins_effect))
    rows.append(("AITER_ASM_DIR", "where AITER's kernels and kernel tables are read"))
    return [{"name": name, "value": raw(name), "effect": effect} for name, effect in rows]


def kernel_rows(table: KernelTable) -> list[dict[str, Any]]:
    """The rows the plugin would pick (bf16/fp16 queries, fp8 cache, 16-token blocks,
    ``high_precision=2``, GQA 1-8), each with its file and whether it is installed."""
    picked: dict[tuple[str, str], dict[str, Any]] = {}
    for q_type in ("bf16", "fp16"):
        for gqa in GQA_RATIOS:
            row = table.find(
                q_type=q_type, kv_type="fp8", gqa=gqa, block_size=16, high_precision=ULTRA_PRECISION
            )
            if row is None:
                continue
            entry = picked.setdefault(
                (q_type, row.co_name),
                {
                    "query": q_type,
                    "gqa": [],
                    "co_name": row.co_name,
                    "path": None
                    if table.kernel_dir is None
                    else os.path.join(table.kernel_dir, row.co_name),
                    "installed": None
                    if table.kernel_dir is None
                    else table.missing_file(row) is None,
                },
            )
            entry["gqa"].append(gqa)
    return list(picked.values())


def _checks_without_vllm() -> list[Check]:
    """The settings and ``VLLM_LOGGING_LEVEL`` checks, which need no vLLM."""
    bad = settings.problems()
    settings_check = Check(
        "settings", not bad, "; ".join(bad) or "every VLLM_ROCM_ASM_DECODE* value is valid"
    )
    level = os.environ.get("VLLM_LOGGING_LEVEL")
    level_problem = settings.logging_level_problem()  # vLLM's logging set-up refuses it
    if level_problem is not None:
        level_check = Check("logging-level", False, level_problem)
    elif level is None:
        level_check = Check("logging-level", True, "VLLM_LOGGING_LEVEL unset: vLLM logs at INFO")
    else:
        # NOTSET defers to the root logger (WARNING); WARN and FATAL are other names.
        name = logging.getLevelName(logging.getLevelName(level.upper()) or logging.WARNING)
        level_check = Check(
            "logging-level", True, f"VLLM_LOGGING_LEVEL={level!r}: vLLM logs at {name}"
        )
    return [settings_check, level_check]


def _entry_point_check() -> Check:
    points = {ep.name: ep.value for ep in metadata.entry_points(group="vllm.general_plugins")}
    return Check(
        "entry-point",
        ENTRY_POINT in points,
        f"vllm.general_plugins {ENTRY_POINT} = {points.get(ENTRY_POINT, 'missing')}",
    )


def vllm_import_problem() -> str | None:
    """Why the vLLM this Python finds fails to import what the plugin and ``doctor``
    import first, in one line; None when it imports (or when there is none)."""
    if find_spec("vllm") is None:
        return None
    try:
        import vllm.envs
        import vllm.logger
        import vllm.platforms  # noqa: F401
    except Exception as exc:  # whatever a broken or foreign copy raises
        return _error_line(exc)
    return None


def _error_line(exc: Exception) -> str:
    """``exc`` as ``Type: first line of its message`` (``Type`` alone without one)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def without_vllm(problem: str, version: str | None = None) -> Report:
    """The report where the vLLM this Python finds cannot be used (``problem``: it does
    not import, or is another vLLM than the one the plugin extends and lacks what doctor
    reads): the checks that need no vLLM, a failed ``vllm`` check, no self-test (exit 2)."""
    spec = find_spec("vllm")
    where = os.path.dirname(spec.origin) if spec is not None and spec.origin else None
    aiter = installed_version()
    report = Report(
        vllm_version=version,
        vllm_path=where,
        aiter_installed=find_spec("aiter") is not None,
        aiter_version=aiter,
        block_id_fix=AiterBuild(aiter, trusted=_trusted()).block_id_fix,
        gpu=None,
        asm_dir=None,
        kernel_table=None,
        kernel_files=[],
        settings=[],
    )
    detail = f"the vLLM at {where or '?'} {problem}: the plugin does not load there"
    report.checks = [*_checks_without_vllm(), Check("vllm", False, detail), _entry_point_check()]
    report.self_test = NO_VLLM
    return report


def environment() -> Report:
    """The environment part: everything but the GPU self-test."""
    from ..plugin import inactive_reason
    from ..vllm_support import EXTENSION_POINTS, another_vllm_first, vllm_mismatch
    from .validation.gpu import rocm_gpu_problem

    checks = _checks_without_vllm()
    vllm_version, vllm_path = _imported_vllm()
    distribution = _version("vllm")
    if first := another_vllm_first(vllm_version, vllm_path, distribution):
        vllm_check = Check("vllm", False, first)
    elif (mismatch := vllm_mismatch(vllm_version)) is not None:
        vllm_check = Check("vllm", False, f"{mismatch}; the plugin keeps stock ROCM_ATTN")
    else:
        vllm_check = Check(
            "vllm",
            True,
            f"vLLM {vllm_version} from {vllm_path}: the 0.33 series, with every class, "
            f"method and parameter the plugin extends ({len(EXTENSION_POINTS)} checked)",
        )
    checks += [vllm_check, _entry_point_check()]
    try:
        reason = inactive_reason()
    except settings.SettingError as exc:
        reason = str(exc)
    if reason == f"{settings.SWITCH_ENV}=0":  # as the user wrote it (False, FALSE, ...)
        reason = settings.switch_as_written()
    if settings.left_out_by_vllm_plugins():  # vLLM never calls register(): said too
        plugins = os.environ["VLLM_PLUGINS"]
        if len(plugins) <= SHOWN_CHARS:
            plugins = f"={plugins!r}"
        else:  # the switches part shows its start
            plugins = f" ({len(plugins)} characters)"
        left_out = (
            f"VLLM_PLUGINS{plugins} does not name {ENTRY_POINT} (vLLM "
            "splits it at commas and strips nothing), so vLLM does not load the plugin; add "
            f"{ENTRY_POINT} to the list or unset VLLM_PLUGINS"
        )
        reason = f"{reason}; and {left_out}" if reason else left_out
    checks.append(
        Check(
            "plugin",
            reason is None,
            "active: vLLM's ROCM_ATTN gets the asm decode"
            if reason is None
            else f"inactive in this environment: {reason}",
        )
    )

    from vllm.platforms import current_platform

    gpu = None
    arch = ""
    if current_platform.is_rocm():
        from vllm.utils.platform_utils import num_compute_units

        from ..kernel import current_arch

        arch = current_arch()
        try:
            compute_units: int | None = num_compute_units()
        except Exception:  # the platform is ROCm but torch cannot open the GPU
            compute_units = None
        gpu = {"arch": arch or None, "compute_units": compute_units}
    problem = rocm_gpu_problem()
    checks.append(
        Check(
            "gpu",
            problem is None,
            f"{arch}, {gpu['compute_units']} CUs" if problem is None and gpu else problem or "",
        )
    )

    version = installed_version()
    aiter = AiterBuild(version, trusted=_trusted())
    tables = _scale_tables() if problem is None else None
    if tables is not None:
        checks.append(Check("scale-tables", True, tables[1]))
    report = Report(
        vllm_version=vllm_version,
        vllm_path=vllm_path,
        aiter_installed=find_spec("aiter") is not None,
        aiter_version=version,
        block_id_fix=aiter.block_id_fix,
        gpu=gpu,
        asm_dir=None,
        kernel_table=None,
        kernel_files=[],
        settings=switches(),
        checks=checks,
        scale_tables=tables[0] if tables else None,
    )
    if not report.aiter_installed:
        checks.append(Check("aiter", False, "the aiter package is not installed"))
        return report
    from ..kernel import asm_dir, load_asm_kernel

    report.asm_dir = asm_dir()
    try:
        kernel, why_not = load_asm_kernel(arch, settings.trust_aiter())
    except settings.SettingError:  # a bad trust switch, already a failed check above
        trust = os.environ.pop(settings.TRUST_ENV)
        try:
            kernel, why_not = load_asm_kernel(arch, settings.trust_aiter())
        finally:
            os.environ[settings.TRUST_ENV] = trust
    checks.append(
        Check(
            "aiter",
            kernel is not None,
            f"{describe(version)}: aiter.pa_fwd_asm takes the plugin's call"
            if kernel is not None
            else str(why_not),
        )
    )
    checks.append(_block_id_check(aiter))
    checks.append(_fp16_check(aiter))
    if kernel is None:
        return report
    report.kernel_table = kernel.table.source
    checks.append(
        Check(
            "kernel-table",
            kernel.table_note is None,
            kernel.table.source
            if kernel.table_note is None
            else f"not read ({kernel.table_note}); the plugin assumes {kernel.table.source}",
        )
    )
    report.kernel_files = kernel_rows(kernel.table)
    absent = [r["path"] for r in report.kernel_files if r["installed"] is False]
    checks.append(
        Check(
            "kernel-files",
            bool(report.kernel_files) and not absent,
            "no ultra-precision fp8 row for GQA 1-8 in the table"
            if not report.kernel_files
            else f"missing: {', '.join(absent)}"
            if absent
            else ", ".join(r["co_name"] for r in report.kernel_files) + " installed",
        )
    )
    return report


def _scale_tables() -> tuple[str, str]:
    """How the backend makes scale tables on this GPU, and a sentence on it: the probe
    the backend makes, at an MI355X table's shape (183,104 blocks of 8 KV heads)."""
    import torch

    from ..asm_scale_tables import MIN_CHUNK, aliasing_problem, mapping_bound, virtual_memory

    problem = aliasing_problem(torch.device("cuda"), (183_104, 8, 16))
    vm = virtual_memory()
    if problem is None:
        assert vm is not None
        return "aliased", (
            f"aliased: one chunk of {MIN_CHUNK // 2**20} MiB or more (a power of two) "
            f"mapped over each table, read back once; at most {mapping_bound()} mappings "
            f"per process, tables past them allocated ({vm.prefix}Mem* from {vm.library})"
        )
    return "allocated", (
        f"allocated in full ({problem}): calibrated per-layer scales cost 3.125 % of the "
        "KV cache, within the memory vLLM does not count on"
    )


def _block_id_check(aiter: AiterBuild, probe: Check | None = None) -> Check:
    """Whether large KV caches can use the asm decode with this AITER, and why."""
    who = describe(aiter.version)
    if aiter.block_id_fix:
        return Check("aiter-block-id-fix", True, f"{who} reads every KV block right")
    limit = (
        f"{who} {'predates' if aiter.block_id_fix is False else 'counts as predating'} the "
        f"KV block-id fix of {FIRST_FIXED}: caches of more than {BLOCK_ID_LIMIT} blocks "
        "(fewer for pages above 32 KiB) keep the HIP decode"
    )
    if probe is not None and not probe.ok:
        return Check("aiter-block-id-fix", False, f"{limit}; the block-id probe failed")
    if probe is not None:
        return Check(
            "aiter-block-id-fix",
            True,
            f"{limit}, but this build passed the block-id probe: {settings.TRUST_ENV}=1 "
            + ("(set) lets" if aiter.trusted else "lets")
            + " them use the asm decode",
        )
    if aiter.trusted:
        return Check(
            "aiter-block-id-fix",
            False,
            f"{who} is trusted with every KV block ({settings.TRUST_ENV}=1) but no block-id "
            "probe has passed here",
        )
    return Check("aiter-block-id-fix", False, limit)


def _fp16_check(aiter: AiterBuild, probe: Check | None = None) -> Check:
    """Whether fp16-query models can use the asm decode with this AITER, and why."""
    unproven = (
        "fp16 queries keep the HIP decode: AITER's accuracy test runs its ultra-precision "
        "kernel for bf16 only"
    )
    if probe is not None and not probe.ok:
        return Check("fp16-queries", False, f"{unproven}; the fp16 probe failed here")
    if probe is not None:
        state = "(set) lets" if aiter.trusted else "lets"
        return Check(
            "fp16-queries",
            True,
            f"the fp16 probe passed on this GPU: {settings.TRUST_ENV}=1 {state} fp16 "
            "models use the asm decode with this AITER",
        )
    if aiter.trusted:
        return Check(
            "fp16-queries",
            False,
            f"fp16 queries are trusted ({settings.TRUST_ENV}=1) but no fp16 probe has passed here",
        )
    return Check("fp16-queries", True, f"{unproven} (bf16 models are unaffected)")


def _trusted() -> bool:
    try:
        return settings.trust_aiter()
    except settings.SettingError:
        return False  # reported by the settings check


def self_test(
    report: Report,
    device: str = "cuda",
    block_id_heads: tuple[int, int] = (40, 8),
    block_id_pool: int | None = None,
) -> None:
    """Run the GPU probes through the backend and fold them into ``report``."""
    from ..plugin import IN_TREE_MODULE, vllm_carries_asm_decode
    from .validation.gpu import rocm_gpu_problem

    problem = rocm_gpu_problem()
    if problem is None and vllm_carries_asm_decode():
        problem = (
            f"the installed vLLM carries the asm decode itself ({IN_TREE_MODULE}); "
            "its tests/kernels/attention/test_rocm_attn_aiter_asm_decode.py tests the "
            "kernel"
        )
    if problem is not None:
        report.self_test = f"not run: {problem}"
        report.exit_code = 2
        return
    from vllm._aiter_ops import rocm_aiter_ops
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from ..plugin import BACKEND_PATH
    from .validation import selftest

    # The probes test the kernel on this GPU whatever the switches say (reported above),
    # at the default cut.
    os.environ["VLLM_ROCM_USE_AITER"] = "1"
    os.environ.pop(settings.CUT_ENV, None)
    rocm_aiter_ops.refresh_env_variables()
    register_backend(AttentionBackendEnum.ROCM_ATTN, BACKEND_PATH)
    probes = selftest.run_all(device, block_id_heads, block_id_pool)
    block_probe = next(c for c in probes if c.name == "selftest-block-id")
    fp16_probe = next(c for c in probes if c.name == "selftest-accuracy-float16")
    aiter = AiterBuild(report.aiter_version, trusted=_trusted())
    report.checks = [
        _block_id_check(aiter, block_probe)
        if c.name == "aiter-block-id-fix"
        else _fp16_check(aiter, fp16_probe)
        if c.name == "fp16-queries"
        else c
        for c in report.checks
    ] + probes
    report.self_test = "passed" if all(c.ok for c in probes) else "failed"
    report.exit_code = 0 if all(c.ok for c in report.checks) else 1


def run() -> Report:
    if (problem := vllm_import_problem()) is not None:
        return without_vllm(f"does not import ({problem})")
    try:
        report = environment()
    except Exception as exc:  # another vLLM that lacks what doctor reads, else a bug
        from ..vllm_support import vllm_mismatch

        version = getattr(sys.modules.get("vllm"), "__version__", None)
        if not isinstance(version, str) or (mismatch := vllm_mismatch(version)) is None:
            raise
        said = _error_line(exc)
        return without_vllm(f"is not one the plugin extends ({mismatch}; {said})", version)
    self_test(report)
    return report


def render(report: Report) -> str:
    gpu = report.gpu
    broken = report.self_test == NO_VLLM
    lines = [
        f"vLLM       {report.vllm_version or ('not usable' if broken else 'not installed')}"
        + (f" ({report.vllm_path})" if report.vllm_path else ""),
        "AITER      "
        + (
            report.aiter_version or "installed, version unknown"
            if report.aiter_installed
            else "not installed"
        )
        + (
            ""
            if report.block_id_fix is None
            else f" (KV block-id fix of {FIRST_FIXED}: {'yes' if report.block_id_fix else 'no'})"
        ),
        "GPU        "
        + (
            f"{gpu['arch'] or 'unknown arch'}, {gpu['compute_units'] or '?'} CUs"
            if gpu
            else "unknown (no usable vLLM)"
            if broken
            else "not a ROCm platform"
        ),
        f"asm dir    {report.asm_dir or '-'}",
        f"table      {report.kernel_table or '-'}",
        f"tables     {report.scale_tables or '-'}",
    ]
    for row in report.kernel_files:
        state = {True: "installed", False: "MISSING", None: "(built-in table: no file)"}[
            row["installed"]
        ]
        gqa = row["gqa"]
        lines.append(
            f"  {row['query']} GQA {gqa[0]}-{gqa[-1]}: {row['path'] or row['co_name']}  {state}"
        )
    lines.append("switches")
    for s in report.settings:
        value = "(unset)" if s["value"] is None else _clipped(s["value"])
        lines.append(f"  {s['name']}={value}: {s['effect']}")
    lines.append("checks")
    for c in report.checks:
        lines.append(f"  {'ok  ' if c.ok else 'FAIL'}  {c.name:<20} {c.detail}")
    lines.append(f"self-test  {report.self_test}")
    lines.append(f"result     exit {report.exit_code}: {EXIT_MEANINGS[report.exit_code]}")
    return "\n".join(map(one_line, lines))  # a value with a newline or ESC: escaped
