"""The runtime vLLM loads in every process (the package root) never imports the tools
(``vllm_rocm_asm_decode.tools``): not at module level, not inside a function. (What
vLLM's own plugin loading imports, in a process of its own, is checked in
``tests/e2e/test_plugin.py``.)"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "vllm_rocm_asm_decode"


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` in ``path`` names, resolved
    against the package (relative imports included), wherever the statement stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative to the package root (runtime modules live there)
                base = "vllm_rocm_asm_decode" + (f".{node.module}" if node.module else "")
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
            else:
                found.add(node.module or "")
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # a dotted path imported later (importlib, vLLM's registry)
            if node.value.startswith("vllm_rocm_asm_decode."):
                found.add(node.value)
    return found


def test_no_runtime_module_imports_a_tool():
    runtime = sorted(PACKAGE.glob("*.py"))
    assert {p.stem for p in runtime} >= {"plugin", "backend", "eligibility", "kernel"}
    for path in runtime:
        tools = sorted(m for m in imported_modules(path) if ".tools" in m)
        assert not tools, f"{path.name} imports {tools}"


def test_the_scan_sees_every_way_to_import_a_tool(tmp_path):
    """Control: the scan above would catch a lazy, an absolute or a by-name import."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f():\n    from .tools.plan import make_plan\n    return make_plan\n"
        "def g():\n    from vllm_rocm_asm_decode import tools\n    return tools\n"
        "PATH = 'vllm_rocm_asm_decode.tools.doctor.run'\n"
    )
    found = imported_modules(sample)
    assert "vllm_rocm_asm_decode.tools.plan" in found
    assert "vllm_rocm_asm_decode.tools" in found
    assert "vllm_rocm_asm_decode.tools.doctor.run" in found
