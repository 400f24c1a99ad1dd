"""The plugin's page-span guard: whether AITER's asm kernel reads the pages of one
sequence right when they lie far apart in the KV cache.

AITER's fix for block ids >= 65536 (commit b847e4d8, in every release from 0.1.17)
describes two addressings: its message a rebase of each wave's pages on the wave's
lowest page, "as long as max_page_id - min_page_id < 65536" (a 32-bit byte offset: at
32 KiB pages, a distance below 2**31 bytes); its squashed history and regression test
(``op_tests/test_pa_block_id_truncation.py``) 64-bit ``global_load`` addressing, which
for the fp8 kernels they place "in the *_MTP variants" (the one-token decode kernel is
not one). The test reads one page per sequence, so the span is never exercised there.
The shipped code objects answer it: from b847e4d8 on, the one-token uhp kernels (gfx942
and gfx950, bf16 and fp16) load each K/V page at its own 64-bit address
(``scripts/aiter-pa-addressing``), so they read far pages right. The guard stays for
what no source shows: an AITER built otherwise (a wheel of other code objects). In vLLM
a long request's neighbouring pages can come from opposite ends of the pool once its
free-block queue has wrapped: on a 183k-block MI355X cache, sooner or later every long
request's.

So a layer whose cache can hold two pages :data:`SPAN_LIMIT` bytes apart keeps the
HIP decode unless this GPU proved it reads such pages right. :func:`probe` proves it
at bind time, on the layer's own cache before it serves: a fingerprint written into
pages at both ends of the cache; one sequence whose consecutive pages alternate between
the two ends and one over the same content on adjacent pages, in one launch; their
outputs must be equal bit for bit; the pages are restored. One host read; never inside
a CUDA-graph capture. The answer is kept for the process, per cache geometry. Where it
cannot be made, ``doctor``'s self-test makes the same probe and the trust switch
admits.
"""

from __future__ import annotations

from typing import Any

import torch

from .core import asm_decode

#: Byte distance between two pages of one wave from which AITER's rebase may misread.
SPAN_LIMIT = 2**31
#: Pages of each probe sequence (half at each end of the cache).
PROBE_PAGES = 32

#: Probe answers of this process, by cache geometry.
_PROVEN: dict[tuple, str | None] = {}


def page_bytes(key_cache: torch.Tensor) -> int:
    """Bytes from one K page to the next (the block stride AITER's launcher passes)."""
    return key_cache.stride(0) * key_cache.element_size()


def span(key_cache: torch.Tensor) -> int:
    """The bytes between the two pages of the cache farthest apart that vLLM can hand a
    request: blocks 1 and ``num_blocks - 1`` (block 0 is its null block)."""
    return (key_cache.shape[0] - 2) * page_bytes(key_cache)


def reaches(key_cache: torch.Tensor) -> bool:
    """Whether the cache can hold two pages :data:`SPAN_LIMIT` bytes apart or more."""
    return span(key_cache) >= SPAN_LIMIT


def describe(key_cache: torch.Tensor) -> str:
    """How far apart two pages of the cache can be, for logs."""
    return f"{span(key_cache) / 2**30:.1f} GiB"


def probe_pages(num_blocks: int) -> tuple[list[int], list[int]]:
    """The far sequence's pages, alternating between the two ends of the cache from
    the farthest pair in (blocks 1 and ``num_blocks - 1``), and the near one's,
    adjacent, beside the low end."""
    half = PROBE_PAGES // 2
    low = range(1, 1 + half)
    high = range(num_blocks - 1, num_blocks - 1 - half, -1)
    far = [page for pair in zip(low, high, strict=True) for page in pair]
    near = list(range(1 + half, 1 + half + PROBE_PAGES))
    return far, near


def probe(binding: Any, num_heads: int) -> str | None:
    """Run the kernel on a layer binding's cache views (``key_cache``, ``value_pages``,
    ``scales``, ``query_dtype``: the backend's ``AsmLayerBinding``) over far-apart and
    over adjacent pages of the same content; None when both read alike, else what
    differed. The cache's pages are as they were afterwards."""
    key, value = binding.key_cache, binding.value_pages
    device, num_blocks = key.device, key.shape[0]
    far, near = probe_pages(num_blocks)
    if num_blocks < 2 * PROBE_PAGES + 2:
        return f"a cache of {num_blocks} blocks is too small to probe"
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return "the page-span probe cannot run inside a CUDA-graph capture"
    touched = torch.tensor(far + near, device=device)
    far_t, near_t = touched[: len(far)], touched[len(far) :]
    k_bytes, v_bytes = key.view(torch.uint8), value.view(torch.uint8)
    saved = k_bytes[touched].clone(), v_bytes[touched].clone()
    gen = torch.Generator(device=device).manual_seed(2**31 - 1)
    try:
        for pages, side in ((k_bytes, key), (v_bytes, value)):
            content = torch.rand(
                (len(far), *side.shape[1:]), generator=gen, device=device
            ).sub_(0.5)
            fingerprint = content.to(side.dtype).view(torch.uint8)
            pages[far_t] = fingerprint
            pages[near_t] = fingerprint
        head_size = key.shape[2] * key.shape[4]
        one = torch.rand((1, num_heads, head_size), generator=gen, device=device)
        query = one.to(binding.query_dtype).expand(2, -1, -1).contiguous()
        block_table = torch.tensor([far, near], dtype=torch.int32, device=device)
        tokens = PROBE_PAGES * key.shape[3]
        seq_lens = torch.full((2,), tokens, dtype=torch.int32, device=device)
        out = torch.empty_like(query)
        asm_decode(query, key, value, block_table, seq_lens, binding.scales, out)
        same = torch.equal(out[0], out[1])  # the one host read
    finally:
        k_bytes[touched] = saved[0]
        v_bytes[touched] = saved[1]
    if same:
        return None
    return (
        f"AITER's asm kernel read KV pages {describe(key)} apart unlike adjacent ones "
        "(the bind-time page-span probe)"
    )


def proven(binding: Any, num_heads: int) -> str | None:
    """:func:`probe` once per cache geometry in this process: None when this GPU reads
    far-apart pages right, else why the layers keep HIP."""
    key = binding.key_cache
    geometry = (
        str(key.device),
        tuple(key.shape),
        page_bytes(key),
        num_heads,
        binding.query_dtype,
    )
    if geometry not in _PROVEN:
        try:
            _PROVEN[geometry] = probe(binding, num_heads)
        except Exception as exc:  # a launch the kernel refused: unproven, not a crash
            first = (str(exc).strip().splitlines() or [""])[0]
            return (
                f"KV pages {describe(key)} apart are unproven: the page-span probe "
                f"failed ({type(exc).__name__}: {first})"
            )
    return _PROVEN[geometry]
