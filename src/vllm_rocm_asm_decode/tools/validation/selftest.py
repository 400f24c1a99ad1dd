"""Probes of the installed asm kernel through the backend: real vLLM layers, KV cache and
metadata builder (:mod:`..testbed`), the step the builder decides, ``impl.forward``.

* :func:`accuracy_probe`: a decode batch above the cut against an fp32 reference, with
  the tolerance of ``check accuracy`` (bf16 or fp16 queries).
* :func:`block_id_probe`: a pool whose pages reach past 4 GiB; sequences on high blocks
  and on the blocks a misreading AITER (before 0.1.17) would read instead (``id &
  0xFFFF``, or a byte offset wrapped at 4 GiB) hold different data, so such an AITER
  answers with the other block's data, and the probe names it.
* :func:`padding_probe`: CUDA-graph padding rows (length 0, null block) beside real ones;
  the padding rows must stay finite (a NaN there can reach real tokens through a
  per-tensor dynamic quantization downstream).
* :func:`page_span_probe`: a pool whose pages reach 2 GiB apart; the page-span guard's
  bind-time probe on it (one sequence over pages alternating between the pool's two ends
  against the same content on adjacent pages, bit for bit): the proof the trust switch
  stands in for.
* :func:`scale_table_probe`: two layers with distinct per-layer checkpoint scales on the
  tables the backend makes (aliased where the GPU offers virtual memory), against fp32;
  then a weight reload between two replays of a captured CUDA graph, which must read
  the new scales.

``doctor`` and ``check accuracy`` run them on a gfx942/gfx950 GPU; the tests run them on
the CPU against the contract model. Each returns a :class:`Check`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from ... import page_span, settings
from ...aiter_version import BLOCK_ID_LIMIT, OFFSET_LIMIT, safe_blocks
from .. import testbed
from .check import Check
from .tolerances import MAX_TOL, MEAN_TOL

#: Context lengths of the accuracy probe (those of ``check accuracy``).
ACCURACY_CONTEXTS = (1, 15, 16, 17, 255, 1000, 4000)


def sequences_above_cut(heads: int) -> int:
    """Sequences just above the cut for ``heads`` query heads per sequence."""
    from vllm.utils.platform_utils import num_compute_units

    from ...eligibility import resolve_cut

    return resolve_cut(num_compute_units(), settings.cut_override()) // heads + 1


def _errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    diff = (out.float().cpu() - ref).abs()
    return float(diff.max()), float(diff.mean())


def _forward(model: testbed.Model, batch: testbed.Batch, out: torch.Tensor):
    """One step of the model's one layer: the cache write, then ``impl.forward`` into
    ``out``; returns the step's metadata."""
    name = model.names[0]
    layer = model.layers[name]
    testbed.write_step(model, batch)
    metadata = model.builder.build(0, batch.common)
    layer.impl.forward(layer, batch.query, batch.key, batch.value, layer.kv_cache, metadata, out)
    if out.is_cuda:
        torch.cuda.synchronize()
    return metadata


def _not_asm(model: testbed.Model) -> str:
    from ...kernel import current_arch, load_asm_kernel

    impl = model.layers[model.names[0]].impl
    _, unavailable = load_asm_kernel(current_arch(), settings.trust_aiter())
    if unavailable is not None:
        why = unavailable
    elif impl.asm_rejections:
        why = "; ".join(impl.asm_rejections)
    else:
        why = "the step stayed at or below the cut"
    return f"the asm path was not taken ({why})"


@contextlib.contextmanager
def _one_layer(
    device: str,
    heads: tuple[int, int],
    num_blocks: int,
    dtype: torch.dtype = torch.bfloat16,
    num_layers: int = 1,
) -> Iterator[testbed.Model]:
    """A model of real vLLM layers, KV cache and builder in a scratch directory."""
    with tempfile.TemporaryDirectory(prefix="asm-decode-selftest-") as tmp:
        yield testbed.build_model(
            Path(tmp),
            num_heads=heads[0],
            num_kv_heads=heads[1],
            num_layers=num_layers,
            num_blocks=num_blocks,
            dtype=str(dtype).removeprefix("torch."),
            device=device,
        )


@contextlib.contextmanager
def _trusting_aiter() -> Iterator[None]:
    """Let what the plugin trusts only once proven (a pool past 65536 blocks, fp16
    queries) reach the kernel, to see what the kernel does there."""
    from ...kernel import load_asm_kernel

    old = os.environ.get(settings.TRUST_ENV)
    os.environ[settings.TRUST_ENV] = "1"
    load_asm_kernel.cache_clear()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(settings.TRUST_ENV, None)
        else:
            os.environ[settings.TRUST_ENV] = old
        load_asm_kernel.cache_clear()


def accuracy_probe(
    device: str, dtype: torch.dtype = torch.bfloat16, heads: tuple[int, int] = (40, 8)
) -> Check:
    """A decode batch above the cut, contexts 1..4000, against fp32 (fp16 queries with the
    trust switch on: this probe is the proof it asks for)."""
    name = f"selftest-accuracy-{str(dtype).removeprefix('torch.')}"
    num_heads, num_kv_heads = heads
    contexts = ACCURACY_CONTEXTS
    n = max(sequences_above_cut(num_heads), len(contexts))
    seq_lens = [contexts[i % len(contexts)] for i in range(n)]
    num_blocks = sum(-(-s // 16) for s in seq_lens) + 8
    trust = _trusting_aiter() if dtype == torch.float16 else contextlib.nullcontext()
    with trust, _one_layer(device, heads, num_blocks, dtype) as model:
        batch = testbed.make_batch(model, seq_lens, dtype=dtype, seed=1)
        testbed.fill_context(model, batch)
        out = torch.zeros_like(batch.query)
        if not _forward(model, batch, out).use_asm_decode:
            return Check(name, False, _not_asm(model))
        ref = testbed.reference(model, batch, model.layers[model.names[0]])
    max_err, mean_err = _errors(out, ref)
    ok = max_err <= MAX_TOL and mean_err <= MEAN_TOL
    return Check(
        name,
        ok,
        f"{n} sequences, {num_heads}/{num_kv_heads} heads: max |error| {max_err:.4f} "
        f"(<= {MAX_TOL}), mean {mean_err:.5f} (<= {MEAN_TOL})",
    )


def probe_pool_blocks(heads: tuple[int, int]) -> int:
    """A pool whose K (and V) pages reach past 4 GiB, for fp8 pages of these heads."""
    return 2**32 // _page_bytes(heads) + 2


def _page_bytes(heads: tuple[int, int]) -> int:
    return heads[1] * 128 * 16  # fp8: one byte per value, head size 128, 16-token blocks


def _probe_blocks(num_blocks: int, page_bytes: int) -> dict[int, list[tuple[int, str]]]:
    """The high blocks to read and, for each, the blocks the known misreadings read
    instead: the 16-bit block id of AITER's regression test, a 32-bit byte offset."""
    wrap = 2**32 // page_bytes
    candidates = (
        BLOCK_ID_LIMIT + 1,
        67000,
        OFFSET_LIMIT // page_bytes + 5,
        wrap + 1,
        num_blocks - 1,
    )
    probes: dict[int, list[tuple[int, str]]] = {}
    for block in sorted(c for c in candidates if safe_blocks(page_bytes) <= c < num_blocks):
        kinds: dict[int, list[str]] = {}
        kinds.setdefault(block & 0xFFFF, []).append("id & 0xFFFF")
        if block >= wrap:
            kinds.setdefault(block % wrap, []).append("byte offset mod 4 GiB")
        probes[block] = [(a, ", or ".join(k)) for a, k in kinds.items() if a != block]
    return probes


def block_id_probe(
    device: str, heads: tuple[int, int] = (40, 8), pool_blocks: int | None = None
) -> Check:
    """Sequences on high blocks (ids >= 65536, pages past 2 and 4 GiB, the pool's last
    block) and on the blocks an AITER before 0.1.17 would read instead, in one batch.

    The default pool (8 KV heads, 16 KiB fp8 pages, past 4 GiB: about 8.6 GB of K and V)
    covers the byte offsets of a large deployment; AITER's regression test saw the misread
    only at production page sizes.
    """
    name = "selftest-block-id"
    page = _page_bytes(heads)
    num_blocks = pool_blocks or probe_pool_blocks(heads)
    probes = _probe_blocks(num_blocks, page)
    high = list(probes)
    aliases = sorted({a for found in probes.values() for a, _ in found} - set(high))
    used = set(high) | set(aliases)
    n = max(sequences_above_cut(heads[0]), len(used))
    filler = [b for b in range(100, 100 + 2 * n) if b not in used][: n - len(used)]
    blocks = [*high, *aliases, *filler]
    row = {block: i for i, block in enumerate(blocks)}
    with _trusting_aiter(), _one_layer(device, heads, num_blocks) as model:
        batch = testbed.make_batch(model, [16] * n, pages=[[b] for b in blocks], seed=2)
        testbed.fill_context(model, batch)
        out = torch.zeros_like(batch.query)
        if not _forward(model, batch, out).use_asm_decode:
            return Check(name, False, _not_asm(model))
        layer = model.layers[model.names[0]]
        ref = testbed.reference(model, batch, layer)
        # What each misreading would answer: a high row over its j-th alias's data.
        as_misread = []
        contexts = batch.contexts
        for j in range(max(len(found) for found in probes.values())):
            swapped = list(contexts)
            for block, found in probes.items():
                if j < len(found):
                    swapped[row[block]] = contexts[row[found[j][0]]]
            batch.contexts = swapped
            as_misread.append(testbed.reference(model, batch, layer))
        batch.contexts = contexts
    gib = num_blocks * page / 2**30
    wrong = [b for b in high if _errors(out[row[b]], ref[row[b]])[0] > MAX_TOL]
    if not wrong:
        return Check(
            name,
            True,
            f"blocks {', '.join(map(str, high))} of a {num_blocks}-block pool "
            f"({page} bytes a page, {gib:.1f} GiB of K pages) read right",
        )
    block = wrong[0]
    how = f"block {block} read wrong bytes"
    for j, (alias, kind) in enumerate(probes[block]):
        if _errors(out[row[block]], as_misread[j][row[block]])[0] <= MAX_TOL:
            how = f"block {block} was read as block {alias} ({kind})"
    return Check(
        name,
        False,
        f"{how}: this AITER misreads high KV blocks; keep {settings.TRUST_ENV} unset (large caches "
        "then keep the HIP decode) and upgrade AITER to 0.1.17 or later",
    )


def page_span_pool_blocks(heads: tuple[int, int]) -> int:
    """A pool whose first and last usable pages lie 2 GiB apart, for fp8 pages of these
    heads (block 0 is vLLM's null block)."""
    return page_span.SPAN_LIMIT // _page_bytes(heads) + 2


def page_span_probe(
    device: str, heads: tuple[int, int] = (40, 8), pool_blocks: int | None = None
) -> Check:
    """The page-span guard's probe (:func:`..page_span.probe`, the one each worker makes
    at bind time) on a pool whose pages reach 2 GiB apart."""
    name = "selftest-page-span"
    num_blocks = pool_blocks or page_span_pool_blocks(heads)
    n = sequences_above_cut(heads[0])
    with _trusting_aiter(), _one_layer(device, heads, num_blocks) as model:
        batch = testbed.make_batch(model, [16] * n, seed=5, contexts=False)
        if not model.builder.build(0, batch.common).use_asm_decode:
            return Check(name, False, _not_asm(model))
        binding = model.builder.binding(model.names[0])
        reach = page_span.describe(binding.key_cache)
        if not page_span.reaches(binding.key_cache):
            return Check(name, False, f"a {num_blocks}-block pool reaches {reach}: too small")
        problem = page_span.probe(binding, heads[0])
    if problem is None:
        return Check(
            name,
            True,
            f"pages {reach} apart read like adjacent ones ({num_blocks}-block pool, "
            f"{_page_bytes(heads)} bytes a page)",
        )
    return Check(
        name,
        False,
        f"{problem}: keep {settings.TRUST_ENV} unset (each worker then probes at bind time "
        "and large caches keep the HIP decode where it fails)",
    )


#: What the padding probe fills the output with before its second step: a finite value
#: no attention output of the probe's data reaches, exact in bf16 and fp16.
PADDING_SENTINEL = -4096.0


def padding_probe(device: str, heads: tuple[int, int] = (40, 8)) -> Check:
    """Real rows and CUDA-graph padding rows in one asm step. Run once into an output
    filled with NaN (a real row left unwritten stays NaN and fails) and once into one
    filled with :data:`PADDING_SENTINEL` (a padding row that differs from it was
    written): padding rows may be left as they were or written finite, never written
    non-finite; real rows must match the reference."""
    name = "selftest-padding-rows"
    n = sequences_above_cut(heads[0])
    with _one_layer(device, heads, n * 8 + 8) as model:
        batch = testbed.make_batch(model, [100] * n, pad_to=n + 8, seed=3)
        testbed.fill_context(model, batch)
        nan_filled = torch.full_like(batch.query, float("nan"))
        if not _forward(model, batch, nan_filled).use_asm_decode:
            return Check(name, False, _not_asm(model))
        marked = torch.full_like(batch.query, PADDING_SENTINEL)
        _forward(model, batch, marked)
        ref = testbed.reference(model, batch, model.layers[model.names[0]])
    real = nan_filled[:n].float().cpu()
    unwritten = int((~torch.isfinite(real)).flatten(1).any(1).sum())
    padding = marked[n:].float().cpu().flatten(1)
    written = (padding != PADDING_SENTINEL).any(1)
    bad = int((written & ~torch.isfinite(padding).all(1)).sum())
    max_err = _errors(real, ref[:n])[0] if not unwritten else float("inf")
    ok = not bad and max_err <= MAX_TOL
    pad = (
        f"{bad} of 8 padding rows written NOT finite"
        if bad
        else f"8 padding rows {'written, finite' if written.any() else 'left as they were'}"
    )
    rows = (
        f"{unwritten} of {n} real rows not written (NaN left)"
        if unwritten
        else f"real rows max |error| {max_err:.4f} (<= {MAX_TOL})"
    )
    return Check(name, ok, f"{pad}; {rows}")


def _replayable(run, out: torch.Tensor):
    """``run`` captured in a CUDA graph (warmed up on a side stream), as vLLM's FULL
    graphs hold a decode step; on the CPU, ``run`` itself."""
    if not out.is_cuda:
        return run
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


def scale_table_probe(device: str, heads: tuple[int, int] = (40, 8)) -> Check:
    """Per-layer scale tables, aliased where the GPU offers virtual memory, and a weight
    reload between two replays of a captured graph."""
    name = "selftest-scale-tables"
    n = sequences_above_cut(heads[0])
    with _one_layer(device, heads, n * 8 + 8, num_layers=2) as model:
        for i, layer in enumerate(model.layers.values()):
            testbed.load_checkpoint_scales(layer, 0.5 + i / 4, 1.5 - i / 4)
        batch = testbed.make_batch(model, [100] * n, seed=4)
        testbed.fill_context(model, batch)
        testbed.write_step(model, batch)
        metadata = model.builder.build(0, batch.common)
        if not metadata.use_asm_decode:
            return Check(name, False, _not_asm(model))
        tables = model.builder.asm_bindings.tables
        kind = "aliased" if tables.aliased else "allocated in full"
        errors = []
        outs = {nm: torch.zeros_like(batch.query) for nm in model.names}
        for nm, layer in model.layers.items():
            layer.impl.forward(
                layer, batch.query, batch.key, batch.value, layer.kv_cache, metadata, outs[nm]
            )
            errors.append(_errors(outs[nm], testbed.reference(model, batch, layer))[0])
        first = model.layers[model.names[0]]
        out = outs[model.names[0]]

        def step() -> None:
            first.impl.forward(
                first, batch.query, batch.key, batch.value, first.kv_cache, metadata, out
            )

        replay = _replayable(step, out)
        replay()
        errors.append(_errors(out, testbed.reference(model, batch, first))[0])
        # A weight reload: new scales copied into the layer's tensors, new floats; the
        # cache then holds tokens written at them; the next build refills the tables.
        k, v = 2 * first._k_scale_float, 2 * first._v_scale_float
        first._k_scale.data.fill_(k)
        first._v_scale.data.fill_(v)
        first._k_scale_float, first._v_scale_float = k, v
        testbed.fill_context(model, batch)
        testbed.write_step(model, batch)
        model.builder.build(0, batch.common)
        replay()
        if out.is_cuda:
            torch.cuda.synchronize()
        after = _errors(out, testbed.reference(model, batch, first))[0]
    ok = max(errors) <= MAX_TOL and after <= MAX_TOL
    replayed = "graph replay" if out.is_cuda else "step"
    return Check(
        name,
        ok,
        f"2 layers with their own K/V tables ({kind}, {len(tables.tables())} tables): max "
        f"|error| {max(errors):.4f}; after a reload, the {replayed} read the refilled "
        f"tables: max |error| {after:.4f} (<= {MAX_TOL})",
    )


def run_all(
    device: str, block_id_heads: tuple[int, int] = (40, 8), block_id_pool: int | None = None
) -> list[Check]:
    """Every probe, in the order ``doctor`` reports them. A probe that raises (a failed
    launch, an out-of-memory) is a failed check whose detail is the error's first line."""
    probes = [
        ("selftest-accuracy-bfloat16", lambda: accuracy_probe(device, torch.bfloat16)),
        ("selftest-accuracy-float16", lambda: accuracy_probe(device, torch.float16)),
        ("selftest-block-id", lambda: block_id_probe(device, block_id_heads, block_id_pool)),
        ("selftest-page-span", lambda: page_span_probe(device, block_id_heads)),
        ("selftest-padding-rows", lambda: padding_probe(device)),
        ("selftest-scale-tables", lambda: scale_table_probe(device)),
    ]
    checks = []
    for name, probe in probes:
        try:
            checks.append(probe())
        except Exception as exc:
            text = str(exc).strip().splitlines()
            checks.append(Check(name, False, f"{type(exc).__name__}: {text[0] if text else ''}"))
    return checks
