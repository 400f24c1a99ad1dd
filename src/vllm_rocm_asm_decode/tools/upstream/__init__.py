"""Write the asm decode into a vLLM 0.33.x source tree: the in-tree form of the plugin.

``vllm-rocm-asm-decode upstream DIR`` writes, into DIR (a vLLM git checkout, or a copy
of an installed vLLM's Python files):

* ``vllm/v1/attention/backends/rocm_asm_decode/``: this project's runtime modules
  (rule, step decision, kernel boundary, scale tables, and the builder and impl halves
  in ``asm_path.py``), each with vLLM's SPDX header, absolute imports and vLLM's logger;
  nothing the plugin needs only as a plugin (entry point, settings parser, logger
  wrapper, subclasses) goes in;
* ``vllm/v1/attention/backends/rocm_attn.py``: the halves in front of
  ``RocmAttentionMetadataBuilder`` and ``RocmAttentionImpl``, ``use_asm_decode`` (and
  the split and bindings) on ``RocmAttentionMetadata``, and the calls in ``__init__``,
  ``build``, ``build_for_cudagraph_capture`` and ``forward``. Only ``ROCM_ATTN``'s own
  builder turns the path on; the backends built on its classes (``ROCM_AITER_UNIFIED_ATTN``,
  ``ROCM_SEGMENTED_ATTN``) keep theirs;
* ``vllm/_aiter_ops.py``: ``rocm_aiter_ops.pa_fwd_asm`` takes ``high_precision`` with
  AITER's default (1), so a call without it reaches AITER as before;
* ``vllm/envs.py``: ``VLLM_ROCM_ASM_DECODE`` (default on) and
  ``VLLM_ROCM_ASM_DECODE_CUT`` (default: 2 x compute units);
* ``tests/kernels/attention/test_rocm_attn_asm_decode.py``: the hardware tests.

No copy of vLLM's files is stored here: each edit finds its place by name (a class, a
``def``, a dict key) in the file as it is, and stops with one line naming the anchor
when it has moved. An edit already made is left alone, so a second run changes nothing;
a file carrying another version of an edit is refused. Writing is all or nothing.
Trees other than vLLM 0.33.x are refused, and so is an installed ``site-packages``.
``--check`` applies the change to a temporary copy and prints what it would change.
Exit status: 0 written, or nothing to do; 1 ``--check`` found changes; 2 an error.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: The runtime modules written into vLLM, in dependency order.
RUNTIME_MODULES = (
    "aiter_version",
    "kernel_table",
    "kernel",
    "eligibility",
    "decision",
    "scale_tables",
    "asm_path",
)
#: Runtime modules that exist only for the plugin.
PLUGIN_ONLY = ("plugin", "settings", "log", "backend")
PACKAGE = "vllm.v1.attention.backends.rocm_asm_decode"
PACKAGE_DIR = Path(*PACKAGE.split("."))
ROCM_ATTN = Path("vllm/v1/attention/backends/rocm_attn.py")
AITER_OPS = Path("vllm/_aiter_ops.py")
ENVS = Path("vllm/envs.py")
KERNEL_TEST = Path("tests/kernels/attention/test_rocm_attn_asm_decode.py")
#: Every file the change writes (new ones and edited ones).
WRITTEN = (
    *(PACKAGE_DIR / f"{name}.py" for name in ("__init__", *RUNTIME_MODULES)),
    ROCM_ATTN,
    AITER_OPS,
    ENVS,
    KERNEL_TEST,
)
#: vLLM's header and line length.
SPDX = (
    "# SPDX-License-Identifier: Apache-2.0\n"
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)
LINE_LENGTH = 88
SUPPORTED = (0, 33)

_RUNTIME_DIR = Path(__file__).resolve().parents[2]
_RUNTIME_NAME = _RUNTIME_DIR.name
_TEST_SOURCE = Path(__file__).resolve().parent / "in_tree" / "kernel_test.py"


class UpstreamError(Exception):
    """The tree cannot take the change; the message is one line for the user."""


# --------------------------------------------------------------------------------------
# The tree


def _read(path: Path) -> str:
    """A file's text; unreadable or non-UTF-8 files are one-line errors."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UpstreamError(f"{path} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UpstreamError(f"cannot read {path}: {exc.strerror or exc}") from None


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


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
    if version_file.is_file():
        found = re.search(
            r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]",
            _read(version_file),
            re.MULTILINE,
        )
        if found:
            return found[1], "vllm/_version.py"
    raise UpstreamError(f"cannot tell which vLLM {root} is: no vllm/_version.py and no v* git tag")


def check_tree(root: Path) -> str:
    """The tree's vLLM version; raises :class:`UpstreamError` unless it is 0.33.x (and
    not an installed vLLM, through a symlink or not)."""
    try:
        if not root.exists():
            raise UpstreamError(f"{root} does not exist")
        if not root.is_dir():
            raise UpstreamError(f"{root} is not a directory")
        if not (root / ROCM_ATTN).is_file():
            raise UpstreamError(f"{root} is not a vLLM source tree (no {ROCM_ATTN})")
        homes = {root.resolve(), (root / "vllm").resolve().parent}
        installed = sorted(p for home in homes for p in home.glob("vllm-*.dist-info"))
    except OSError as exc:
        raise UpstreamError(f"cannot read {exc.filename or root}: {exc.strerror}") from None
    if installed:
        raise UpstreamError(
            f"{root} holds an installed vLLM ({installed[0]}); write into a git "
            "checkout, or into a copy of its vllm/ directory elsewhere"
        )
    version, source = tree_version(root)
    numbers = re.match(r"(\d+)\.(\d+)", version)
    if numbers is None or (int(numbers[1]), int(numbers[2])) != SUPPORTED:
        raise UpstreamError(
            f"{root} is vLLM {version} (from {source}); this change is written for vLLM 0.33.x only"
        )
    return version


# --------------------------------------------------------------------------------------
# Formatting (what ruff format writes for these shapes, at vLLM's line length)


def bracketed(head: str, items: list[str], tail: str, indent: str = "") -> str:
    """``head(items)tail`` on one line when it fits; else the items one per line with a
    trailing comma."""
    flat = f"{indent}{head}({', '.join(items)}){tail}"
    if len(flat) <= LINE_LENGTH:
        return flat
    inner = "".join(f"{indent}    {item},\n" for item in items)
    return f"{indent}{head}(\n{inner}{indent}){tail}"


def import_line(module: str, names: list[str]) -> str:
    flat = f"from {module} import {', '.join(names)}"
    if len(flat) <= LINE_LENGTH:
        return flat
    return bracketed(f"from {module} import ", names, "")


# --------------------------------------------------------------------------------------
# The runtime modules, as vLLM modules


def _alias(alias: ast.alias) -> str:
    return alias.name if alias.asname is None else f"{alias.name} as {alias.asname}"


def _absolute(node: ast.ImportFrom, origin: str) -> str | None:
    """The absolute module of a package-relative import; None for ``.log`` (vLLM's
    logger replaces it)."""
    if node.level == 0:
        module = node.module or ""
        if not module.startswith(f"{_RUNTIME_NAME}."):
            return module
        relative = module.removeprefix(f"{_RUNTIME_NAME}.")
    elif node.level != 1 or node.module is None:
        raise UpstreamError(f"{origin}: unsupported relative import (level {node.level})")
    else:
        relative = node.module
    name = relative.split(".")[0]
    if name == "log":
        return None
    if name in PLUGIN_ONLY or name == "tools":
        raise UpstreamError(f"{origin} imports the plugin-only module {name}")
    return f"{PACKAGE}.{relative}"


def _section(module: str) -> int:
    root = module.split(".")[0]
    if root == "__future__":
        return 0
    if root in sys.stdlib_module_names:
        return 1
    if root == "vllm":
        return 3
    return 2


def render_module(name: str, source: str | None = None, origin: str | None = None) -> str:
    """Runtime module ``name`` as ``vllm/v1/attention/backends/rocm_asm_decode/<name>.py``:
    SPDX header, its top imports regrouped with vLLM first-party and package imports
    made absolute, ``logger = init_logger(__name__)`` for the plugin's logger, and
    imports inside functions made absolute in place."""
    origin = origin or f"{name}.py"
    if source is None:
        source = (_RUNTIME_DIR / origin).read_text(encoding="utf-8")
    tree = ast.parse(source)
    lines = source.split("\n")
    top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    first, last = top[0].lineno, top[-1].end_lineno or top[-1].lineno
    between = [n for n in tree.body if first <= n.lineno <= last and n not in top]
    if between:
        raise UpstreamError(f"{origin}: code between the top imports (line {first})")
    sections: dict[int, list[tuple[int, str, str]]] = {}
    uses_logger = False
    for node in top:
        if isinstance(node, ast.Import):
            for alias in node.names:
                key = (0, alias.name.lower(), f"import {_alias(alias)}")
                sections.setdefault(_section(alias.name), []).append(key)
            continue
        module = _absolute(node, origin)
        if module is None:
            uses_logger = True
            module, names = "vllm.logger", ["init_logger"]
        else:
            names = [_alias(a) for a in node.names]
        key = (1, module.lower(), import_line(module, names))
        sections.setdefault(_section(module), []).append(key)
    block = "\n\n".join(
        "\n".join(text for _, _, text in sorted(sections[s])) for s in sorted(sections)
    )
    if uses_logger:
        block += "\n\nlogger = init_logger(__name__)"
    # Imports inside functions (and under TYPE_CHECKING), rewritten in place, bottom up.
    inner = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom)
        and n not in top
        and (n.level or (n.module or "").startswith(f"{_RUNTIME_NAME}."))
    ]
    for node in sorted(inner, key=lambda n: -n.lineno):
        module = _absolute(node, origin)
        if module is None:
            raise UpstreamError(f"{origin}: the logger is imported inside a function")
        indent = " " * node.col_offset
        text = import_line(module, [_alias(a) for a in node.names])
        text = "\n".join(indent + line if line else line for line in text.split("\n"))
        lines[node.lineno - 1 : node.end_lineno] = [text]
    body = "\n".join([*lines[: first - 1], block, *lines[last:]])
    return SPDX + body


def package_init() -> str:
    return (
        SPDX + '"""ROCM_ATTN\'s asm decode: large fp8-KV decode batches on AITER\'s\n'
        "``pa_fwd_asm`` (ultra precision), read from vLLM's own KV cache layout.\n\n"
        "The rule is in ``eligibility`` and ``decision``, the builder and impl halves "
        "in\n``asm_path``; ``rocm_attn.py`` puts them in front of its classes.\n"
        '"""\n'
    )


def render_kernel_test(source: str | None = None) -> str:
    """The hardware tests, with the runtime imports pointing into vLLM."""
    if source is None:
        source = _TEST_SOURCE.read_text(encoding="utf-8")
    return render_module(KERNEL_TEST.stem, source, origin=_TEST_SOURCE.name)


# --------------------------------------------------------------------------------------
# Anchored edits


class Source:
    """One file's text with AST-located edits; every lookup that fails names its
    anchor."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.text = text

    @property
    def lines(self) -> list[str]:
        return self.text.split("\n")

    def tree(self) -> ast.Module:
        try:
            return ast.parse(self.text)
        except SyntaxError as exc:
            raise UpstreamError(
                f"{self.path}: does not parse ({exc.msg}, line {exc.lineno})"
            ) from None

    def carries(self, block: str, marker: str, scope: ast.AST | None, where: str) -> bool:
        """Whether ``block`` is already there, as this version writes it. Raises when
        ``marker`` shows an edit of another version (an older ``upstream``, or a hand
        edit) in ``scope`` (the module when None), which a rerun must not stack on."""
        if block in self.text:
            return True
        scope_text = self.text if scope is None else self.segment(scope)
        if marker in scope_text:
            raise UpstreamError(
                f"{self.path}: another version of this change is in {where}; "
                f"start from vLLM's own file (git checkout -- {self.path})"
            )
        return False

    def moved(self, anchor: str) -> UpstreamError:
        return UpstreamError(
            f"{self.path}: anchor moved: {anchor} (this change is written for vLLM 0.33.x)"
        )

    def find(self, *path: str) -> ast.ClassDef | ast.FunctionDef:
        """The class or def at ``path`` (e.g. ``("RocmAttentionImpl", "forward")``)."""
        scope: list[ast.stmt] = self.tree().body
        node = None
        for i, name in enumerate(path):
            node = next(
                (
                    n
                    for n in scope
                    if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name == name
                ),
                None,
            )
            if node is None:
                kind = "class" if i < len(path) - 1 or name[0].isupper() else "def"
                where = ".".join(path[:i]) or "module"
                raise self.moved(f"{kind} {name} not found in {where}")
            scope = node.body
        assert node is not None
        return node

    def segment(self, node: ast.AST) -> str:
        """The source text of ``node`` (AST columns are UTF-8 byte offsets)."""
        lines = [line.encode() for line in self.lines[node.lineno - 1 : node.end_lineno]]
        lines[-1] = lines[-1][: node.end_col_offset]
        lines[0] = lines[0][node.col_offset :]
        return b"\n".join(lines).decode()

    def insert_after_line(self, lineno: int, block: str) -> None:
        lines = self.lines
        lines[lineno:lineno] = block.split("\n")
        self.text = "\n".join(lines)

    def replace_lines(self, first: int, last: int, block: str) -> None:
        lines = self.lines
        lines[first - 1 : last] = block.split("\n")
        self.text = "\n".join(lines)

    def add_item_after(self, node: ast.arg | ast.keyword | ast.expr, item: str) -> None:
        """Add ``item`` after an argument or keyword of a one-per-line list, at its
        indentation (the list's trailing comma then follows the new item)."""
        lines = self.lines
        end = node.end_lineno or node.lineno
        raw = lines[end - 1].encode()
        col = node.end_col_offset or 0
        added = f",\n{' ' * node.col_offset}{item}".encode()
        lines[end - 1] = (raw[:col] + added + raw[col:]).decode()
        self.text = "\n".join(lines)


def _body_start(node: ast.FunctionDef) -> ast.stmt:
    """The first statement after the docstring."""
    body = node.body
    has_doc = (
        isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    if has_doc and len(body) > 1:
        return body[1]
    return body[0]


def _header_end(src: Source, node: ast.ClassDef) -> int:
    """The line of the ``:`` that ends a class statement."""
    last = node.bases[-1] if node.bases else None
    lineno = last.end_lineno if last is not None and last.end_lineno else node.lineno
    for i in range(lineno, node.body[0].lineno + 1):
        if src.lines[i - 1].rstrip().endswith(":"):
            return i
    raise src.moved(f"class {node.name}: no end of its class statement")


def add_base(src: Source, cls: str, mixin: str) -> None:
    """Put ``mixin`` first in the bases of class ``cls``."""
    node = src.find(cls)
    bases = [src.segment(b) for b in node.bases]
    if bases[:1] == [mixin]:
        return
    if mixin in bases:
        raise UpstreamError(
            f"{src.path}: another version of this change is in the bases of {cls}; "
            f"start from vLLM's own file (git checkout -- {src.path})"
        )
    if node.keywords or node.decorator_list:
        raise src.moved(f"class {cls} has keywords or decorators")
    src.replace_lines(
        node.lineno,
        _header_end(src, node),
        bracketed(f"class {cls}", [mixin, *bases], ":"),
    )


def _import_module(node: ast.stmt) -> str:
    if isinstance(node, ast.ImportFrom):
        return node.module or ""
    assert isinstance(node, ast.Import)
    return node.names[0].name


def add_import(src: Source, statement: str, module: str, plain: bool = False) -> None:
    """Add a top-level vLLM import where ruff's isort puts it: ``import x`` lines before
    ``from x import`` lines, each sorted by module."""
    if src.carries(statement, statement.split("\n")[0], None, f"the import of {module}"):
        return
    top = [n for n in src.tree().body if isinstance(n, ast.Import | ast.ImportFrom)]
    vllm = [n for n in top if _import_module(n).split(".")[0] == "vllm"]
    if not vllm:
        raise src.moved("no top-level vllm imports")

    def before(node: ast.stmt) -> bool:
        if plain:
            return isinstance(node, ast.ImportFrom) or _import_module(node) > module
        return isinstance(node, ast.ImportFrom) and _import_module(node) > module

    following = next((n for n in vllm if before(n)), None)
    if following is not None:
        src.insert_after_line(following.lineno - 1, statement)
    else:
        src.insert_after_line(vllm[-1].end_lineno or vllm[-1].lineno, statement)


# --------------------------------------------------------------------------------------
# The three vLLM files


_HALVES = ["AsmBindings", "AsmDecodeBuilderMixin", "AsmDecodeImplMixin", "MixedSplit"]


def edit_rocm_attn(src: Source) -> None:
    add_import(src, "import vllm.envs as envs", "vllm.envs", plain=True)
    asm_path = f"{PACKAGE}.asm_path"
    add_import(src, import_line(asm_path, [*_HALVES, "asm_decode_settings"]), asm_path)

    metadata = src.find("RocmAttentionMetadata")
    fields = (
        "    # The step's decode kernel, chosen by the builder (rocm_asm_decode).\n"
        "    use_asm_decode: bool = False\n"
        "    asm_split: MixedSplit | None = None\n"
        "    asm_bindings: AsmBindings | None = None"
    )
    if not src.carries(fields, "use_asm_decode", metadata, "RocmAttentionMetadata"):
        src.insert_after_line(
            metadata.body[-1].end_lineno or metadata.body[-1].lineno, "\n" + fields
        )

    builder = "RocmAttentionMetadataBuilder"
    add_base(src, builder, "AsmDecodeBuilderMixin")
    init = src.find(builder, "__init__")
    if "kv_cache_spec" not in [a.arg for a in init.args.args]:
        raise src.moved(f"{builder}.__init__ has no kv_cache_spec argument")
    setup = (
        "        if type(self) is RocmAttentionMetadataBuilder:\n"
        "            # ROCM_ATTN's own builder only: the backends and builders built\n"
        "            # on it (unified, segmented, chunked local, ...) keep theirs.\n"
        "            switch, cut = envs.VLLM_ROCM_ASM_DECODE, envs.VLLM_ROCM_ASM_DECODE_CUT\n"
        "            self.init_asm_decode(asm_decode_settings(switch, cut), kv_cache_spec)"
    )
    if not src.carries(setup, "init_asm_decode", init, f"{builder}.__init__"):
        src.insert_after_line(init.body[-1].end_lineno or init.body[-1].lineno, "\n" + setup)

    capture = src.find(builder, "build_for_cudagraph_capture")
    where = f"{builder}.build_for_cudagraph_capture"
    if not src.carries(
        "        with self.asm_capture_build():\n"
        "            attn_metadata = self.build(0, common_attn_metadata)\n",
        "asm_capture_build",
        capture,
        where,
    ):
        call = next(
            (
                n
                for n in capture.body
                if src.segment(n) == "attn_metadata = self.build(0, common_attn_metadata)"
            ),
            None,
        )
        if call is None:
            raise src.moved(f"{where}: no `attn_metadata = self.build(0, common_attn_metadata)`")
        last = call.end_lineno or call.lineno
        nested = "\n".join("    " + line for line in src.lines[call.lineno - 1 : last])
        src.replace_lines(
            call.lineno,
            last,
            f"{' ' * call.col_offset}with self.asm_capture_build():\n{nested}",
        )

    build = src.find(builder, "build")
    if "common_attn_metadata" not in [a.arg for a in build.args.args]:
        raise src.moved(f"{builder}.build has no common_attn_metadata argument")
    decide = "        self.decide_asm_step(attn_metadata, common_attn_metadata)\n"
    if not src.carries(decide, "decide_asm_step", build, f"{builder}.build"):
        ret = build.body[-1]
        if not (
            isinstance(ret, ast.Return)
            and isinstance(ret.value, ast.Name)
            and ret.value.id == "attn_metadata"
        ):
            raise src.moved(f"{builder}.build does not end in `return attn_metadata`")
        src.insert_after_line(ret.lineno - 1, decide.rstrip("\n"))

    impl = "RocmAttentionImpl"
    add_base(src, impl, "AsmDecodeImplMixin")
    forward = src.find(impl, "forward")
    wanted = ["self", "layer", "query", "key", "value", "kv_cache", "attn_metadata"]
    wanted += ["output", "output_scale", "output_block_scale"]
    call = bracketed(
        "if self.forward_asm_decode",
        [*wanted[1:8], "output_scale is not None or output_block_scale is not None"],
        ":",
        indent="        ",
    )
    branch = f"{call}\n            return output\n"
    if not src.carries(branch, "forward_asm_decode", forward, f"{impl}.forward"):
        args = [a.arg for a in forward.args.args]
        if args != wanted:
            raise src.moved(f"{impl}.forward({', '.join(args)}), not ({', '.join(wanted)})")
        src.insert_after_line(_body_start(forward).lineno - 1, branch)


def edit_aiter_ops(src: Source) -> None:
    fn = src.find("rocm_aiter_ops", "pa_fwd_asm")
    names = [a.arg for a in fn.args.args]
    where = "rocm_aiter_ops.pa_fwd_asm"
    if not src.carries("        high_precision: int = 1,\n", "high_precision", fn, where):
        out = next((a for a in fn.args.args if a.arg == "out_"), None)
        if out is None or names[-1] != "out_":
            raise src.moved("rocm_aiter_ops.pa_fwd_asm: out_ is not its last argument")
        src.add_item_after(out, "high_precision: int = 1")
    fn = src.find("rocm_aiter_ops", "pa_fwd_asm")
    call = next(
        (
            n
            for n in ast.walk(fn)
            if isinstance(n, ast.Call) and src.segment(n.func) == "pa_fwd_asm"
        ),
        None,
    )
    if call is None:
        raise src.moved("rocm_aiter_ops.pa_fwd_asm: no call of aiter's pa_fwd_asm")
    keywords = {k.arg: k for k in call.keywords}
    if not src.carries("high_precision=high_precision,\n", "high_precision=", call, where):
        out_kw = keywords.get("out_")
        if out_kw is None or call.keywords[-1] is not out_kw:
            raise src.moved("rocm_aiter_ops.pa_fwd_asm: out_= is not the last keyword")
        src.add_item_after(out_kw, "high_precision=high_precision")


_ENV_DECLARATIONS = (
    "    VLLM_ROCM_ASM_DECODE: bool = True\n    VLLM_ROCM_ASM_DECODE_CUT: int | None = None"
)
_ENV_ENTRIES = """\
    # Whether ROCM_ATTN decodes large decode batches with an fp8 KV cache on AITER's
    # asm paged attention (needs VLLM_ROCM_USE_AITER and VLLM_ROCM_USE_AITER_MHA).
    # By default is enabled.
    "VLLM_ROCM_ASM_DECODE": lambda: (
        os.getenv("VLLM_ROCM_ASM_DECODE", "True").lower() in ("true", "1")
    ),
    # Query heads per decode step above which ROCM_ATTN runs the asm kernel.
    # By default (unset) 2 x the GPU's compute units.
    "VLLM_ROCM_ASM_DECODE_CUT": lambda: maybe_convert_int(
        os.getenv("VLLM_ROCM_ASM_DECODE_CUT", None)
    ),"""


def edit_envs(src: Source) -> None:
    anchor = "VLLM_ROCM_USE_AITER_MHA"
    tree = src.tree()
    checking = next(
        (n for n in tree.body if isinstance(n, ast.If) and src.segment(n.test) == "TYPE_CHECKING"),
        None,
    )
    if checking is None:
        raise src.moved("no `if TYPE_CHECKING:` block")
    declared = {
        n.target.id: n
        for n in checking.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    typed = "the TYPE_CHECKING declarations"
    if not src.carries(_ENV_DECLARATIONS, "VLLM_ROCM_ASM_DECODE", checking, typed):
        if anchor not in declared:
            raise src.moved(f"{anchor} is not declared under TYPE_CHECKING")
        node = declared[anchor]
        src.insert_after_line(node.end_lineno or node.lineno, _ENV_DECLARATIONS)
        tree = src.tree()
    table = next(
        (
            n
            for n in tree.body
            if isinstance(n, ast.AnnAssign | ast.Assign)
            and "environment_variables"
            in [
                t.id
                for t in getattr(n, "targets", [getattr(n, "target", None)])
                if isinstance(t, ast.Name)
            ]
            and isinstance(n.value, ast.Dict)
        ),
        None,
    )
    if table is None:
        raise src.moved("no environment_variables dict")
    assert isinstance(table.value, ast.Dict)
    keys = {
        k.value: v
        for k, v in zip(table.value.keys, table.value.values, strict=True)
        if isinstance(k, ast.Constant)
    }
    if src.carries(_ENV_ENTRIES, '"VLLM_ROCM_ASM_DECODE', table, "environment_variables"):
        return
    if anchor not in keys:
        raise src.moved(f"{anchor} is not in environment_variables")
    end = keys[anchor].end_lineno or keys[anchor].lineno
    if not src.lines[end - 1].rstrip().endswith(","):
        raise src.moved(f"environment_variables[{anchor!r}] is not followed by a comma")
    if "maybe_convert_int" not in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}:
        raise src.moved("def maybe_convert_int not found in module")
    src.insert_after_line(end, _ENV_ENTRIES)


def ignore_in_compile_hash(src: Source) -> None:
    """The two settings change routing inside the attention custom op only, which
    compiled graphs never trace: flipping them must not invalidate the compile cache."""
    fn = src.find("compile_factors")
    ignored = next(
        (
            n.value
            for n in fn.body
            if isinstance(n, ast.AnnAssign | ast.Assign)
            and isinstance(n.value, ast.Set)
            and "ignored_factors" in src.segment(n).split("=")[0]
        ),
        None,
    )
    if ignored is None or not ignored.elts:
        raise src.moved("compile_factors has no ignored_factors set")
    last = ignored.elts[-1]
    indent = " " * last.col_offset
    entries = f"{indent}# Routing inside the attention custom op only.\n{indent}" + (
        f'"VLLM_ROCM_ASM_DECODE",\n{indent}"VLLM_ROCM_ASM_DECODE_CUT"'
    )
    where = "compile_factors' ignored_factors"
    if not src.carries(entries, '"VLLM_ROCM_ASM_DECODE', ignored, where):
        src.add_item_after(last, entries.removeprefix(indent))


_EDITS: dict[Path, Callable[[Source], None]] = {
    ROCM_ATTN: edit_rocm_attn,
    AITER_OPS: edit_aiter_ops,
    ENVS: lambda src: (edit_envs(src), ignore_in_compile_hash(src)),
}


# --------------------------------------------------------------------------------------
# The change as a whole


def changed_files(root: Path) -> dict[Path, str]:
    """Every file the change writes, by path relative to ``root``, with its new text."""
    files: dict[Path, str] = {PACKAGE_DIR / "__init__.py": package_init()}
    for name in RUNTIME_MODULES:
        files[PACKAGE_DIR / f"{name}.py"] = render_module(name)
    for rel, edit in _EDITS.items():
        path = root / rel
        if not path.is_file():
            raise UpstreamError(f"{root} is not a vLLM source tree (no {rel})")
        src = Source(rel, _read(path))
        edit(src)
        files[rel] = src.text
    files[KERNEL_TEST] = render_kernel_test()
    return files


@dataclass(frozen=True)
class FileChange:
    path: Path
    added: int
    removed: int
    new: bool


def diff_counts(old: str, new: str) -> tuple[int, int]:
    added = removed = 0
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed


def apply(root: Path) -> list[FileChange]:
    """Write the change into ``root``; returns what changed (nothing on a second run).

    All or nothing: every new text is computed, then staged next to its file, then moved
    into place; a file that cannot be written leaves every file as it was. A symlinked
    file is replaced by a file of its own, never written through.
    """
    check_tree(root)
    files = changed_files(root)
    for rel in files:
        _check_way(root, rel)
    changes: list[FileChange] = []
    staged: list[tuple[Path, Path, str | None]] = []  # (temp, path, old text)
    made: list[Path] = []  # directories this run created
    done = 0
    path = root
    try:
        for rel, text in files.items():
            path = root / rel
            old = _read(path) if path.is_file() else None
            if old == text:
                continue
            made += _make_parents(path)
            temp = path.with_name(f".{path.name}.upstream~")
            staged.append((temp, path, old))
            temp.write_text(text, encoding="utf-8")
            if old is not None:
                shutil.copymode(path, temp)
            changes.append(FileChange(rel, *diff_counts(old or "", text), new=old is None))
        for temp, path, _ in staged:
            os.replace(temp, path)
            done += 1
    except OSError as exc:
        _undo(staged, done, made)
        raise UpstreamError(
            f"cannot write {path}: {exc.strerror or exc}; no file was changed"
        ) from None
    return changes


def _check_way(root: Path, rel: Path) -> None:
    """What the change writes is not in the way of something else: its directories are
    directories (or missing) and its files files (or missing)."""
    parents = [p for p in reversed(rel.parents) if p != Path(".")]
    for part, should_be_dir in [*((p, True) for p in parents), (rel, False)]:
        here = root / part
        if here.exists() and here.is_dir() != should_be_dir:
            kind = "a directory" if should_be_dir else "a file"
            raise UpstreamError(f"{here} is in the way (it should be {kind}); nothing written")


def _make_parents(path: Path) -> list[Path]:
    """Create ``path``'s missing parent directories; returns them, outermost first."""
    missing = [p for p in reversed(path.parents) if not p.exists()]
    for directory in missing:
        directory.mkdir()
    return missing


def _undo(staged: list[tuple[Path, Path, str | None]], done: int, made: list[Path]) -> None:
    """Put back what a failed run replaced, drop its staged files and new directories."""
    for _, path, old in staged[:done]:
        try:
            if old is None:
                path.unlink()
            else:
                path.write_text(old, encoding="utf-8")
        except OSError:
            pass  # best effort: the error already says which file failed
    for temp, _, _ in staged:
        temp.unlink(missing_ok=True)
    for directory in reversed(made):
        try:
            directory.rmdir()
        except OSError:
            pass


def check(root: Path) -> list[FileChange]:
    """Apply the change to a temporary copy of what it touches in ``root``."""
    version = check_tree(root)
    for rel in WRITTEN:
        _check_way(root, rel)
    with tempfile.TemporaryDirectory(prefix="vllm-upstream-check-") as tmp:
        copy = Path(tmp)
        try:
            for rel in WRITTEN:
                if (root / rel).is_file():
                    (copy / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(root / rel, copy / rel)
        except OSError as exc:
            raise UpstreamError(f"cannot read {exc.filename}: {exc.strerror}") from None
        (copy / "vllm/_version.py").write_text(f"__version__ = {version!r}\n")
        try:
            return apply(copy)
        except UpstreamError as exc:  # name the user's tree, not the copy
            raise UpstreamError(str(exc).replace(str(copy), str(root))) from None


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
    rows.append(f" {len(changes)} {files} changed, {added} insertions(+), {removed} deletions(-)")
    return "\n".join(rows)


def main(directory: str, dry_run: bool) -> int:
    """0: written, or nothing to do; 1: ``--check`` found changes to make; 2: error."""
    root = Path(directory)
    try:
        changes = check(root) if dry_run else apply(root)
    except UpstreamError as exc:
        print(f"vllm-rocm-asm-decode upstream: error: {exc}", file=sys.stderr)
        return 2
    if not changes:
        print(f"{root}: already carries this change; nothing to do")
        return 0
    if dry_run:
        print(f"{root}: would change (nothing written):")
        print(diff_stat(changes))
        return 1
    print(f"{root}: changed:")
    print(diff_stat(changes))
    print("next: git add -A && pre-commit run --files $(git diff --cached --name-only)")
    return 0
