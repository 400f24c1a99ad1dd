"""The vLLM this release extends, and the guard that keeps stock ``ROCM_ATTN`` on any
other.

The plugin subclasses vLLM 0.33's ``ROCM_ATTN`` classes and calls a few of its
functions. A ROCm image may carry another vLLM (a nightly installed beside the plugin,
a ``0.33.1.devN`` that moved a method): the first sign would be an ``ImportError`` or a
``TypeError`` mid-serving. :func:`vllm_mismatch` judges the installed vLLM before the
override is registered: its version must be of the 0.33 series, and every
:data:`EXTENSION_POINTS` entry (the classes, methods and parameters the plugin extends
or calls) must be in vLLM's source as the plugin uses it. The source is read with
``ast`` (nothing imported; 0.1 to 0.3 s in each process vLLM starts, the trees dropped
after; the answer is kept while the vLLM modules read are unchanged).
"""

from __future__ import annotations

import ast
import contextlib
import gc
import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from .kernel import REQUIRED_PARAMETERS

#: The vLLM release series this plugin release is written for.
SUPPORTED_SERIES = (0, 33)


@dataclass(frozen=True)
class ExtensionPoint:
    """A class, method or function of vLLM the plugin builds on.

    ``name`` is ``Class``, ``Class.method``, ``Class.ATTRIBUTE`` or ``function`` in
    ``module``. ``parameters`` are the parameter names the plugin relies on, after
    ``self``/``cls``: with ``positional`` they must come first in that order (the plugin
    overrides the method or passes them by position); otherwise each must be accepted
    by name. For a class, ``parameters`` are fields it must declare. ``inherited``: the
    module and class that define the method when the class does not (its base).
    """

    module: str
    name: str
    parameters: tuple[str, ...] = ()
    positional: bool = False
    inherited: tuple[str, str] | None = None


_ROCM_ATTN = "vllm.v1.attention.backends.rocm_attn"
_BUILDER_BASE = ("vllm.v1.attention.backend", "AttentionMetadataBuilder")

#: What the plugin subclasses, overrides and calls, as vLLM 0.33 defines it.
EXTENSION_POINTS: tuple[ExtensionPoint, ...] = (
    ExtensionPoint(_ROCM_ATTN, "RocmAttentionBackend.get_impl_cls"),
    ExtensionPoint(_ROCM_ATTN, "RocmAttentionBackend.get_builder_cls"),
    ExtensionPoint(
        _ROCM_ATTN,
        "RocmAttentionMetadata",
        (
            "num_actual_tokens",
            "max_query_len",
            "max_seq_len",
            "seq_lens",
            "block_table",
        ),
    ),
    ExtensionPoint(
        _ROCM_ATTN,
        "RocmAttentionMetadataBuilder.__init__",
        ("kv_cache_spec", "layer_names", "vllm_config", "device"),
        positional=True,
    ),
    ExtensionPoint(
        _ROCM_ATTN,
        "RocmAttentionMetadataBuilder.build",
        ("common_prefix_len", "common_attn_metadata", "fast_build"),
        positional=True,
    ),
    ExtensionPoint(
        _ROCM_ATTN,
        "RocmAttentionMetadataBuilder.build_for_cudagraph_capture",
        ("common_attn_metadata",),
        positional=True,
        inherited=_BUILDER_BASE,
    ),
    ExtensionPoint(
        _ROCM_ATTN,
        "RocmAttentionMetadataBuilder._init_reorder_batch_threshold",
        ("reorder_batch_threshold",),
        positional=True,
        inherited=_BUILDER_BASE,
    ),
    ExtensionPoint(
        _ROCM_ATTN,
        "RocmAttentionImpl.forward",
        (
            "layer",
            "query",
            "key",
            "value",
            "kv_cache",
            "attn_metadata",
            "output",
            "output_scale",
            "output_block_scale",
        ),
        positional=True,
    ),
    # The core's call, less high_precision (aiter_ops passes it where vLLM does not).
    ExtensionPoint(
        "vllm._aiter_ops",
        "rocm_aiter_ops.pa_fwd_asm",
        tuple(p for p in REQUIRED_PARAMETERS if p != "high_precision"),
    ),
    ExtensionPoint("vllm._aiter_ops", "rocm_aiter_ops.is_enabled"),
    ExtensionPoint("vllm._aiter_ops", "rocm_aiter_ops.is_mha_enabled"),
    # The mixed split's prefill part calls the prefill kernel as stock forward does.
    ExtensionPoint(
        "vllm.v1.attention.ops.prefix_prefill",
        "context_attention_fwd",
        (
            "q",
            "k",
            "v",
            "o",
            "kv_cache_dtype",
            "k_cache",
            "v_cache",
            "b_loc",
            "b_start_loc",
            "b_seq_len",
            "max_seq_len",
            "max_input_len",
            "k_scale",
            "v_scale",
            "alibi_slopes",
            "sliding_window",
            "sm_scale",
            "skip_decode",
            "fp8_out_scale",
            "sinks",
            "interleaved_v_pack_factor",
            "causal",
        ),
    ),
    ExtensionPoint(
        "vllm.v1.attention.ops.chunked_prefill_paged_decode", "context_attention_fwd"
    ),
    ExtensionPoint(
        "vllm.v1.attention.backends.registry",
        "register_backend",
        ("backend", "class_path"),
        positional=True,
    ),
    ExtensionPoint(
        "vllm.v1.attention.backends.registry", "AttentionBackendEnum.ROCM_ATTN"
    ),
    ExtensionPoint(
        "vllm.config.vllm",
        "get_layers_from_vllm_config",
        ("vllm_config", "layer_type", "layer_names"),
        positional=True,
    ),
    ExtensionPoint("vllm.config.compilation", "CUDAGraphMode.mixed_mode"),
)


#: The modules vLLM loads of this package (its root; the tools are never loaded).
_RUNTIME_DIR = Path(__file__).resolve().parent


def runtime_imports(directory: Path = _RUNTIME_DIR) -> list[ExtensionPoint]:
    """Every name the runtime modules import from vLLM (``from vllm.x import y``,
    anywhere in a module), as extension points that must exist: what would otherwise be
    an ``ImportError`` when vLLM resolves the backend."""
    points: dict[tuple[str, str], ExtensionPoint] = {}
    for path in sorted(directory.glob("*.py")):
        tree = _parsed(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                if node.module == "vllm" or node.module.startswith("vllm."):
                    for alias in node.names:
                        key = (node.module, alias.name)
                        points.setdefault(key, ExtensionPoint(*key))
    return list(points.values())


def installed_vllm_version() -> str | None:
    """The installed vLLM's version, from its package metadata (None: not there)."""
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def imported_vllm_version() -> str | None:
    """The version of the vLLM this Python would import (the first on its path, which
    need not be the installed distribution), read from its ``_version.py`` without an
    import; ``"dev"``, as ``vllm.__version__`` then reads, where that file or its
    ``__version__`` string is not there; None where there is no vLLM package."""
    from .vllm_version_file import version_in

    if module_source("vllm") is None:
        return None
    return version_in(module_source("vllm._version") or "") or "dev"


def same_vllm_build(imported: str | None, installed: str | None) -> bool:
    """Whether a vLLM's own version and its distribution's name one build. A ROCm build
    writes the plain version into ``vllm/_version.py`` and adds its local tag
    (``+rocm722``) to the distribution's only, so the public parts are compared."""
    from packaging.version import InvalidVersion, Version

    if imported is None or installed is None:
        return imported == installed
    try:
        return Version(imported).public == Version(installed).public
    except InvalidVersion:
        return imported == installed


def another_vllm_first(
    imported: str | None, where: str | None, installed: str | None
) -> str | None:
    """Why the vLLM imported from ``where`` is not the installed distribution the plugin
    judges, in one line; None when they are one build (:func:`same_vllm_build`)."""
    if same_vllm_build(imported, installed):
        return None
    if imported == "dev":  # as vllm.__version__ reads: no version in its _version.py
        imported = "dev (its vllm/_version.py names no version)"
    return (
        f"vLLM {imported} is first on Python's path, at {where or '?'}, but the "
        f"installed vllm distribution is {installed or 'missing'}: the plugin judges "
        "vLLM by the distribution, not the code that runs; keep one vLLM on the path"
    )


def version_mismatch(version: str | None) -> str | None:
    """Why ``version`` is not a vLLM this release extends; None when it is. Any 0.33
    release, pre-release or local build counts (``0.33.0+rocm722``, ``0.33.1.dev4``)."""
    from packaging.version import InvalidVersion, Version

    series = ".".join(map(str, SUPPORTED_SERIES))
    if version is None:
        return "vLLM is not installed"
    try:
        release = Version(version).release
    except InvalidVersion:
        return f"vLLM reports version {version!r}, not a version this release can judge"
    if release[:2] != SUPPORTED_SERIES:
        return f"vLLM {version} is not {series}.x, the vLLM this release extends"
    return None


def module_source(module: str) -> str | None:
    """The source text of a module of the installed vLLM, found from the ``vllm``
    package's directory, so that no package on the way is imported (None when the file
    is not there)."""
    top, _, rest = module.partition(".")
    try:
        spec = find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        base = Path(root, *rest.split(".")) if rest else Path(root)
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            try:
                return path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
    return None


def _digest(text: str | None) -> bytes | None:
    if text is None:
        return None
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _parsed(text: str | None) -> ast.Module | None:
    if text is None:
        return None
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The garbage collector off while trees are made and held: it would walk vLLM's
    whole heap and every node again and again (half a second in a serving process,
    against 0.1 s without)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _top_level(tree: ast.Module, name: str) -> ast.AST | None:
    """The module-level class, function, assignment or import that binds ``name``."""
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name == name:
                return node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return node
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return node
        elif isinstance(node, ast.AnnAssign):
            if isinstance(node.target, ast.Name) and node.target.id == name:
                return node
    return None


def _member(cls: ast.ClassDef, name: str) -> ast.AST | None:
    for node in cls.body:
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name == name
        ):
            return node
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id == name:
                return node
        if isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return node
    return None


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> list[str]:
    args = fn.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    static = any(
        isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list
    )
    if method and not static:
        positional = positional[1:]  # self or cls
    return positional + [a.arg for a in args.kwonlyargs]


def _check(
    point: ExtensionPoint, parsed: Callable[[str], ast.Module | None]
) -> str | None:
    """What is missing of one extension point, as a short phrase; None if nothing."""
    owner, _, member = point.name.partition(".")
    module = point.module
    tree = parsed(module)
    if tree is None:
        return f"no module {module}"
    node = _top_level(tree, owner)
    if node is None:
        return f"{module} has no {owner}"
    if member:
        if not isinstance(node, ast.ClassDef):
            return f"{module}.{owner} is not a class"
        found = _member(node, member)
        if found is None and point.inherited is not None:
            base_module, base = point.inherited
            base_tree = parsed(base_module)
            base_node = _top_level(base_tree, base) if base_tree is not None else None
            if isinstance(base_node, ast.ClassDef):
                found = _member(base_node, member)
        if found is None:
            return f"{point.name} is gone"
        node = found
    if isinstance(node, ast.ClassDef):
        fields = {
            n.target.id
            for n in node.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }
        lost = [f for f in point.parameters if f not in fields]
        return f"{point.name} has no field {', '.join(lost)}" if lost else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None if not point.parameters else f"{point.name} is not a function"
    has = _parameters(node, method=bool(member))
    if point.positional:
        want = list(point.parameters)
        if has[: len(want)] != want:
            return (
                f"{point.name} takes ({', '.join(has)}), not ({', '.join(want)}, ...)"
            )
        return None
    if node.args.kwarg is not None:
        return None
    lost = [p for p in point.parameters if p not in has]
    return f"{point.name} takes no {', '.join(lost)}" if lost else None


def missing_extension_points(
    points: Iterable[ExtensionPoint] = EXTENSION_POINTS,
    read: Callable[[str], str | None] | None = None,
) -> list[str]:
    """What the installed vLLM lacks of ``points``, one phrase each (empty: nothing).
    Each module is parsed once here and dropped after."""
    trees: dict[str, ast.Module | None] = {}
    source = read or module_source

    def parsed(module: str) -> ast.Module | None:
        if module not in trees:
            trees[module] = _parsed(source(module))
        return trees[module]

    with _collector_paused():
        problems = _problems(points, parsed)
        trees.clear()  # freed by reference counts, before the collector runs again
    return list(dict.fromkeys(problems))  # a class several points name, once


def _problems(
    points: Iterable[ExtensionPoint], parsed: Callable[[str], ast.Module | None]
) -> list[str]:
    problems = []
    for point in points:
        problem = _check(point, parsed)
        # ``from package import module`` names a submodule, not a binding; a module
        # with a ``__getattr__`` (vllm.platforms) makes its names when asked.
        if problem is not None and "." not in point.name:
            tree = parsed(point.module)
            if parsed(f"{point.module}.{point.name}") is not None or (
                tree is not None and _top_level(tree, "__getattr__") is not None
            ):
                problem = None
        if problem is not None:
            problems.append(problem)
    return problems


#: :func:`vllm_mismatch`'s answers in this process, by version and source reader, each
#: with a digest of every vLLM module it read: an answer stands while each module still
#: reads the same (doctor and the heavy commands ask twice; an answer parses some forty
#: modules, 0.3 s on a 2-core machine; a check reads vLLM's nineteen again, ~10 ms).
_Digests = dict[str, bytes | None]
_ANSWERS: dict[tuple[str | None, Callable], tuple[_Digests, str | None]] = {}


def vllm_mismatch(
    version: str | None = None, read: Callable[[str], str | None] | None = None
) -> str | None:
    """Why the installed vLLM is not one this release extends, in one line; None when
    it is: the version, :data:`EXTENSION_POINTS` and every name the runtime imports
    from vLLM (:func:`runtime_imports`). ``version`` defaults to the installed one,
    ``read`` (a module's source) to :func:`module_source`, whose answers are kept for
    as long as the vLLM modules they read are unchanged."""
    version = installed_vllm_version() if version is None else version
    if read is not None:
        return _mismatch(version, read)
    source = module_source  # as it is now: one replaced (tests) answers anew
    known = _ANSWERS.get((version, source))
    if known is not None and all(_digest(source(m)) == d for m, d in known[0].items()):
        return known[1]
    digests: _Digests = {}

    def noted(module: str) -> str | None:
        text = source(module)
        digests[module] = _digest(text)
        return text

    answer = _mismatch(version, noted)
    _ANSWERS[(version, source)] = (digests, answer)
    return answer


def _mismatch(version: str | None, read: Callable[[str], str | None]) -> str | None:
    why = version_mismatch(version)
    if why is not None:
        return why
    with _collector_paused():
        points = (*EXTENSION_POINTS, *runtime_imports())
        missing = missing_extension_points(points, read)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        return f"vLLM {version} moved what the plugin extends: {missing[0]}{more}"
    return None
