"""One vLLM file's text with edits found by name (a class, a ``def``, a statement inside
a ``def``), written as ``ruff format`` and ruff's isort would write them at vLLM's
settings. Every lookup that fails names its anchor in one line."""

from __future__ import annotations

import ast
import difflib
import functools
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

#: vLLM's line length.
LINE_LENGTH = 88
#: vLLM's header of every file.
SPDX = (
    "# SPDX-License-Identifier: Apache-2.0\n"
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)


class UpstreamError(Exception):
    """The tree cannot take the change; the message is one line for the user."""


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


def isort_names(names: list[str]) -> list[str]:
    """Names of one ``from`` import in ruff's isort order: constants, classes, the
    rest, each group case-sensitively."""

    def kind(name: str) -> int:
        if name.isupper() and len(name) > 1:
            return 0
        return 1 if name[:1].isupper() else 2

    return sorted(dict.fromkeys(names), key=lambda n: (kind(n), n))


def section(module: str) -> int:
    """isort's section: ``__future__``, standard library, third party, vLLM."""
    root = module.split(".")[0]
    if root == "__future__":
        return 0
    if root in sys.stdlib_module_names:
        return 1
    return 3 if root == "vllm" else 2


def import_module(node: ast.Import | ast.ImportFrom) -> str:
    if isinstance(node, ast.ImportFrom):
        return node.module or ""
    return node.names[0].name


def body_start(node: ast.FunctionDef) -> ast.stmt:
    """The first statement after the docstring."""
    body = node.body
    has_doc = (
        isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    return body[1] if has_doc and len(body) > 1 else body[0]


def departure(block: str, text: str) -> str:
    """Where ``text`` departs from ``block``, for a refusal to point at: the first line
    of ``block`` that ``text`` lacks (indentation aside), and the line of ``text`` most
    like it, by number, when there is one (a hand edit)."""
    have = [line.strip() for line in text.split("\n")]
    wanted = next((w for w in map(str.strip, block.split("\n")) if w and w not in have), None)
    if wanted is None:
        return "its lines, in another order"
    code = wanted.split("  #")[0]  # its comment edited, or a near copy: an edit of it
    close = [h for h in have if h.split("  #")[0] == code]
    close = close or difflib.get_close_matches(wanted, have, n=1, cutoff=0.85)
    if not close:
        return f"{wanted!r} is not there"
    return f"line {have.index(close[0]) + 1} reads {close[0]!r} where it writes {wanted!r}"


@functools.lru_cache(maxsize=128)
def _parse(text: str) -> ast.Module:
    """``ast.parse``, once per text: every run edits the same files in the same order, so
    a process that applies several times (``--check`` then the write, the tests) meets
    the same texts again. The trees are shared: read them, never change them."""
    return ast.parse(text)


class Source:
    """One file's text with AST-located edits."""

    def __init__(
        self,
        path: Path,
        text: str,
        root: Path | None = None,
        git: bool = True,
        committed: Callable[[], tuple[str, str] | None] | None = None,
    ) -> None:
        #: The file as errors name it: ``root / path`` when the tree's ``root`` is given.
        self.path = path if root is None else root / path
        self._rel, self._root, self._git, self._committed = path, root, git, committed
        self.text = text
        #: The file as it is on disk (LF): where refusals count its lines.
        self.original = text
        self._parsed: tuple[str, ast.Module] | None = None
        #: What the edits since :meth:`begin` found in place and what they added, by
        #: where it goes: a file that has some of a stage and lacks the rest is refused.
        self.found: list[str] = []
        self.added: list[str] = []
        #: The block :meth:`carries` added, by where it goes: a refusal names where the
        #: file on disk departs from it (:func:`departure`, computed only then).
        self.added_blocks: dict[str, str] = {}

    @functools.cached_property
    def restore(self) -> str:
        """How to put vLLM's own file back, for a refusal to say (worked out only then):
        git's checkout in a git work tree (``git``), of the revision ``committed`` names
        where it names one (the file is as committed: ``checkout --`` would change
        nothing), else a fresh copy."""
        if not self._git:
            return f"copy {self._rel} from an unmodified vLLM 0.33.x"
        root = self._root
        git = "git" if root is None or root == Path(".") else f"git -C {shlex.quote(str(root))}"
        if self._committed is not None and (base := self._committed()) is not None:
            revision, why = base
            return f"{git} checkout {revision} -- {self._rel}{why}"
        return f"{git} checkout -- {self._rel}"

    def begin(self) -> None:
        """Start recording what one stage's edits find and add."""
        self.found, self.added, self.added_blocks = [], [], {}

    @property
    def lines(self) -> list[str]:
        return self.text.split("\n")

    def tree(self) -> ast.Module:
        """The text's AST (parsed again only after an edit)."""
        if self._parsed is not None and self._parsed[0] is self.text:
            return self._parsed[1]
        try:
            tree = _parse(self.text)
        except SyntaxError as exc:
            raise UpstreamError(
                f"{self.path}: does not parse ({exc.msg}"
                + (f", line {exc.lineno})" if exc.lineno else ")")
            ) from None
        self._parsed = (self.text, tree)
        return tree

    def carries(
        self,
        block: str,
        marker: str,
        scope: ast.AST | None,
        where: str,
        later: tuple[str, ...] = (),
    ) -> bool:
        """Whether ``block`` is already there, as this version writes it (or as a later
        stage rewrites it: ``later``). Raises when ``marker`` shows an edit of another
        version (an older ``upstream``, or a hand edit) in ``scope`` (the module when
        None), which a rerun must not stack on."""
        if block in self.text or any(text in self.text for text in later):
            self.found.append(where)
            return True
        scope_text = self.text if scope is None else self.segment(scope)
        if marker in scope_text:
            raise UpstreamError(
                f"{self.path}: another version of this change is in {where} "
                f"({departure(block, self.original)}); start from vLLM's own file ({self.restore})"
            )
        self.added.append(where)
        self.added_blocks.setdefault(where, block)
        return False

    def moved(self, anchor: str) -> UpstreamError:
        return UpstreamError(
            f"{self.path}: anchor moved: {anchor} (this change is written for vLLM 0.33.x; "
            f"if the file was edited, start from vLLM's own: {self.restore})"
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

    def find_def(self, *path: str) -> ast.FunctionDef:
        node = self.find(*path)
        if not isinstance(node, ast.FunctionDef):
            raise self.moved(f"{'.'.join(path)} is not a def")
        return node

    def segment(self, node: ast.AST) -> str:
        """The source text of ``node`` (AST columns are UTF-8 byte offsets)."""
        lines = [line.encode() for line in self.lines[node.lineno - 1 : node.end_lineno]]
        lines[-1] = lines[-1][: node.end_col_offset]
        lines[0] = lines[0][node.col_offset :]
        return b"\n".join(lines).decode()

    def statement(self, scope: ast.AST, text: str, where: str) -> ast.stmt:
        """The statement directly in ``scope``'s body whose source is ``text``."""
        found = next((n for n in getattr(scope, "body", []) if self.segment(n) == text), None)
        if found is None:
            raise self.moved(f"{where}: no `{text.splitlines()[0]}`")
        return found

    def call_statement(self, scope: ast.AST, func: str, where: str) -> ast.Expr:
        """The expression statement directly in ``scope``'s body that calls ``func``."""
        found = next(
            (
                n
                for n in getattr(scope, "body", [])
                if isinstance(n, ast.Expr)
                and isinstance(n.value, ast.Call)
                and self.segment(n.value.func) == func
            ),
            None,
        )
        if found is None:
            raise self.moved(f"{where}: no call of {func}")
        return found

    def comment_start(self, node: ast.stmt) -> int:
        """The line of the first comment line directly above ``node`` (its own line
        when none)."""
        lineno = node.lineno
        while lineno > 1 and self.lines[lineno - 2].strip().startswith("#"):
            lineno -= 1
        return lineno

    def insert_after_line(self, lineno: int, block: str) -> None:
        lines = self.lines
        lines[lineno:lineno] = block.split("\n")
        self.text = "\n".join(lines)

    def replace_lines(self, first: int, last: int, block: str) -> None:
        lines = self.lines
        lines[first - 1 : last] = block.split("\n")
        self.text = "\n".join(lines)

    def add_item_after(
        self, node: ast.arg | ast.keyword | ast.expr, item: str, indent: int | None = None
    ) -> None:
        """Add ``item`` after an argument, a default or a keyword of a one-per-line
        list, at its indentation or ``indent`` (the list's trailing comma then follows
        the new item)."""
        self.added.append(f"`{item}`")
        lines = self.lines
        end = node.end_lineno or node.lineno
        raw = lines[end - 1].encode()
        col = node.end_col_offset or 0
        added = f",\n{' ' * (node.col_offset if indent is None else indent)}{item}".encode()
        lines[end - 1] = (raw[:col] + added + raw[col:]).decode()
        self.text = "\n".join(lines)

    def top_imports(self) -> list[ast.Import | ast.ImportFrom]:
        return [n for n in self.tree().body if isinstance(n, ast.Import | ast.ImportFrom)]

    def has_import(self, module: str, name: str | None, alias: str | None = None) -> bool:
        for node in self.top_imports():
            if name is None and isinstance(node, ast.Import):
                if any(a.name == module and a.asname == alias for a in node.names):
                    return True
            if name is not None and isinstance(node, ast.ImportFrom):
                if node.module == module and any(a.name == name for a in node.names):
                    return True
        return False

    def ensure_import(self, module: str, name: str | None = None, alias: str | None = None) -> None:
        """``import module [as alias]`` (``name`` None) or ``from module import name``,
        added where ruff's isort puts it: into the ``from module`` import there is, else
        a new statement in its section (straight imports first, then by module)."""
        if self.has_import(module, name, alias):
            return
        self.added.append(f"the import of {name or module}")
        top = self.top_imports()
        if name is not None:
            same = next(
                (
                    n
                    for n in top
                    if isinstance(n, ast.ImportFrom) and n.module == module and n.level == 0
                ),
                None,
            )
            if same is not None:
                if any(a.asname for a in same.names):
                    raise self.moved(f"the import from {module} renames a name")
                names = isort_names([*(a.name for a in same.names), name])
                self.replace_lines(
                    same.lineno, same.end_lineno or same.lineno, import_line(module, names)
                )
                return
        if name is None:
            statement = f"import {module}" + (f" as {alias}" if alias else "")
        else:
            statement = import_line(module, [name])
        key = (name is not None, module.lower())
        peers = [n for n in top if section(import_module(n)) == section(module)]
        if not peers:
            raise self.moved(f"no top-level imports of {module}'s section")
        following = next(
            (n for n in peers if (isinstance(n, ast.ImportFrom), import_module(n).lower()) > key),
            None,
        )
        if following is not None:
            self.insert_after_line(following.lineno - 1, statement)
        else:
            self.insert_after_line(peers[-1].end_lineno or peers[-1].lineno, statement)
