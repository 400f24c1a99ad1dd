"""Write the asm decode into a vLLM 0.33.x source tree: the in-tree form of the plugin,
as a stack of three pull requests.

``vllm-rocm-asm-decode upstream DIR [--stage N]`` writes stages 1..N (default 1) into DIR
(a vLLM git checkout, or a copy of an installed vLLM's Python files):

1. the asm decode inside ``vllm/v1/attention/backends/rocm_attn.py`` (the rule, the step
   decision and the call ``pa_fwd_asm(..., high_precision=2)``, wired into the metadata,
   the builder and ``forward``), a ``high_precision`` argument for
   ``rocm_aiter_ops.pa_fwd_asm`` (AITER's default, 1, unless given), and the kernel tests
   ``tests/kernels/attention/test_rocm_attn_aiter_asm_decode.py``;
2. mixed prefill+decode steps: their decodes on the asm kernel, their prefills through a
   prefill-only option of ``chunked_prefill_paged_decode``;
3. a proposal (RFC), not a PR to merge as written: scale tables for ``ROCM_AITER_FA``
   and ``ROCM_ATTN`` alike in a new module ``vllm/v1/attention/backends/
   asm_scale_tables.py`` (one chunk of device memory mapped over each table, tables of
   their own for layers with checkpoint scales, refilled in place after a weight
   reload), in place of ``AsmKvScaleTables``.

After writing, it prints the pull-request text of stage N (the same texts are in the
project's ``docs/upstream.md``).

No copy of vLLM's files is stored here: each edit finds its place by name (a class, a
``def``, a statement) in the file as it is, and stops with one line naming the anchor
when it has moved. An edit already made is left alone, so a second run changes nothing;
a file carrying another version of an edit, or part of a stage, is refused, and so is a
file of the user's where a new file goes. Writing is all or nothing, Ctrl-C included;
a file's CRLF line endings are kept; runs on one tree take turns. Trees other than vLLM
0.33.x are refused, and so is an installed ``site-packages``, through symlinks too.
``--check`` computes the change as a run does and prints what it would change.
Everything is written before anything is printed.
Exit status: 0 written, or nothing to do; 1 ``--check`` found changes, or stdout could
not be written (a line on stderr says so; the tree is written first); 2 an error; 130
interrupted (the message says whether the tree was written); 141 the reader of stdout
went away.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import errno
import fcntl
import functools
import itertools
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType

from ...vllm_version_file import version_in
from .. import choices
from ..stopping import stopped_by
from .source import SPDX, Source, UpstreamError, departure
from .stages import (
    AITER_OPS,
    ATTENTION_CONFIG,
    KERNEL_TEST,
    NEW_FILES,
    PAGED_DECODE,
    ROCM_AITER_FA,
    ROCM_ATTN,
    SCALE_TABLES,
    STAGES,
    privatized,
)

__all__ = [
    "AITER_OPS",
    "ATTENTION_CONFIG",
    "KERNEL_TEST",
    "PAGED_DECODE",
    "ROCM_AITER_FA",
    "ROCM_ATTN",
    "SCALE_TABLES",
    "STAGES",
    "UpstreamError",
]

PROG = "vllm-rocm-asm-decode upstream"
#: The exit status of a command whose stdout reader went away (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141
SUPPORTED = (0, 33)
#: The stage written when ``--stage`` is not given, and the last one there is.
DEFAULT_STAGE = 1
LAST_STAGE = max(STAGES)

_TEST_SOURCE = Path(__file__).resolve().parent / "in_tree" / "kernel_test.py"


def written(stage: int) -> tuple[Path, ...]:
    """Every file stages 1..``stage`` write (edited ones and new ones)."""
    edited = dict.fromkeys(rel for n in range(1, stage + 1) for rel in STAGES[n])
    new = dict.fromkeys(rel for n in range(1, stage + 1) for rel in NEW_FILES.get(n, {}))
    return (*edited, *new, KERNEL_TEST)


# --------------------------------------------------------------------------------------
# The tree


#: The largest file read from a tree: vLLM's largest source files are a few hundred KiB,
#: and a larger one (a link to /dev/zero, a sparse file) would only fill memory.
MAX_FILE_BYTES = 16 * 2**20
#: What to do about a file of the tree that cannot be read: vLLM's own file back, where
#: the change edits it; out of the way, where the change writes its own.
_RESTORE = (
    "; put vLLM 0.33's own file back (git checkout -- the file, in a git tree); nothing written"
)
_MOVE_ASIDE = "; move it aside (a run writes its own); nothing written"
_REGENERATE = "; vLLM's build writes its own there (pip install -e .); nothing written"


def _read_bytes(path: Path, fix: str) -> bytes:
    """A regular file's bytes. A FIFO (whose read would wait for a writer, for ever), a
    device, a socket, a dangling symlink, a file past :data:`MAX_FILE_BYTES` and an
    unreadable one are one-line errors naming ``path``, ending with ``fix``: what to do
    about it."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            why = _not_regular(path) or f"{path} is not a regular file"
            raise UpstreamError(why + fix)
        # O_NONBLOCK: a FIFO put in its place meanwhile opens at once (and is refused).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if odd := _not_regular(path):
            raise UpstreamError(odd + fix) from None
        raise UpstreamError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "rb") as f:
            there = os.fstat(f.fileno())
            if not stat.S_ISREG(there.st_mode):
                why = f"{path} is not a regular file (a FIFO, a device or a socket)"
                raise UpstreamError(why + fix)
            data = b"" if there.st_size > MAX_FILE_BYTES else f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise UpstreamError(f"cannot read {path}: {exc.strerror or exc}") from None
    if there.st_size > MAX_FILE_BYTES or len(data) > MAX_FILE_BYTES:
        raise UpstreamError(
            f"{path} is larger than {MAX_FILE_BYTES // 2**20} MiB, far more than any of "
            "vLLM's source files; not vLLM's file" + fix
        )
    return data


def _decode(path: Path, data: bytes, fix: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UpstreamError(f"{path} is not UTF-8 text (byte {exc.start})" + fix) from None


def _read(path: Path, fix: str) -> str:
    """A file's text, its line endings read as LF (:func:`_read_bytes` says which files
    are refused, and ``fix`` what to do; a non-UTF-8 one is refused too)."""
    text = _decode(path, _read_bytes(path, fix), fix)
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _read_lf(path: Path, fix: str) -> tuple[str, str]:
    """A file's text with LF line endings, and its own text as it is on disk (a file
    with CRLF endings keeps them: :func:`_as_file`). Mixed endings are refused; so is
    what :func:`_read_bytes` refuses, with ``fix``."""
    raw = _decode(path, _read_bytes(path, fix), fix)
    _refuse_a_byte_order_mark(path, raw, "git checkout -- the file, in a git tree")
    if "\r" not in raw:
        return raw, raw
    if raw.count("\r\n") == raw.count("\r") == raw.count("\n"):
        return raw.replace("\r\n", "\n"), raw
    raise UpstreamError(
        f"{path} mixes line endings (CRLF with LF or a lone CR); give it one kind "
        "(dos2unix, or git checkout -- the file in a git tree) and run again; nothing "
        "written"
    )


def _refuse_a_byte_order_mark(path: Path, text: str, restore: str) -> None:
    if text.startswith("\ufeff"):
        raise UpstreamError(
            f"{path} starts with a byte-order mark (U+FEFF), which vLLM's files do not; "
            f"remove it ({restore}) and run again; nothing written"
        )


def _as_file(text: str, raw: str) -> str:
    """``text`` (LF) with the line endings of the file whose own text is ``raw``."""
    return text.replace("\n", "\r\n") if "\r\n" in raw else text


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _committed_base(root: Path, rel: Path) -> tuple[str, str] | None:
    """Where ``rel`` is as committed (a branch that carries a stage, written by an older
    ``upstream`` or by hand), the revision to check vLLM's own file out of, with why:
    the tree's release tag, or (without one) the commit before the change. None where
    the file differs from HEAD, so that ``git checkout --`` restores it."""
    if _git(root, "diff", "--quiet", "HEAD", "--", str(rel)) is None:
        return None  # it differs from HEAD (or there is no HEAD)
    if tag := _git(root, "describe", "--tags", "--abbrev=0"):
        return shlex.quote(tag), ", vLLM's release tag"
    return "<the commit before the change>", "; it is committed"


def tree_version(root: Path) -> tuple[str, str]:
    """The vLLM version of the tree at ``root`` and where it was read: the tag ``git
    describe`` finds when ``root`` is the top of a git checkout (a checkout's
    ``_version.py`` may be left from an older build), else ``vllm/_version.py`` (an
    installed package's, or a built checkout's)."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is not None and Path(top).resolve() == root.resolve():
        tag = _git(root, "describe", "--tags", "--match", "v[0-9]*")
        if tag is not None:
            return tag.removeprefix("v"), "its git tag"
    version_file = root / "vllm" / "_version.py"
    if version_file.is_dir():
        raise UpstreamError(f"{version_file} is a directory, not vLLM's version file")
    if not os.path.lexists(version_file):  # a dangling symlink is there: _read names it
        raise UpstreamError(
            f"cannot tell which vLLM {root} is: no vllm/_version.py and no v* git tag"
        )
    text = _read(version_file, _REGENERATE)
    # Generated (setuptools-scm) and ignored by git: no checkout restores it.
    _refuse_a_byte_order_mark(version_file, text, "delete the first character")
    if (found := version_in(text)) is not None:
        return found, "vllm/_version.py"
    said = re.findall(r"^[ \t]*(?:__version__|version)\b.*$", text, re.MULTILINE)
    # The line that assigns the version, not its annotation (``version: str``) above it.
    line = next((s for s in said if "=" in s), said[0] if said else None)
    raise UpstreamError(
        f"{version_file} gives no version string"
        + (f" ({line.strip()!r}; vLLM writes __version__ = '0.33.0')" if line else "")
    )


def _not_a_tree(root: Path, rel: Path) -> str:
    """Why ``root`` is not a tree this change can be written into, missing ``rel``."""
    here = root / rel
    if here.is_dir():
        return f"{here} is a directory, not vLLM's file"
    if odd := _not_regular(here):
        return odd + _RESTORE
    inside = Path(*rel.parts[1:])
    if (root / inside).is_file() and rel.parts[0] == "vllm":
        if any(root.resolve().parent.glob("vllm-*.dist-info")):
            return (
                f"{root} is an installed vLLM package; write into a git checkout, or into "
                "a copy of it elsewhere (the directory that holds the copy's vllm/)"
            )
        return (
            f"{root} is the vllm package itself; give the directory that holds it "
            f"({root.resolve().parent})"
        )
    return f"{root} is not a vLLM source tree (no {rel})"


def _not_regular(path: Path) -> str | None:
    """Why ``path``, there (a FIFO, a device, a socket, a dangling symlink), is not a
    regular file to read or replace; None when it is one or is not there at all."""
    if path.is_file() or not (path.is_symlink() or path.exists()):
        return None
    if path.is_symlink() and not path.exists():
        return f"{path} is a dangling symlink (to {os.readlink(path)}), not a file"
    return f"{path} is not a regular file (a FIFO, a device or a socket)"


def _installed_under(root: Path, rels: tuple[Path, ...]) -> Path | None:
    """The ``vllm-*.dist-info`` of an installed vLLM that writing ``rels`` into ``root``
    would reach through a symlink (``root`` itself, ``vllm/``, or any directory on the
    way), else None: every directory a file goes into is resolved, and each of its
    ancestors looked at."""
    looked: set[Path] = set()
    for rel in rels:
        directory = next(p for p in (root / rel).parents if p.exists()).resolve()
        for home in [directory, *directory.parents]:
            if home in looked:
                continue
            looked.add(home)
            if found := sorted(home.glob("vllm-*.dist-info")):
                return found[0]
    return None


def check_tree(root: Path, stage: int = DEFAULT_STAGE) -> str:
    """The tree's vLLM version; raises :class:`UpstreamError` unless it is 0.33.x (and
    none of the files stages 1..``stage`` write is in an installed vLLM, through a
    symlink or not)."""
    try:
        if not root.exists():
            if root.is_symlink():
                raise UpstreamError(
                    f"{root} is a dangling symlink (to {os.readlink(root)}), not a directory"
                )
            raise UpstreamError(f"{root} does not exist")
        if not root.is_dir():
            raise UpstreamError(f"{root} is not a directory")
        if not (root / ROCM_ATTN).is_file():
            raise UpstreamError(_not_a_tree(root, ROCM_ATTN))
        installed = _installed_under(root, written(stage))
    except OSError as exc:
        raise UpstreamError(f"cannot read {exc.filename or root}: {exc.strerror}") from None
    if installed:
        raise UpstreamError(
            f"{root} reaches an installed vLLM ({installed}); write into a git "
            "checkout, or into a copy of its vllm/ directory elsewhere"
        )
    version, source = tree_version(root)
    # ASCII digits (int() reads others too), then a release part or the end: 0.33.0,
    # 0.33.1.dev5+g1, 0.33rc1, 0.33.0+rocm722; not 0.33.abc. "v" as a git tag has it.
    numbers = re.match(r"v?(\d+)\.(\d+)(?:\.\d|\.?(?:rc|dev|post)|\+|$)", version, re.ASCII)
    if numbers is None or (int(numbers[1]), int(numbers[2])) != SUPPORTED:
        raise UpstreamError(
            f"{root} is vLLM {version} (from {source}); this change is written for vLLM 0.33.x "
            "only: write it into a checkout of v0.33.0 (git checkout v0.33.0), or a copy of "
            "vLLM 0.33's files"
        )
    return version


# --------------------------------------------------------------------------------------
# The change as a whole


#: Where the names the kernel tests import from the runtime are in vLLM.
_TEST_IMPORTS = {"vllm_rocm_asm_decode.core": "vllm.v1.attention.backends.rocm_attn"}


#: Stage 1's test of its cap of four scale tables (beside the KV budget), each text with
#: what stage 3, whose aliased tables take no memory of their own, writes in its place.
_CAP_TEST = (
    (
        "    for layers in (3, 4):  # 3 K tables and a V, each layer's own; 4 and a V: none\n"
        "        scales = [(2.0**i, 3.0) for i in range(layers)]  # rising: a misfiled one shows\n"
        "        many = Model(tmp_path, 16, 8, 3, torch.bfloat16, scales)\n"
        "        bound = many.builder.build(0, step).asm_scales.items()  # the budget: 4 tables\n"
        "        held = {x: (k.unique().item(), v.unique().item()) for x, (k, v) in bound}\n"
        "        own = {x: (x._k_scale_float, x._v_scale_float) for x in many.layers}\n"
        "        assert held == (own if layers == 3 else {})\n",
        "    scales = [(2.0**i, 3.0) for i in range(4)]  # 5 tables: aliased, each layer's own\n"
        "    many = Model(tmp_path, 16, 8, 3, torch.bfloat16, scales)\n"
        "    bound = many.builder.build(0, step).asm_scales.items()\n"
        "    held = {x: (k.unique().item(), v.unique().item()) for x, (k, v) in bound}\n"
        "    assert held == {x: (x._k_scale_float, x._v_scale_float) for x in many.layers}\n",
    ),
    ("    builder, more than 4 tables. An output", "    builder. An output"),
)


def render_kernel_test(source: str | None = None, stage: int = DEFAULT_STAGE) -> str:
    """The kernel tests as vLLM's test file after stage ``stage`` (stage 1 writes it;
    stage 3 changes its test of the cap it lifts, :data:`_CAP_TEST`): its SPDX header,
    the runtime's names imported from where stage 1 puts them."""
    if source is None:
        source = _TEST_SOURCE.read_text(encoding="utf-8")
    src = Source(KERNEL_TEST, source)
    for capped, lifted in _CAP_TEST if stage >= 3 else ():
        if src.text.count(capped) != 1:
            raise UpstreamError(f"{KERNEL_TEST}: stage 1's test of the table cap moved")
        src.text = src.text.replace(capped, lifted)
    for node in reversed(src.top_imports()):
        module = getattr(node, "module", None)
        if module in _TEST_IMPORTS:
            lines = src.lines
            del lines[node.lineno - 1 : node.end_lineno or node.lineno]
            src.text = "\n".join(lines)
            for alias in node.names:
                src.ensure_import(_TEST_IMPORTS[module], privatized(alias.name))
    src.text = privatized(src.text)  # the names stage 1 writes are private in vLLM
    return SPDX + src.text


def changed_files(root: Path, stage: int = DEFAULT_STAGE) -> dict[Path, str]:
    """Every file stages 1..``stage`` write, by path relative to ``root``, with its new
    text."""
    return {rel: new for rel, (_, new) in _plan(root, stage).items()}


def _plan(root: Path, stage: int) -> dict[Path, tuple[str | None, str]]:
    """Every file stages 1..``stage`` write: its text on disk now (None when it is not
    there) and its new text, each with the file's own line endings.

    Refused, naming the file: one that carries part of a stage (some of its edits there,
    others not: a hand edit, or a run that was stopped) and one of the user's where a new
    file goes, unless it is exactly what this run writes."""
    sources: dict[Path, tuple[Source, str]] = {}
    git = _git(root, "rev-parse", "--is-inside-work-tree") == "true"
    for n in range(1, stage + 1):
        for rel, edit in STAGES[n].items():
            if rel not in sources:
                path = root / rel
                if not path.is_file():
                    raise UpstreamError(_not_a_tree(root, rel))
                text, raw = _read_lf(path, _RESTORE)
                # git's checkout restores only a file git tracks (a fresh `git init`: none)
                listed = _git(root, "ls-files", "--error-unmatch", "--", str(rel)) if git else None
                committed = functools.partial(_committed_base, root, rel)  # on refusal
                sources[rel] = (Source(rel, text, root, listed is not None, committed), raw)
            src = sources[rel][0]
            before = src.text
            src.begin()
            edit(src)
            _refuse_part_of_a_stage(src, n, before)
    files = {rel: (raw, _as_file(src.text, raw)) for rel, (src, raw) in sources.items()}
    new_files = {
        rel: (n, make) for n in range(1, stage + 1) for rel, make in NEW_FILES.get(n, {}).items()
    }
    new_files[KERNEL_TEST] = (1, lambda _: render_kernel_test(stage=stage))
    for rel, (n, make) in new_files.items():
        text, path = make(None), root / rel
        if not path.is_file():
            files[rel] = (None, text)
            continue
        there, raw = _read_lf(path, _MOVE_ASIDE)
        if rel == KERNEL_TEST and there != text:  # another stage's? It moves up, never down
            other = next(
                (m for m in range(1, LAST_STAGE + 1) if render_kernel_test(stage=m) == there), None
            )
            if other is not None:
                files[rel] = (raw, _as_file(text, raw) if other < stage else raw)
                continue
        if there != text:
            raise UpstreamError(
                f"{path} is there already and is not the file stage {n} writes "
                f"({_first_difference(text, there)}); move it aside (a run writes its own) and "
                "run again; nothing written"
            )
        files[rel] = (raw, raw)
    return files


def _first_difference(want: str, there: str) -> str:
    """The first line where the file ``there`` is not ``want``, by number."""
    pairs = itertools.zip_longest(want.splitlines(), there.splitlines(), fillvalue=None)
    first = next(((n, p) for n, p in enumerate(pairs, 1) if p[0] != p[1]), None)
    if first is None:  # the same lines: the end of the file differs
        return "its last line's newline"
    n, (wanted, found) = first
    if found is None:
        return f"it ends at line {n - 1}, where it writes on"
    if wanted is None:
        return f"line {n} reads {found!r}, past the end of what it writes"
    return f"line {n} reads {found!r} where it writes {wanted!r}"


def _refuse_part_of_a_stage(src: Source, stage: int, before: str) -> None:
    """Refuse a file that carried part of stage ``stage`` before its edits ran: some of
    them found their text in place while others added theirs, or an edit added a name
    the file already defined (a line of the stage left over from a hand edit)."""
    again = f"start from vLLM's own file ({src.restore}) and run again"
    if src.found and src.added:
        missing = ", ".join(dict.fromkeys(src.added))
        block = src.added_blocks.get(src.added[0])  # an import or keyword names itself
        raise UpstreamError(
            f"{src.path}: carries part of stage {stage}: it lacks the edit of {missing} "
            + (f"({departure(block, src.original)}) " if block else "")
            + f"and has the rest; {again}"
        )
    if src.added:
        old, new = _definitions(Source(src.path, before)), _definitions(src)
        twice = [name for name, count in new.items() if count > max(1, old[name])]
        if twice:
            raise UpstreamError(
                f"{src.path}: carries part of stage {stage}: it defines {twice[0]} already, "
                f"which stage {stage} adds; {again}"
            )


def _definitions(src: Source) -> Counter[str]:
    """How often each class, ``def`` and annotated name is defined directly in the
    module, a class or a ``def``, by qualified name (``Class.field``)."""
    found: Counter[str] = Counter()

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                found[prefix + node.name] += 1
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.AnnAssign):
                found[prefix + ast.unparse(node.target)] += 1

    visit(src.tree().body, "")
    return found


@dataclass(frozen=True)
class FileChange:
    path: Path
    added: int
    removed: int
    new: bool


def diff_counts(old: str, new: str) -> tuple[int, int]:
    """Lines added and removed by a shortest edit script between the two texts, found by
    Myers' O(ND) algorithm as ``git diff --stat`` counts them (difflib's matcher, which
    is not minimal, counts a line or two more)."""
    a, b = old.splitlines(), new.splitlines()
    n, m = len(a), len(b)
    furthest = {1: 0}  # diagonal k = x - y: the furthest x reached with d edits
    for d in range(n + m + 1):
        for k in range(-d, d + 1, 2):
            down = k == -d or (k != d and furthest[k - 1] < furthest[k + 1])
            x = furthest[k + 1] if down else furthest[k - 1] + 1
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x, y = x + 1, y + 1
            furthest[k] = x
            if x >= n and y >= m:
                common = (n + m - d) // 2
                return m - common, n - common
    raise AssertionError("unreachable: n + m edits always suffice")


def apply(
    root: Path, stage: int = DEFAULT_STAGE, written: list[FileChange] | None = None
) -> list[FileChange]:
    """Write stages 1..``stage`` into ``root``; returns what changed (nothing on a
    second run). ``written``, when given, receives the changes the moment every file is
    in place, so that a caller interrupted after that knows the tree was written.

    All or nothing: every new text is computed, then staged next to its file, then moved
    into place; a file that cannot be written, or Ctrl-C before the files are moved,
    leaves every file as it was. Ctrl-C while they are moved (or put back) takes effect
    once that is done. A symlinked file is replaced by a file of its own, never written
    through.
    """
    check_tree(root, stage)
    with _one_run_at_a_time(root):
        return _apply(root, stage, written)


def _changes(files: dict[Path, tuple[str | None, str]]) -> list[FileChange]:
    """The files of a plan whose text changes, with their line counts."""
    return [
        FileChange(rel, *diff_counts(old or "", text), new=old is None)
        for rel, (old, text) in files.items()
        if old != text
    ]


def _apply(root: Path, stage: int, written: list[FileChange] | None) -> list[FileChange]:
    files = _plan(root, stage)
    for rel in files:
        _check_way(root, rel)
    changes = _changes(files)
    staged: list[tuple[Path, Path, str | None]] = []  # (temp, path, old text)
    made: list[Path] = []  # directories this run created
    done = 0
    settled = False  # every file in place, or put back: nothing more to undo
    path = root

    def undo() -> None:
        nonlocal settled
        if not settled:
            settled = True
            with _HeldInterrupt():  # a second Ctrl-C does not cut it short
                _undo(staged, done, made)

    try:
        for rel, (old, text) in files.items():
            path = root / rel
            if old == text:
                continue
            made += _make_parents(path)
            # A name of this run's own: runs on one tree at once never share a file.
            fd, name = tempfile.mkstemp(
                prefix=f".{path.name}.", suffix=".upstream~", dir=path.parent
            )
            os.close(fd)
            temp = Path(name)
            staged.append((temp, path, old))
            temp.write_bytes(text.encode("utf-8"))
            if old is not None:
                shutil.copymode(path, temp)
            else:  # mkstemp's 0600 would make the new file private
                os.chmod(temp, choices.new_file_mode())
        with _HeldInterrupt():
            try:
                for temp, path, _ in staged:
                    os.replace(temp, path)
                    done += 1
            except BaseException:
                undo()  # before Ctrl-C can take effect
                raise
            settled = True  # a Ctrl-C held back until here leaves the tree written
            if written is not None:
                written.extend(changes)
    except OSError as exc:
        undo()
        raise UpstreamError(
            f"cannot write {path}: {exc.strerror or exc}; no file was changed"
        ) from None
    except BaseException:  # Ctrl-C while staging: the staged files and directories go
        undo()
        raise
    return changes


#: How long a run waits for another run on the same tree to finish (runs take about a
#: second) before it is refused.
LOCK_WAIT_S = 30.0


@contextlib.contextmanager
def _one_run_at_a_time(root: Path, reading: bool = False) -> Iterator[None]:
    """Hold a lock on the directory ``root`` (``flock``: released when the process
    ends, however it ends) for one run's writing, or shared for a ``--check``'s reading,
    so that runs on one tree take turns instead of interleaving their files. A run waits
    up to :data:`LOCK_WAIT_S` for another to finish, then is refused. Where the file
    system has no such locks, runs go unlocked."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        kind = (fcntl.LOCK_SH if reading else fcntl.LOCK_EX) | fcntl.LOCK_NB
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, kind)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise UpstreamError(
                        f"another upstream run has been writing {root} for "
                        f"{LOCK_WAIT_S:g} s; run again once it is done; nothing written"
                    ) from None
                time.sleep(0.05)
            except OSError:
                break
        yield
    finally:
        os.close(fd)


class _HeldInterrupt:
    """Ctrl-C held back for the block (files moved into place, or put back): a SIGINT
    meanwhile is delivered again, as it came, once the block is over, unless the block
    failed. Outside the main thread, where no handler can be set, nothing is held."""

    def __init__(self) -> None:
        self.previous: signal.Handlers | object | None = None
        self.held = False

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        self.held = True

    def __enter__(self) -> _HeldInterrupt:
        try:
            previous = signal.getsignal(signal.SIGINT)
            if previous not in (signal.SIG_IGN, None):
                signal.signal(signal.SIGINT, self._hold)
                self.previous = previous
        except ValueError:  # not the main thread
            pass
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.previous is None:
            return
        signal.signal(signal.SIGINT, self.previous)  # type: ignore[arg-type]
        if self.held and kind is None:
            signal.raise_signal(signal.SIGINT)


def _check_way(root: Path, rel: Path) -> None:
    """What the change writes is not in the way of something else: its directories are
    directories (or missing) and its files files (or missing)."""
    parents = [p for p in reversed(rel.parents) if p != Path(".")]
    for part, should_be_dir in [*((p, True) for p in parents), (rel, False)]:
        here = root / part
        if here.exists() and here.is_dir() != should_be_dir:
            kind = "a directory" if should_be_dir else "a file"
            raise UpstreamError(f"{here} is in the way (it should be {kind}); nothing written")
    if odd := _not_regular(root / rel):
        if any(rel in edited for edited in STAGES.values()):  # moved aside, it is missing
            raise UpstreamError(f"{odd}, where this change edits vLLM's file" + _RESTORE)
        raise UpstreamError(f"{odd}, where this change writes one" + _MOVE_ASIDE)


def _make_parents(path: Path) -> list[Path]:
    """Create ``path``'s missing parent directories; returns them, outermost first."""
    made = []
    for directory in [p for p in reversed(path.parents) if not p.exists()]:
        try:
            directory.mkdir()
        except FileExistsError:  # another run made it meanwhile: not this run's
            continue
        made.append(directory)
    return made


def _undo(staged: list[tuple[Path, Path, str | None]], done: int, made: list[Path]) -> None:
    """Put back what a failed run replaced, drop its staged files and new directories."""
    for _, path, old in staged[:done]:
        try:
            if old is None:
                path.unlink()
            else:
                path.write_bytes(old.encode("utf-8"))
        except OSError:
            pass  # best effort: the error already says which file failed
    for temp, _, _ in staged:
        try:
            temp.unlink(missing_ok=True)
        except OSError:
            pass
    for directory in reversed(made):
        try:
            directory.rmdir()
        except OSError:
            pass


def check(root: Path, stage: int = DEFAULT_STAGE) -> list[FileChange]:
    """What a run of stages 1..``stage`` would change in ``root``, computed as the run
    computes it (its refusals name the tree's own files and fixes), nothing written."""
    check_tree(root, stage)
    for rel in written(stage):
        _check_way(root, rel)
    with _one_run_at_a_time(root, reading=True):
        changes = _changes(_plan(root, stage))
    for change in changes:
        if why := _unwritable(root / change.path):
            raise UpstreamError(f"cannot write {root / change.path}: {why}; a real run would fail")
    return changes


def _unwritable(path: Path) -> str | None:
    """Why a run could not put a file at ``path`` (it writes a file beside it and
    renames it over), found by doing so in the nearest directory that exists; None
    when it can."""
    directory = next(p for p in path.parents if p.exists())
    try:
        fd, name = tempfile.mkstemp(prefix=".upstream-probe-", dir=directory)
    except OSError as exc:
        return str(exc.strerror or exc)
    os.close(fd)
    try:
        os.unlink(name)
    except OSError as exc:  # an append-only directory (chattr +a): a run's rename fails too
        return f"{exc.strerror or exc} (its probe {name} could not be removed)"
    return _not_replaceable(path) if os.path.lexists(path) else None


#: ``FS_IOC_GETFLAGS`` (linux/fs.h), and its ``FS_IMMUTABLE_FL | FS_APPEND_FL``.
_GETFLAGS, _IMMUTABLE_OR_APPEND = 0x80086601, 0x10 | 0x20


def _not_replaceable(path: Path) -> str | None:
    """Why renaming a file over ``path`` fails where its directory takes new files:
    rename(2) gives EPERM for an immutable or append-only file (``chattr +i``/``+a``),
    and in a sticky directory (``chmod +t``) for a file neither the user's nor the
    directory's, unless root. None when neither holds, or where Linux's flags cannot be
    read (the run then says what failed, with nothing changed)."""
    flags = bytearray(8)
    try:  # the name's own inode: a run replaces a symlink, never its target
        file, directory = path.lstat(), path.parent.stat()
        fd = None if stat.S_ISLNK(file.st_mode) else os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    if fd is not None:
        try:
            fcntl.ioctl(fd, _GETFLAGS, flags)
        except OSError:  # a file system without such flags (tmpfs), or not Linux
            pass
        finally:
            os.close(fd)
    sticky = directory.st_mode & stat.S_ISVTX
    if int.from_bytes(flags[:4], sys.byteorder) & _IMMUTABLE_OR_APPEND or (
        sticky and os.geteuid() not in (0, file.st_uid, directory.st_uid)
    ):
        return os.strerror(errno.EPERM)
    return None


def diff_stat(changes: list[FileChange]) -> str:
    """The changes as a diff stat: lines added and removed per file, bars scaled to the
    largest."""
    width = max(len(str(c.path)) for c in changes)
    most = max(c.added + c.removed for c in changes)
    scale = min(1.0, 40 / most)
    rows = []
    for c in changes:
        plus, minus = round(c.added * scale), round(c.removed * scale)
        bar = "+" * (plus or bool(c.added)) + "-" * (minus or bool(c.removed))
        new = " (new)" if c.new else ""
        rows.append(f" {c.path!s:<{width}} | {c.added + c.removed:>5} {bar}{new}")
    added = sum(c.added for c in changes)
    removed = sum(c.removed for c in changes)
    files = "file" if len(changes) == 1 else "files"
    insertions = "insertion" if added == 1 else "insertions"
    deletions = "deletion" if removed == 1 else "deletions"
    rows.append(
        f" {len(changes)} {files} changed, {added} {insertions}(+), {removed} {deletions}(-)"
    )
    return "\n".join(rows)


def pr_text(stage: int) -> str:
    """The pull-request text of one stage: its title line, then its description."""
    return (Path(__file__).with_name("pr") / f"stage-{stage}.md").read_text(encoding="utf-8")


def main(directory: str, dry_run: bool, stage: int = DEFAULT_STAGE) -> int:
    """0: written, or nothing to do; 1: ``--check`` found changes to make; 2: error;
    130: interrupted; 141: the reader of stdout went away (quietly, once the tree is
    written: it is written before anything is printed)."""
    _calm_exit()
    root = Path(directory)
    written: list[FileChange] = []
    which = "stage 1" if stage == 1 else f"stages 1-{stage}"
    try:
        try:
            if stage not in STAGES:
                raise UpstreamError(f"--stage {stage}: choose 1 to {LAST_STAGE}")
            changes = check(root, stage) if dry_run else apply(root, stage, written)
        except UpstreamError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
        status = 1 if dry_run and changes else 0
        try:
            _report(root, stage, which, changes, dry_run)
            sys.stdout.flush()
        except BrokenPipeError:  # `upstream DIR | head -1`: what was written stays
            _stdout_to_devnull()
            return EXIT_BROKEN_PIPE
        return status
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM from the command line
        if written:
            files = "file" if len(written) == 1 else "files"
            said = f"{root} was written: it carries {which} ({len(written)} {files} changed)"
        else:
            said = f"nothing was written to {root}"
        print(
            ("\n" if sys.stderr.isatty() else "") + f"{PROG}: {stopped_by()}; {said}",
            file=sys.stderr,
        )
        return 130


@functools.cache
def _calm_exit() -> None:
    """Ignore Ctrl-C once the process exits: what it says is said by then, and Python,
    tearing down its modules, would otherwise die of the signal without a word."""
    atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)


def _report(root: Path, stage: int, which: str, changes: list[FileChange], dry_run: bool) -> None:
    if not changes:
        print(f"{root}: already carries {which} of this change; nothing to do")
        return
    if dry_run:
        print(f"{root}: would change (nothing written):")
        print(diff_stat(changes))
        return
    print(f"{root}: changed:")
    print(diff_stat(changes))
    if (top := _git(root, "rev-parse", "--show-toplevel")) is not None:
        # From the checkout's top: git diff's names are relative to it, as pre-commit's.
        print(
            f"next: cd {shlex.quote(top)} && git add -A && "
            "pre-commit run --files $(git diff --cached --name-only)"
        )
    print(f"\n--- pull-request text, stage {stage} ---")
    print(pr_text(stage), end="")


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that the flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor (a captured stdout)
        pass
