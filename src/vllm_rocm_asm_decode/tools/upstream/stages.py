"""The in-tree change as a stack of pull requests, each an edit of vLLM's own files.

* Stage 1, the asm decode: :mod:`vllm_rocm_asm_decode.core` written into
  ``rocm_attn.py`` as it stands, wired into the metadata, the builder and ``forward``;
  ``rocm_aiter_ops.pa_fwd_asm`` passes ``high_precision`` on (AITER's default kept);
  the kernel tests.
* Stage 2, mixed prefill+decode steps: :mod:`vllm_rocm_asm_decode.mixed` written into
  ``rocm_attn.py``, wired in, and a prefill-only option of
  ``chunked_prefill_paged_decode``.
* Stage 3, scale-table memory for ``ROCM_AITER_FA`` and ``ROCM_ATTN`` alike:
  :mod:`vllm_rocm_asm_decode.asm_scale_tables` as a new module both builders call
  (tables aliased over one chunk of device memory, layers with checkpoint scales
  owning theirs, refilled in place after a weight reload), in place of
  ``ROCM_AITER_FA``'s ``AsmKvScaleTables``.

Each stage's wiring is text here; the rule, the decision and the call come from the
runtime modules, so no clause of the rule is written twice. Each edit is anchored by
name, is left alone when it is already there (a rerun changes nothing), and stops the
run when another version of it is.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable
from pathlib import Path

from .source import SPDX, Source, UpstreamError

ROCM_ATTN = Path("vllm/v1/attention/backends/rocm_attn.py")
ROCM_AITER_FA = Path("vllm/v1/attention/backends/rocm_aiter_fa.py")
SCALE_TABLES = Path("vllm/v1/attention/backends/asm_scale_tables.py")
AITER_OPS = Path("vllm/_aiter_ops.py")
ATTENTION_CONFIG = Path("vllm/config/attention.py")
PAGED_DECODE = Path("vllm/v1/attention/ops/chunked_prefill_paged_decode.py")
KERNEL_TEST = Path("tests/kernels/attention/test_rocm_attn_aiter_asm_decode.py")

_RUNTIME_DIR = Path(__file__).resolve().parents[2]
_RUNTIME_NAME = _RUNTIME_DIR.name
#: What the runtime modules' plugin-relative imports are in vLLM: a vLLM name, or None
#: for a name an earlier stage defines in ``rocm_attn.py`` itself.
_IN_TREE_NAMES: dict[str, str | None] = {"aiter_ops": "vllm._aiter_ops", "core": None}


# --------------------------------------------------------------------------------------
# A runtime module as a block of rocm_attn.py


Import = tuple[str, str | None, str | None]


def runtime_block(module: str, source: str | None = None) -> tuple[str, list[Import]]:
    """Runtime module ``module`` below its imports (its docstring, imports and
    ``TYPE_CHECKING`` block left out), and the imports that text needs, as ``(module,
    name, alias)`` (``name`` None for ``import module [as alias]``)."""
    origin = f"{module}.py"
    if source is None:
        source = (_RUNTIME_DIR / origin).read_text(encoding="utf-8")
    tree = ast.parse(source)
    body = list(tree.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    imports: list[Import] = []
    last = 0
    for node in body:
        if isinstance(node, ast.Import):
            imports += [(a.name, None, a.asname) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            imports += _in_tree_import(node, origin)
        elif isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            pass
        else:
            break
        last = node.end_lineno or node.lineno
    imports = [i for i in imports if i[:2] != ("typing", "TYPE_CHECKING")]
    text = "\n".join(source.split("\n")[last:]).strip("\n")
    return text, imports


def _in_tree_import(node: ast.ImportFrom, origin: str) -> list[Import]:
    module = node.module or ""
    if any(a.asname for a in node.names):
        raise UpstreamError(f"{origin}: `from {module} import ... as ...` is not written")
    if node.level == 0 and not module.startswith(f"{_RUNTIME_NAME}."):
        return [(module, a.name, None) for a in node.names]
    relative = module if node.level == 1 else module.removeprefix(f"{_RUNTIME_NAME}.")
    if node.level > 1 or relative not in _IN_TREE_NAMES:
        raise UpstreamError(f"{origin} imports {relative or '.'}, which vLLM does not have")
    target = _IN_TREE_NAMES[relative]
    return [] if target is None else [(target, a.name, None) for a in node.names]


def add_block_after(src: Source, anchor: ast.stmt, block: str, marker: str) -> None:
    """A module-level block two blank lines after the statement ``anchor``."""
    if not src.carries(block, marker, None, "the module"):
        src.insert_after_line(anchor.end_lineno or anchor.lineno, "\n\n" + block)


#: The runtime modules written into ``rocm_attn.py``; every name they define is private
#: there (``ASM_BLOCK_SIZE`` becomes ``_ASM_BLOCK_SIZE``): no other module needs it.
IN_TREE_MODULES = ("core", "mixed")


@functools.cache
def in_tree_names() -> tuple[str, ...]:
    """The names :data:`IN_TREE_MODULES` define at module level."""
    names = []
    for module in IN_TREE_MODULES:
        tree = ast.parse((_RUNTIME_DIR / f"{module}.py").read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.append(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    elts = target.elts if isinstance(target, ast.Tuple) else [target]
                    names += [t.id for t in elts if isinstance(t, ast.Name)]
    return tuple(names)


def privatized(text: str) -> str:
    """``text`` with every name of :func:`in_tree_names` made private, but not
    attributes or keyword arguments: ``metadata.use_asm_decode`` and
    ``f(use_asm_decode=False)`` stay (formatted code: an assignment has spaces around
    its ``=``, a keyword argument none)."""
    names = "|".join(map(re.escape, in_tree_names()))
    pattern = r"(?<![.\w])(" + names + r")\b(?!=(?!=))"
    return re.sub(pattern, r"_\1", text)


#: Runtime functions vLLM does not get: ``forward`` there calls the kernel itself, and
#: ``build`` decides the step in its own lines.
PLUGIN_ONLY = ("asm_decode", "use_asm_decode")


def without_plugin_only(block: str) -> str:
    """``block`` without the top-level functions :data:`PLUGIN_ONLY` names."""
    tree = ast.parse(block)
    lines = block.split("\n")
    for node in reversed(tree.body):
        if isinstance(node, ast.FunctionDef) and node.name in PLUGIN_ONLY:
            del lines[node.lineno - 1 : node.end_lineno]
    return "\n".join(lines).strip("\n").replace("\n\n\n\n\n", "\n\n\n")


def as_written(text: str) -> str:
    """A runtime module's text as ``rocm_attn.py`` holds it: the plugin's own code left
    out, its names private, ``ModelConfig`` unquoted (rocm_attn.py imports it)."""
    return privatized(without_plugin_only(text)).replace('"ModelConfig"', "ModelConfig")


def add_runtime_block(src: Source, module: str, after: Callable[[], ast.stmt]) -> None:
    block, imports = runtime_block(module)
    block = as_written(block)
    for name, item, alias in imports:
        src.ensure_import(name, item, alias)
    first_def = next(line for line in block.split("\n") if line.startswith(("def ", "class ")))
    add_block_after(src, after(), block, first_def.split("(")[0])


def _logger(src: Source) -> ast.stmt:
    node = next(
        (
            n
            for n in src.tree().body
            if isinstance(n, ast.Assign) and [ast.unparse(t) for t in n.targets] == ["logger"]
        ),
        None,
    )
    if node is None:
        raise src.moved("no module-level `logger = init_logger(__name__)`")
    return node


# --------------------------------------------------------------------------------------
# Stage 1


_METADATA_FIELDS = """\
    use_asm_decode: bool = False  # pa_fwd_asm decodes this step
    asm_scales: dict[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]] | None = None"""

_BUILDER_INIT = """\
        switch = vllm_config.attention_config.use_aiter_asm_decode
        self._asm_to_bind = switch and type(self) is RocmAttentionMetadataBuilder
        self._asm_cut = 0  # set when the layers are bound (build())
        self._asm_scales: dict[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}
        self._asm_filled: dict[torch.nn.Module, tuple[float, float]] = {}
        seqs = vllm_config.scheduler_config.max_num_seqs if self._asm_to_bind else 0
        self._asm_seq_lens = torch.ones(seqs, dtype=torch.int32, device=device)"""

#: The cap's own gate, which stage 3 removes with the cap.
_STAGE_1_TABLE_GATE = (
    '            (len(keys) > 4, f"{len(keys)} tables > 4"),  # beside the KV budget\n'
)

_STAGE_1_CAP = (
    """\
        keys = {kv for k, v in self._asm_filled.values() for kv in (("K", k), ("V", v))}
        max_heads = self.vllm_config.scheduler_config.max_num_seqs * self.num_heads_q
        gates = (  # each keeps every layer on HIP
            (not self._asm_filled, "no layer qualifies"),
            (not rocm_aiter_ops.is_mha_enabled(), "VLLM_ROCM_USE_AITER(_MHA) is off"),
            (max_heads <= self._asm_cut, f"max_num_seqs x heads <= {self._asm_cut}"),
            (old, f"AITER {version}, need 0.1.17"),
"""
    + _STAGE_1_TABLE_GATE
    + """\
        )
        why = next((reason for closed, reason in gates if closed), "")
        self._asm_filled = {} if why else self._asm_filled
"""
)

_STAGE_1_TABLES = """\
            for key in {("K", k_scale), ("V", v_scale)} - tables.keys():
                tables[key] = layer.kv_cache.new_full(shape, key[1], dtype=torch.float)
            self._asm_scales[layer] = (tables["K", k_scale], tables["V", v_scale])
"""

_STAGE_1_TABLES_DECL = (
    "        tables: dict[tuple[str, float], torch.Tensor] = {}  # fp32, by (K or V, scale)\n"
)

_STAGE_1_BIND = (
    """\

    def _bind_asm_decode(self) -> None:
        \"\"\"Scale tables for the layers pa_fwd_asm can decode, unless a gate says no.\"\"\"
        from vllm.platforms.rocm import on_mi3xx

        self._asm_to_bind = False
        self._asm_cut = _ASM_HEADS_PER_CU * current_platform.num_compute_units()
        layers = self.vllm_config.compilation_config.static_forward_context
        model, mi3xx, denied = self.vllm_config.model_config, on_mi3xx(), ""
        try:  # AITER before 0.1.17 misreads KV block ids >= 65536 (AITER issue 3062)
            version = importlib.metadata.version("amd-aiter")  # AITER is not imported
            old = Version(version) < Version("0.1.17")
        except (importlib.metadata.PackageNotFoundError, InvalidVersion):
            version, old = "of unknown version", True
        for layer in (layers[name] for name in self.layer_names):
            reasons = _asm_decode_rejections(layer.impl, layer.kv_cache, model, mi3xx)
            if reasons:  # the line names the last layer the rule rejects, and why
                denied = f" ({layer.layer_name} keeps HIP: {', '.join(reasons)})"
            else:
                self._asm_filled[layer] = (layer._k_scale_float, layer._v_scale_float)
"""
    + _STAGE_1_CAP
    + _STAGE_1_TABLES_DECL
    + """\
        for layer, (k_scale, v_scale) in self._asm_filled.items():
            shape = (layer.kv_cache.shape[0], layer.impl.num_kv_heads, _ASM_BLOCK_SIZE)
"""
    + _STAGE_1_TABLES
    + """\
        log = logger.warning_once if why else logger.info_once
        when = f"({why})" if why else f"above {self._asm_cut} query heads"
        msg = "ROCM_ATTN: AITER pa_fwd_asm decodes %d of %d layers %s%s"
        log(msg, len(self._asm_scales), len(self.layer_names), when, denied)
"""
)

_STAGE_1_RELOAD = """\

    def _follow_asm_reload(self) -> None:
        \"\"\"After a weight reload, refill the scale tables in place: graphs hold them.\"\"\"
        now = {x: (x._k_scale_float, x._v_scale_float) for x in self._asm_filled}
        if now == self._asm_filled:  # no weight reload since (host floats: no sync)
            return
        wanted: dict[torch.Tensor, set[float]] = {}
        for layer, tables in self._asm_scales.items():
            for table, scale in zip(tables, now[layer], strict=True):
                wanted.setdefault(table, set()).add(scale)
        kept = {t for t, scales in wanted.items() if len(scales) > 1}  # layers parted
        stale = [  # layers that moved off a table which keeps its scale
            x
            for x, t in self._asm_scales.items()
            if any(t[i] in kept and now[x][i] != self._asm_filled[x][i] for i in (0, 1))
        ]
        if stale:
            names = ", ".join(x.layer_name for x in stale)
            why = f"Reloaded KV scales of {names} left their shared asm scale tables"
            if self.vllm_config.compilation_config.cudagraph_mode.has_full_cudagraphs():
                fix = "-ac.use_aiter_asm_decode=false or -cc.cudagraph_mode=PIECEWISE"
                raise RuntimeError(f"{why} (under FULL graphs); restart with {fix}")
            logger.error("%s: they use the HIP decode until a restart", why)
        for table in wanted.keys() - kept:  # one new scale for all its layers
            table.fill_(wanted[table].pop())
        self._asm_scales = {x: t for x, t in self._asm_scales.items() if x not in stale}
        self._asm_filled = {x: now[x] for x in self._asm_scales}"""

_BUILDER_BIND = _STAGE_1_BIND + _STAGE_1_RELOAD

_BUILD_DECIDE = """\
        if self._asm_to_bind:  # the first build() after the KV cache is bound
            self._bind_asm_decode()
        self._follow_asm_reload()
        use_asm = bool(self._asm_scales) and max_query_len == 1  # a pure-decode step
        use_asm &= common_attn_metadata.num_reqs == num_actual_tokens  # one token each
        use_asm &= num_actual_tokens * self.num_heads_q > self._asm_cut  # above the cut
        if use_asm:  # padding rows have length 0, which pa_fwd_asm may write as NaN
            seq_lens = torch.clamp(seq_lens, 1, out=self._asm_seq_lens[: len(seq_lens)])
"""

_FORWARD_ASM = """\
        scales = (attn_metadata.asm_scales or {}).get(layer)
        if attn_metadata.use_asm_decode and scales and output_scale is None:
            rocm_aiter_ops.pa_fwd_asm(
                Q=query[:num_actual_tokens],
                K=key_cache,
                V=value_cache.unsqueeze(2),  # AITER's [B, H, 1, D, 16]; interleaved too
                block_tables=block_table,
                context_lens=seqused_k,
                block_tables_stride0=block_table.stride(0),
                K_QScale=scales[0],
                V_QScale=scales[1],
                out_=output[:num_actual_tokens],
                high_precision=_ASM_PRECISION,
            )
            return output
"""


def stage1_rocm_attn(src: Source) -> None:
    src.ensure_import("vllm.config", "ModelConfig")
    src.ensure_import("importlib.metadata")
    src.ensure_import("packaging.version", "InvalidVersion")
    src.ensure_import("packaging.version", "Version")
    add_runtime_block(src, "core", lambda: _logger(src))

    metadata = src.find("RocmAttentionMetadata")
    fields = (_METADATA_FIELDS, "use_asm_decode:", "RocmAttentionMetadata")
    _append_to_body(src, metadata, *fields)

    builder = "RocmAttentionMetadataBuilder"
    init = src.find_def(builder, "__init__")
    _append_to_body(src, init, _BUILDER_INIT, "self._asm_cut", f"{builder}.__init__")
    init = src.find_def(builder, "__init__")
    if not src.carries(
        _BUILDER_BIND,
        "def _bind_asm_decode",
        None,
        f"{builder}._bind_asm_decode or _follow_asm_reload",
        later=(_STAGE_3_BIND + _STAGE_1_RELOAD,),
    ):
        src.insert_after_line(init.end_lineno or init.lineno, _BUILDER_BIND)

    build = src.find_def(builder, "build")
    where = f"{builder}.build"
    local = {ast.unparse(t) for n in build.body if isinstance(n, ast.Assign) for t in n.targets}
    if not {"num_actual_tokens", "max_query_len"} <= local:  # the step decision reads them
        raise src.moved(f"{where} sets no num_actual_tokens or max_query_len")
    _before_metadata(src, build, _BUILD_DECIDE, "use_asm =", where)
    build = src.find_def(builder, "build")
    call = _metadata_call(src, build, where)
    keywords = {k.arg: k for k in call.keywords}
    for item, after in (
        ("use_asm_decode=use_asm", "causal"),
        ("asm_scales=self._asm_scales", "use_asm_decode"),
    ):
        if f"{item}," not in src.segment(call):
            if after not in keywords:
                raise src.moved(f"{where}: RocmAttentionMetadata(...) has no {after}=")
            src.add_item_after(keywords[after], item)
            call = _metadata_call(src, src.find_def(builder, "build"), where)
            keywords = {k.arg: k for k in call.keywords}

    forward = src.find_def("RocmAttentionImpl", "forward")
    where = "RocmAttentionImpl.forward"
    if not src.carries(_FORWARD_ASM, "asm_decode(", forward, where):
        names = [a.arg for a in forward.args.args]
        if "output_scale" not in names or "layer" not in names:
            raise src.moved(f"{where}({', '.join(names)}) has no layer or output_scale")
        call = src.call_statement(forward, "chunked_prefill_paged_decode", where)
        src.insert_after_line(src.comment_start(call) - 1, _FORWARD_ASM.rstrip("\n"))


def _after_capture_build(src: Source, line: str, marker: str) -> None:
    """``line`` right after ``build_for_cudagraph_capture``'s own ``build()`` call,
    unless it is there."""
    builder = "RocmAttentionMetadataBuilder"
    capture = src.find_def(builder, "build_for_cudagraph_capture")
    where = f"{builder}.build_for_cudagraph_capture"
    if not src.carries(line, marker, capture, where):
        anchor = src.statement(
            capture, "attn_metadata = self.build(0, common_attn_metadata)", where
        )
        src.insert_after_line(anchor.end_lineno or anchor.lineno, line)


def _metadata_assignment(src: Source, build: ast.FunctionDef) -> str:
    node = next(
        (
            n
            for n in build.body
            if isinstance(n, ast.Assign)
            and [ast.unparse(t) for t in n.targets] == ["attn_metadata"]
            and isinstance(n.value, ast.Call)
            and ast.unparse(n.value.func) == "RocmAttentionMetadata"
        ),
        None,
    )
    if node is None:
        raise src.moved(
            "RocmAttentionMetadataBuilder.build: no `attn_metadata = RocmAttentionMetadata(...)`"
        )
    return src.segment(node)


def _append_to_body(
    src: Source, node: ast.AST, text: str, marker: str, where: str, lead: str = ""
) -> None:
    """``text`` after the last statement of ``node``'s body, unless it is there."""
    if not src.carries(text, marker, node, where):
        last = node.body[-1]  # type: ignore[attr-defined]
        src.insert_after_line(last.end_lineno or last.lineno, lead + text)


def _before_metadata(
    src: Source, build: ast.FunctionDef, text: str, marker: str, where: str
) -> None:
    """``text`` before ``build``'s ``attn_metadata = RocmAttentionMetadata(...)``,
    unless it is there."""
    if not src.carries(text, marker, build, where):
        target = src.statement(build, _metadata_assignment(src, build), where)
        src.insert_after_line(target.lineno - 1, text.rstrip("\n"))


def _metadata_call(src: Source, build: ast.FunctionDef, where: str) -> ast.Call:
    node = src.statement(build, _metadata_assignment(src, build), where)
    assert isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
    return node.value


def stage1_aiter_ops(src: Source) -> None:
    """``rocm_aiter_ops.pa_fwd_asm(..., high_precision: int = 1)``, passed on to AITER:
    1 is AITER's own default, so a call without it reaches AITER as before."""
    fn = src.find_def("rocm_aiter_ops", "pa_fwd_asm")
    names = [a.arg for a in fn.args.args]
    where = "rocm_aiter_ops.pa_fwd_asm"
    if not src.carries("        high_precision: int = 1,\n", "high_precision", fn, where):
        out = next((a for a in fn.args.args if a.arg == "out_"), None)
        if out is None or names[-1] != "out_":
            raise src.moved("rocm_aiter_ops.pa_fwd_asm: out_ is not its last argument")
        src.add_item_after(out, "high_precision: int = 1")
    fn = src.find_def("rocm_aiter_ops", "pa_fwd_asm")
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


_CONFIG_FIELD = '''
    use_aiter_asm_decode: bool = False
    """ROCM_ATTN: large fp8-KV decodes on pa_fwd_asm; needs VLLM_ROCM_USE_AITER=1."""'''


def stage1_attention_config(src: Source) -> None:
    """``AttentionConfig.use_aiter_asm_decode``, the asm decode's own switch (off by
    default until AMD runs are posted), after the other backend's switch
    ``disable_flashinfer_q_quantization``."""
    where = "AttentionConfig"
    config = src.find(where)
    if src.carries(_CONFIG_FIELD, "use_aiter_asm_decode", config, where):
        return
    body = config.body
    field = next(
        (
            i
            for i, n in enumerate(body[:-1])
            if isinstance(n, ast.AnnAssign)
            and ast.unparse(n.target) == "disable_flashinfer_q_quantization"
        ),
        None,
    )
    doc = None if field is None else body[field + 1]
    if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)):
        raise src.moved(f"{where} has no documented disable_flashinfer_q_quantization")
    src.insert_after_line(doc.end_lineno or doc.lineno, _CONFIG_FIELD)


# --------------------------------------------------------------------------------------
# Stage 2


_SPLIT_FIELD = "    asm_split: _AsmDecodeSplit | None = None"

_SPLIT_INIT = """\
        if (
            type(self) is RocmAttentionMetadataBuilder
            and rocm_aiter_ops.is_mha_enabled()
            and _asm_split_off(vllm_config) is None
            and _asm_split_reorders(vllm_config, kv_cache_spec, layer_names)
        ):
            self._init_reorder_batch_threshold(1)"""

_SPLIT_BUILD = """\
        asm_split = None
        if self._asm_scales:
            asm_split = _split_asm_decode(
                common_attn_metadata, self.vllm_config, self.num_heads_q, self._asm_cut
            )
"""

_SPLIT_CAPTURE = "        attn_metadata.asm_split = None  # a graph must not replay a split"

_SPLIT_FORWARD = """\
        split = attn_metadata.asm_split if scales and output_scale is None else None
        if split is not None:
            # A mixed step: the prefill kernel on the prefill requests' views, then
            # pa_fwd_asm on the leading decode requests.
            cu_seqlens_q = split.prefill_query_start_loc
            seqused_k = split.prefill_seq_lens
            block_table = split.prefill_block_table
"""

_SPLIT_DECODE = """\
        if scales and split is not None:
            rocm_aiter_ops.pa_fwd_asm(
                Q=query[: split.num_decodes],
                K=key_cache,
                V=value_cache.unsqueeze(2),
                block_tables=split.decode_block_table,
                context_lens=split.decode_seq_lens,
                block_tables_stride0=split.decode_block_table.stride(0),
                K_QScale=scales[0],
                V_QScale=scales[1],
                out_=output[: split.num_decodes],
                high_precision=_ASM_PRECISION,
            )
"""

_PREFILL_ONLY = """\
    if prefill_only:  # the caller decodes the one-token requests itself
        return
"""


def stage2_rocm_attn(src: Source) -> None:
    add_runtime_block(src, "mixed", lambda: src.find("_asm_decode_rejections"))

    metadata = src.find("RocmAttentionMetadata")
    _append_to_body(src, metadata, _SPLIT_FIELD, "asm_split:", "RocmAttentionMetadata")

    builder = "RocmAttentionMetadataBuilder"
    init = src.find_def(builder, "__init__")
    _append_to_body(src, init, _SPLIT_INIT, "_asm_split_reorders", f"{builder}.__init__")

    build = src.find_def(builder, "build")
    where = f"{builder}.build"
    _before_metadata(src, build, _SPLIT_BUILD, "_split_asm_decode(", where)
    call = _metadata_call(src, src.find_def(builder, "build"), where)
    keywords = {k.arg: k for k in call.keywords}
    if "asm_split=asm_split," not in src.segment(call):
        if "asm_scales" not in keywords:
            raise src.moved(f"{where}: RocmAttentionMetadata(...) has no asm_scales=")
        src.add_item_after(keywords["asm_scales"], "asm_split=asm_split")

    _after_capture_build(src, _SPLIT_CAPTURE, "asm_split")

    forward = src.find_def("RocmAttentionImpl", "forward")
    where = "RocmAttentionImpl.forward"
    if not src.carries(_SPLIT_FORWARD, "asm_split", forward, where):
        call = src.call_statement(forward, "chunked_prefill_paged_decode", where)
        src.insert_after_line(src.comment_start(call) - 1, _SPLIT_FORWARD)
    forward = src.find_def("RocmAttentionImpl", "forward")
    call = src.call_statement(forward, "chunked_prefill_paged_decode", where)
    assert isinstance(call.value, ast.Call)
    keywords = {k.arg: k for k in call.value.keywords}
    if "prefill_only=split is not None," not in src.segment(call):
        if "causal" not in keywords:
            raise src.moved(f"{where}: chunked_prefill_paged_decode(...) has no causal=")
        src.add_item_after(keywords["causal"], "prefill_only=split is not None")
    forward = src.find_def("RocmAttentionImpl", "forward")
    if not src.carries(_SPLIT_DECODE, "split.decode_block_table", forward, where):
        ret = forward.body[-1]
        if not (isinstance(ret, ast.Return) and ast.unparse(ret) == "return output"):
            raise src.moved(f"{where} does not end in `return output`")
        src.insert_after_line(ret.lineno - 1, _SPLIT_DECODE.rstrip("\n") + "\n")


def stage2_paged_decode(src: Source) -> None:
    """``chunked_prefill_paged_decode(..., prefill_only=False)``: with True it runs the
    prefill kernel alone (the same call as without it) and returns."""
    fn = src.find_def("chunked_prefill_paged_decode")
    where = "chunked_prefill_paged_decode"
    if not src.carries("    prefill_only: bool = False,\n", "prefill_only", fn, where):
        causal = next((a for a in fn.args.args if a.arg == "causal"), None)
        if causal is None or fn.args.args[-1] is not causal:
            raise src.moved(f"{where}: causal is not its last argument")
        default = fn.args.defaults[-1]
        src.add_item_after(default, "prefill_only: bool = False", causal.col_offset)
    fn = src.find_def("chunked_prefill_paged_decode")
    if not src.carries(_PREFILL_ONLY, "if prefill_only", fn, where):
        prefill = next(
            (
                n
                for n in fn.body
                if isinstance(n, ast.If) and ast.unparse(n.test) == "max_query_len > 1"
            ),
            None,
        )
        if prefill is None:
            raise src.moved(f"{where}: no `if max_query_len > 1:` prefill block")
        src.insert_after_line(
            prefill.end_lineno or prefill.lineno, "\n" + _PREFILL_ONLY.rstrip("\n")
        )


# --------------------------------------------------------------------------------------
# Stage 3


# Stage 1's binding, with the tables from the shared helper (aliased; a layer's own
# where its scales come from the checkpoint) instead of plain ones by value. Stage 1's
# reload check refills them as it refilled its own.
_STAGE_3_BIND = (
    _STAGE_1_BIND.replace(_STAGE_1_TABLES_DECL, "")
    .replace(_STAGE_1_CAP, _STAGE_1_CAP.split("\n", 1)[1])  # no cap: no keys
    .replace(_STAGE_1_TABLE_GATE, "")
    .replace(
        _STAGE_1_TABLES,
        "            self._asm_scales[layer] = self._asm_tables.get(layer, shape)\n",
    )
    .replace(
        "for layer, (k_scale, v_scale) in self._asm_filled.items():",
        "for layer in self._asm_filled:",
    )
)
assert all(
    t in _STAGE_1_BIND
    for t in (_STAGE_1_TABLES, _STAGE_1_TABLES_DECL, _STAGE_1_CAP, _STAGE_1_TABLE_GATE)
)
assert not re.search(r"\bkeys\b|tables > 4", _STAGE_3_BIND)  # every trace of the cap replaced

_TABLES_INIT = """\
        # Per-slot scale tables for AITER's asm decode, released with this builder.
        self._asm_tables = AsmScaleTables(device)"""

_FOLLOW_RELOAD = """\
        # A weight reload sets new KV scales: their tables are refilled in place.
        self._asm_tables.follow_reload()
"""

_FA_TABLES_LOOP = """\
        for layer_name in self.layer_names:
            layer = attn_layers[layer_name]
            shape = (layer.kv_cache.shape[0], self.num_heads_kv, self.block_size)
            k_scale_tables[layer_name], v_scale_tables[layer_name] = (
                self._asm_tables.get(layer, shape)
            )"""

_FA_OLD_COMMENT = """\
        # [num_blocks, num_kv_heads, block_size] scale table per layer. Map each
        # layer to the shared table for its scale once the KV cache is bound.
"""
_FA_COMMENT = """\
        # [num_blocks, num_kv_heads, block_size] scale table per layer, made once
        # the KV cache is bound (AsmScaleTables).
"""


def stage3_rocm_attn(src: Source) -> None:
    src.ensure_import("vllm.v1.attention.backends.asm_scale_tables", "AsmScaleTables")
    builder = "RocmAttentionMetadataBuilder"
    init = src.find_def(builder, "__init__")
    _append_to_body(src, init, _TABLES_INIT, "self._asm_tables =", f"{builder}.__init__")
    bind = src.find_def(builder, "_bind_asm_decode")
    if not src.carries(_STAGE_3_BIND, "self._asm_tables.get(", bind, f"{builder}.bind"):
        start = (bind.decorator_list[0] if bind.decorator_list else bind).lineno
        if "    " + src.segment(bind) not in _STAGE_1_BIND:
            raise src.moved(f"{builder}._bind_asm_decode is not stage 1's")
        src.replace_lines(start, bind.end_lineno or start, _STAGE_3_BIND.strip("\n"))


def stage3_rocm_aiter_fa(src: Source) -> None:
    """``ROCM_AITER_FA``'s tables from the same helper: aliased, per layer where the
    scales come from the checkpoint, refilled after a reload; ``AsmKvScaleTables`` goes."""
    src.ensure_import("vllm.v1.attention.backends.asm_scale_tables", "AsmScaleTables")
    builder = "AiterFlashAttentionMetadataBuilder"
    where = f"{builder}._build_asm_kv_scale_tables"
    tables = src.find_def(builder, "_build_asm_kv_scale_tables")
    if not src.carries(_FA_TABLES_LOOP, "self._asm_tables.get(", tables, where):
        loop = next(
            (
                n
                for n in tables.body
                if isinstance(n, ast.For) and ast.unparse(n.iter) == "self.layer_names"
            ),
            None,
        )
        if loop is None or "self.asm_kv_scale_tables.get(" not in src.segment(loop):
            raise src.moved(f"{where}: no loop over self.layer_names of asm_kv_scale_tables")
        src.replace_lines(loop.lineno, loop.end_lineno or loop.lineno, _FA_TABLES_LOOP)
    # The method's comment: the tables are no longer one shared table per scale.
    src.text = src.text.replace(_FA_OLD_COMMENT, _FA_COMMENT, 1)
    tables = src.find_def(builder, "_build_asm_kv_scale_tables")
    if not src.carries(_FOLLOW_RELOAD, "follow_reload", tables, where):
        first = next((n for n in tables.body if isinstance(n, ast.If)), None)
        if first is None:
            raise src.moved(f"{where}: no early return")
        src.insert_after_line(src.comment_start(first) - 1, _FOLLOW_RELOAD.rstrip("\n"))
    init = src.find_def(builder, "__init__")
    _append_to_body(src, init, _TABLES_INIT, "self._asm_tables =", f"{builder}.__init__")
    # AsmKvScaleTables and the builder's class-wide instance of it are no longer used.
    cls = src.find(builder)
    store = next(
        (
            n
            for n in cls.body
            if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "asm_kv_scale_tables"
        ),
        None,
    )
    if store is not None:
        lines = src.lines
        del lines[store.lineno - 1 : store.end_lineno or store.lineno]
        if not lines[store.lineno - 1].strip() and not lines[store.lineno - 2].strip():
            del lines[store.lineno - 1]
        src.text = "\n".join(lines)
    old = next(
        (
            n
            for n in src.tree().body
            if isinstance(n, ast.ClassDef) and n.name == "AsmKvScaleTables"
        ),
        None,
    )
    if old is not None:
        first = (old.decorator_list[0] if old.decorator_list else old).lineno
        lines = src.lines
        del lines[first - 1 : (old.end_lineno or first) + 2]  # and two blank lines
        src.text = "\n".join(lines)
    if "field(" not in src.text:
        src.text = src.text.replace(
            "from dataclasses import dataclass, field, replace",
            "from dataclasses import dataclass, replace",
        )


def stage3_scale_tables(text: str | None) -> str:
    """The new module: the runtime's ``asm_scale_tables.py`` with vLLM's header."""
    return SPDX + (_RUNTIME_DIR / "asm_scale_tables.py").read_text(encoding="utf-8")


#: Each stage's edits, by file (a new file's edit gets None and returns its text).
STAGES: dict[int, dict[Path, Callable[[Source], None]]] = {
    1: {
        ROCM_ATTN: stage1_rocm_attn,
        AITER_OPS: stage1_aiter_ops,
        ATTENTION_CONFIG: stage1_attention_config,
    },
    2: {ROCM_ATTN: stage2_rocm_attn, PAGED_DECODE: stage2_paged_decode},
    3: {ROCM_ATTN: stage3_rocm_attn, ROCM_AITER_FA: stage3_rocm_aiter_fa},
}
#: New files each stage writes, and how.
NEW_FILES: dict[int, dict[Path, Callable[[str | None], str]]] = {
    3: {SCALE_TABLES: stage3_scale_tables},
}
