"""A vLLM with the in-tree change, made from the installed one: its Python files copied
(compiled modules and data linked, never written), then ``vllm-rocm-asm-decode upstream
--stage N`` applied, as a user would apply it to a checkout; and the end-to-end suite run
on it, one session per stage (the checks ``tests/e2e/test_in_tree.py`` reads).

The checks are declared here, not in the test module, so that the session can start them
before it collects (see ``background.start_early``): they are the longest.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import background
from vllm_rocm_asm_decode.tools.upstream import LAST_STAGE

TESTS = Path(__file__).resolve().parent
E2E = TESTS / "e2e"
STAGES = list(range(1, LAST_STAGE + 1))
#: Each form runs the suite on one of the two stand-in arches.
OTHER_ARCH = {"gfx950": "gfx942", "gfx942": "gfx950"}

#: The e2e modules that test the plugin, its guards or its tools rather than the backend:
#: the in-tree sessions leave them out.
PLUGIN_AND_TOOL_MODULES = (
    "test_plugin.py",
    "test_plan.py",
    "test_doctor.py",
    "test_selftest.py",
    "test_aiter_trust.py",
    "test_kernel_boundary.py",
    "test_page_span.py",
)


def installed_vllm() -> Path:
    from importlib.util import find_spec

    spec = find_spec("vllm")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent


def copy_vllm(dest: Path) -> Path:
    """``dest/vllm``: the installed vLLM, every entry linked except the directories on
    the way to the files ``upstream`` writes, which are real (so it replaces the linked
    files there by files of its own and never writes into the installed vLLM). Their
    bytecode caches are real too, with the unchanged modules' bytecode linked."""
    from vllm_rocm_asm_decode.tools.upstream import written
    from vllm_rocm_asm_decode.tools.upstream.stages import STAGES

    source = installed_vllm().parent
    real = {
        parent
        for rel in written(max(STAGES))
        if rel.parts[0] == "vllm"
        for parent in rel.parents
        if parent != Path(".")
    }

    def populate(rel_dir: Path) -> None:
        (dest / rel_dir).mkdir(parents=True, exist_ok=True)
        for entry in (source / rel_dir).iterdir():
            rel = rel_dir / entry.name
            if rel in real:
                populate(rel)
            elif entry.name == "__pycache__":
                (dest / rel).mkdir()
                for cached in entry.iterdir():
                    (dest / rel / cached.name).symlink_to(cached)
            else:
                (dest / rel).symlink_to(entry)

    populate(Path("vllm"))
    return dest


def console(*args: str, env: dict[str, str]):
    """The installed ``vllm-rocm-asm-decode`` command."""
    exe = Path(sys.executable).with_name("vllm-rocm-asm-decode")
    return background.run([str(exe), *args], env, timeout=120)


def run_suite(env: dict[str, str], stage: int) -> dict[str, object]:
    """Stage ``stage`` applied (twice) to a copy of the installed vLLM, then the e2e suite
    on it with the plugin not loaded; the outcome of each case."""
    tree = Path(tempfile.mkdtemp(prefix=f"vllm-stage-{stage}-"))
    try:
        copy_vllm(tree)
        first = console("upstream", str(tree), "--stage", str(stage), env=env)
        second = console("upstream", str(tree), "--stage", str(stage), env=env)
        report = tree / "report.xml"
        skip = [
            "tests/e2e/test_in_tree.py::test_in_tree_suite",
            "tests/e2e/test_mixed.py::"
            "test_vllms_real_prefill_kernel_on_the_split_views_matches_the_stock_call",
        ]
        suite_env = env | background.ONE_THREAD
        suite_env |= {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")])),
            "ASM_DECODE_TEST_GFX": OTHER_ARCH[env.get("ASM_DECODE_TEST_GFX", "gfx950")],
            "ASM_DECODE_TEST_FORM": "in-tree",
            "ASM_DECODE_TEST_STAGE": str(stage),
            "ASM_DECODE_TEST_TREE": str(tree),
            "ASM_DECODE_TEST_STOCK_VLLM": str(installed_vllm()),
            "VLLM_PLUGINS": "",  # no general plugin is loaded, this one included
            # Stage 1 admits AITER from 0.1.17 on (block ids >= 65536): the seed's.
            "ASM_DECODE_TEST_AITER_VERSION": "0.1.27",
        }
        written = tree / "tests/kernels/attention/test_rocm_attn_aiter_asm_decode.py"
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests/e2e"]
        cmd += [f"--ignore=tests/e2e/{m}" for m in PLUGIN_AND_TOOL_MODULES]
        cmd += [f"--deselect={s}" for s in skip] + [f"--junitxml={report}"]
        cmd += ["-o", "junit_family=xunit1"]  # with each case's file
        # The test file written into vLLM, as vLLM's CI collects it (on this CPU machine
        # the kernel tests skip with their reason, the rule's tests run).
        cmd += [str(written), f"--rootdir={E2E.parents[1]}"]
        cmd += ["-c", str(E2E.parents[1] / "pyproject.toml")]  # its markers
        suite = background.run(cmd, suite_env, cwd=str(E2E.parents[1]), timeout=900, preloaded=True)
        cases = {}
        if report.is_file():
            for case in ET.parse(report).iter("testcase"):
                outcome = "passed"
                for child in case:
                    if child.tag in ("failure", "error", "skipped"):
                        outcome = f"{child.tag}: {child.get('message', '')}"
                # The written file sits outside the rootdir: pytest names it by path.
                module = case.get("classname") or Path(case.get("file", "")).stem
                cases[f"{module}::{case.get('name')}"] = outcome
        return {"first": first, "second": second, "suite": suite, "cases": cases}
    finally:
        shutil.rmtree(tree, ignore_errors=True)


for _stage in STAGES:
    background.declare(
        f"in-tree-stage-{_stage}",
        E2E / "test_in_tree.py",
        [f"test_in_tree_suite[stage-{_stage}]"],
        lambda env, stage=_stage: run_suite(env, stage),
        45,
        slow=_stage > 1,
    )
