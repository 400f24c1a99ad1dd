"""A vLLM with the in-tree change, made from the installed one: its Python files copied
(compiled modules and data linked, never written), then ``vllm-rocm-asm-decode upstream
--stage N`` applied, as a user would apply it to a checkout.
"""

from __future__ import annotations

import sys
from pathlib import Path

import background

#: The e2e modules that test the plugin, its guards or its tools rather than the backend:
#: the in-tree sessions leave them out.
PLUGIN_AND_TOOL_MODULES = (
    "test_plugin.py",
    "test_plan.py",
    "test_doctor.py",
    "test_selftest.py",
    "test_aiter_trust.py",
    "test_kernel_boundary.py",
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
