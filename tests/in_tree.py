"""A vLLM with the in-tree change, made from the installed one: its Python files copied
(compiled modules and data linked, never written), then ``vllm-rocm-asm-decode upstream
--stage N`` applied, as a user would apply it to a checkout.
"""

from __future__ import annotations

import os
import shutil
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
    """``dest/vllm``: the installed vLLM's ``.py`` files (and their bytecode, still valid
    for the unchanged ones) copied, everything else symlinked."""
    source = installed_vllm()
    for dirpath, _, files in os.walk(source):
        rel = Path(dirpath).relative_to(source)
        target = dest / "vllm" / rel
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            if name.endswith((".py", ".pyc")):
                shutil.copy2(Path(dirpath) / name, target / name)
            else:
                (target / name).symlink_to(Path(dirpath) / name)
    return dest


def console(*args: str, env: dict[str, str]):
    """The installed ``vllm-rocm-asm-decode`` command."""
    exe = Path(sys.executable).with_name("vllm-rocm-asm-decode")
    return background.run([str(exe), *args], env, timeout=120)
