"""The environment a reproduction ran in, recorded at each invocation without importing
torch or vLLM (``doctor``'s step adds what only an import can tell: the vLLM Python
imports, AITER's build, the GPU's architecture and compute units)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

#: Environment variables that change what the servers or the plugin do.
SETTING_PREFIXES = ("VLLM_ROCM_", "VLLM_PLUGINS", "VLLM_GPU_SYNC_CHECK", "AITER_", "HIP_VISIBLE")
SETTING_NAMES = ("ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "VLLM_ATTENTION_BACKEND")
PACKAGE_DIR = Path(__file__).resolve().parents[2]


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    """stdout of a short command, or None when it is missing, fails or hangs."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def git_revision() -> str | None:
    """This package's git revision, ``+dirty`` with uncommitted changes to tracked
    files; None when it was installed from elsewhere than a checkout."""
    head = _run(["git", "rev-parse", "HEAD"], cwd=PACKAGE_DIR)
    if not head:
        return None
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PACKAGE_DIR)
    return head.strip() + ("+dirty" if dirty and dirty.strip() else "")


def rocm_version() -> str | None:
    root = Path(os.environ.get("ROCM_PATH", "/opt/rocm"))
    for name in (".info/version", ".info/version-dev"):
        try:
            return (root / name).read_text().strip() or None
        except OSError:
            continue
    return None


def gpu_names() -> list[str]:
    """The GPUs' marketing names as rocminfo gives them (empty without rocminfo)."""
    out = _run(["rocminfo"]) or ""
    names = []
    agent_is_gpu = False
    for line in out.splitlines():
        text = line.strip()
        if text.startswith("Name:") and "gfx" in text:
            agent_is_gpu = True
        elif text.startswith("Marketing Name:") and agent_is_gpu:
            names.append(text.split(":", 1)[1].strip())
            agent_is_gpu = False
    return names


def settings() -> dict[str, str]:
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(SETTING_PREFIXES) or k in SETTING_NAMES
    }


def record(model: str, tp: int, argv: list[str]) -> dict[str, Any]:
    return {
        "recorded": now(),
        "command": argv,
        "host": platform.node(),
        "python": platform.python_version(),
        "gpus": gpu_names(),
        "rocm": rocm_version(),
        "vllm": _version("vllm"),
        "aiter": _version("amd-aiter"),
        "torch": _version("torch"),
        "lm_eval": _version("lm_eval") or _version("lm-eval"),
        "plugin": _version("vllm-rocm-asm-decode"),
        "git_revision": git_revision(),
        "model": model,
        "tp": tp,
        "settings": settings(),
        "executable": sys.executable,
    }


#: What a resumed run's environment may not change without the report saying so.
COMPARED = ("gpus", "rocm", "vllm", "aiter", "torch", "plugin", "git_revision", "settings")


def changes(environments: list[dict[str, Any]]) -> list[str]:
    """What differs between the first invocation and each later one, in words."""
    if len(environments) < 2:
        return []
    first = environments[0]
    said = []
    for env in environments[1:]:
        for key in COMPARED:
            if env.get(key) != first.get(key):
                said.append(
                    f"invocation {env.get('invocation')}: {key} {first.get(key)!r} -> "
                    f"{env.get(key)!r}"
                )
    return said
