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
    # __main__ is ``python -m vllm_rocm_asm_decode``, the command: no runtime imports it.
    runtime = sorted(p for p in PACKAGE.glob("*.py") if p.stem != "__main__")
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


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports() -> dict[str, set[str]]:
    """For every module of the package: the package's modules it imports, anywhere in
    the file (function-level imports included), relative ones resolved."""
    from importlib.util import resolve_name

    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = (
                    resolve_name("." * node.level + (node.module or ""), package)
                    if node.level
                    else node.module or ""
                )
                targets.add(base)
                targets.update(f"{base}.{a.name}" for a in node.names)
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_two_modules_import_each_other():
    """Not even through a function-level import: each module has one direction."""
    graph = package_imports()
    assert "vllm_rocm_asm_decode.tools.validation.tolerances" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_scan_finds_a_lazy_circle():
    """Control: a function-level import back is a circle."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
