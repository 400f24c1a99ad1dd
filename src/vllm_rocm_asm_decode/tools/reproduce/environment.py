"""The environment a reproduction ran in, recorded at each invocation without importing
torch or vLLM here: the ``--vllm`` executable's version is what it answers to
``--version`` (``lm_eval``'s is in its results files, :mod:`.gsm8k`); ``doctor``'s step
adds what only an import can tell: the vLLM Python imports, AITER's build, the GPU's
architecture and compute units."""

from __future__ import annotations

import os
import platform
import re
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


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = 10) -> str | None:
    """stdout of a short command, or None when it is missing, fails or hangs."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


#: A version as tools print one: 0.33.0, 0.33.1.dev4+g1234abc, 0.33.0+rocm722, v0.4.9;
#: ASCII digits only ('٠.٣٣' is none).
VERSION = re.compile(r"v?\d+(\.\d+)+[0-9A-Za-z.+-]*", re.ASCII)
#: How long ``vllm --version`` may take: vLLM's command line imports its modules (and
#: torch) before it reads its arguments: seconds, more on a cold file cache.
VERSION_SECONDS = 120.0


def is_version(text: object) -> bool:
    return isinstance(text, str) and len(text) <= 64 and VERSION.fullmatch(text) is not None


def executable_path(executable: str) -> str:
    """``executable`` as the run finds it: its path on PATH, or as given."""
    return os.path.abspath(shutil.which(executable) or executable)


def executable_version(executable: str) -> str | None:
    """What ``executable --version`` answers (its last line of stdout, after any log
    lines), when that is a version; None when it fails, hangs or answers no version.
    vLLM's command line answers so; lm_eval's has no --version (its results file says
    its version: :func:`gsm8k.parse`)."""
    out = _run([executable, "--version"], timeout=VERSION_SECONDS) or ""
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return lines[-1] if lines and is_version(lines[-1]) else None


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


def record(
    model: str, tp: int, argv: list[str], vllm: str = "vllm", lm_eval: str = "lm_eval"
) -> dict[str, Any]:
    """This invocation's environment. ``vllm`` and ``lm_eval``: the executables its
    servers and GSM8K run (``--vllm``, ``--lm-eval``); ``vllm``, ``aiter``, ``torch``:
    this Python's packages, which the doctor and kernel steps import by default."""
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
        "vllm_executable": executable_path(vllm),
        "vllm_executable_version": executable_version(vllm),
        "lm_eval_executable": executable_path(lm_eval),
        "plugin": _version("vllm-rocm-asm-decode"),
        "git_revision": git_revision(),
        "model": model,
        "tp": tp,
        "settings": settings(),
        "executable": sys.executable,
    }


#: What a resumed run's environment may not change without the report saying so.
COMPARED = (
    "gpus",
    "rocm",
    "vllm",
    "vllm_executable",
    "vllm_executable_version",
    "lm_eval_executable",
    "aiter",
    "torch",
    "plugin",
    "git_revision",
    "settings",
)
#: Keys whose None means "not learned" (``vllm --version`` failed or hung), not a value.
UNKNOWN_WHEN_NONE = ("vllm_executable_version",)


def changes(environments: list[dict[str, Any]]) -> list[str]:
    """What differs, in words, between the first invocation that recorded a key and each
    later one that did: a record written before the key existed, or a None of
    :data:`UNKNOWN_WHEN_NONE`, says nothing of it."""
    first: dict[str, Any] = {}
    said = []
    for env in environments:
        for key in COMPARED:
            if key not in env or (key in UNKNOWN_WHEN_NONE and env[key] is None):
                continue
            if key not in first:
                first[key] = env[key]
            elif env[key] != first[key]:
                said.append(
                    f"invocation {env.get('invocation')}: {key} {first[key]!r} -> {env[key]!r}"
                )
    return said
