"""An executable model of ``aiter.pa_fwd_asm``'s contract, for machines without an AMD GPU.

The asm kernel's binary is not readable, so this model encodes what is known of it
(AITER's C++ launcher, and AMD's description of how the kernel addresses memory):

* It raises where the launcher raises: head size other than 128, a query dtype other
  than bf16/fp16, a KV dtype it has no name for (an fp8 dtype other than the GPU's own,
  :data:`FP8_BY_ARCH`, included), and any request with no kernel row in the
  architecture's table (:class:`~vllm_rocm_asm_decode.kernel_table.KernelTable`).
* It reads K and V as **dense pages from their own base pointers**:
  K ``[num_blocks, num_kv_heads, head_size/x, block_size, x]`` and V
  ``[num_blocks, num_kv_heads, block_size/x, head_size, x]`` (x = 16 bytes / element),
  page ``p`` starting ``p * num_kv_heads * head_size * block_size`` elements after the
  base, whatever strides the tensors claim. A cache whose pages are not dense (vLLM's
  LBHNC layout, where K and V pages alternate) therefore reads wrong bytes here, as it
  would on the GPU.
* It reads the query with its row stride but dense heads and dims, block-table rows with
  ``block_tables_stride0``, per-slot fp32 scales as dense ``[num_blocks, num_kv_heads,
  block_size]`` tables, and writes ``out_`` densely (``[batch, num_heads, head_size]``
  from its base pointer).
* The softmax scale is ``1/sqrt(head_size)``, computed in float32; there is no argument
  for it.
* The batch is ``context_lens.size(0)``. A sequence of length 0 (vLLM's CUDA-graph
  padding rows) has its output row **written NaN**, as the uhp kernels do
  (:data:`EMPTY_ROW`): a caller must pass lengths of at least 1.
* ``block_id_mask`` models AITER before 0.1.17, whose kernels read block id ``b`` as
  ``b & 0xFFFF`` (pass ``0xFFFF``); the default models the fixed kernels.
* ``span_limit`` models the fixed kernels' own limit (AITER commit b847e4d8, "min-based
  anchor rebase", its message: pages of one wave may lie in different 65536-block
  windows "as long as max_page_id - min_page_id < 65536"): each wave's page addresses are
  a 32-bit byte offset from the wave's lowest page, so a page whose offset reaches
  ``span_limit`` (2**31) is read at the offset wrapped to a signed 32-bit value. Which
  pages share a wave is not in any source: the model takes ``wave_pages`` consecutive
  pages of a sequence. AITER's shipped one-token uhp kernels do not misread so: their
  code objects from b847e4d8 on (gfx942 and gfx950, bf16 and fp16) load each K/V page at
  its own 64-bit address (``scripts/aiter-pa-addressing``); the rebase is a build this
  models so that the plugin's bind-time probe is exercised, and the stand-in AITER
  misreads by default, stricter than the shipped kernels, never kinder.
* :func:`launch_shape` is AITER's launch (``csrc/py_itfs_cu/asm_pa.cu``: grid ``(kv
  heads, batch, 1)``, 256 threads), and :class:`KernelTimeModel` its time, fitted to the
  original change's kernel table (:func:`fit_time_model`).

Numerics are fp32 math on dequantized values rounded once to the query dtype: the model
checks layout and semantics, not the kernel's precision modes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..kernel_table import KernelTable, dtype_name

#: What the uhp kernels write for a sequence of length 0. Their code objects
#: (``hsa/{gfx942,gfx950}/pa/pa_{bf16,fp16}_pertokenFp8_gqa8_2tg_4w_uhp.co``, ROCm/aiter
#: b847e4d8 to HEAD e4048607; disassembled with ``llvm-objdump --mcpu=gfx90a``; gfx950
#: bf16 addresses) take 0 pages (``s_add_u32 s73, s72, 15`` at 0x23DC), branch past every
#: page loop to the epilogue (0x2B44, 0x5E1C, to 0x758C), sum a softmax denominator that
#: nothing added to (``v42`` = 0 from 0x25B4), take ``v_rcp_f32`` of it (0x76B4: +inf) and
#: multiply the zero accumulators by it (0x76BC: NaN), then store the row (0x77C4) before
#: the kernel's only ``s_endpgm``. There is no early exit for an empty sequence.
EMPTY_ROW = math.nan
#: Where a wave's 32-bit page offset wraps (the fixed kernels' span limit).
SPAN_LIMIT = 2**31
#: Bytes of the buffer records through which the uhp kernels read the scale tables
#: (``s_mov_b32 s34, 0x80000000`` in their code objects, ROCm/aiter b847e4d8 and
#: HEAD e4048607; ``scripts/aiter-pa-addressing``): a float past them reads as 0.
SCALE_RECORDS = 2**31
#: Consecutive pages of a sequence the model takes as one wave's.
WAVE_PAGES = 4
#: The one fp8 dtype AITER passes to its kernels on each GPU (``defaultDtypes`` in
#: ``aiter/utility/dtypes.py``, ROCm/aiter HEAD e4048607): the other fp8 dtype has no
#: AITER dtype id there, and the conversion raises "Unsupported dtype" before any launch.
FP8_BY_ARCH = {"gfx942": torch.float8_e4m3fnuz, "gfx950": torch.float8_e4m3fn}


class LauncherError(RuntimeError):
    """Where AITER's launcher would raise (``AITER_CHECK`` failure)."""


def _within_records(table: torch.Tensor) -> torch.Tensor:
    """A scale table as the kernel reads it: zeros past :data:`SCALE_RECORDS` bytes."""
    flat = table.flatten().clone()
    flat[SCALE_RECORDS // flat.element_size() :] = 0
    return flat.view_as(table)


def _dense(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``t``'s memory from its base pointer, read as a dense tensor of ``shape``."""
    strides = []
    acc = 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= size
    return torch.as_strided(t, shape, tuple(reversed(strides)), t.storage_offset())


class PagedAttentionAsmModel:
    """Callable with ``aiter.pa_fwd_asm``'s signature; see the module docstring."""

    def __init__(
        self,
        table: KernelTable,
        block_id_mask: int | None = None,
        span_limit: int | None = None,
        wave_pages: int = WAVE_PAGES,
    ) -> None:
        self.table = table
        self.block_id_mask = block_id_mask
        self.span_limit = span_limit
        self.wave_pages = wave_pages

    def __call__(
        self,
        Q: torch.Tensor,
        K: torch.Tensor,
        V: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        block_tables_stride0: int,
        max_qlen: int = 1,
        K_QScale: torch.Tensor | None = None,
        V_QScale: torch.Tensor | None = None,
        out_: torch.Tensor | None = None,
        qo_indptr: torch.Tensor | None = None,
        high_precision: int | None = 1,
        kernelName: str | None = None,
    ) -> torch.Tensor:
        row = self.check(Q, K, max_qlen, qo_indptr, high_precision, kernelName)
        output = out_ if out_ is not None else torch.empty_like(Q)
        self._compute(
            Q,
            K,
            V,
            block_tables,
            context_lens,
            block_tables_stride0,
            K_QScale,
            V_QScale,
            output,
            fp8=row.kv_type == "fp8",
            block_id_mask=self.block_id_mask,
            span=(self.span_limit, self.wave_pages),
        )
        return output

    def check(
        self,
        Q: torch.Tensor,
        K: torch.Tensor,
        max_qlen: int = 1,
        qo_indptr: torch.Tensor | None = None,
        high_precision: int | None = 1,
        kernel_name: str | None = None,
    ):
        """The launcher's checks and kernel choice; raises :class:`LauncherError`."""
        head_size = Q.size(2)
        if head_size != 128:
            raise LauncherError(f"ASM PA only supports head_size=128, got {head_size}")
        q_type = dtype_name(Q.dtype)
        if q_type not in ("bf16", "fp16"):
            raise LauncherError(f"unsupported Q dtype: {Q.dtype}")
        kv_type = dtype_name(K.dtype)
        if kv_type is None:
            raise LauncherError(f"unsupported K dtype: {K.dtype}")
        if kv_type == "fp8" and K.dtype != FP8_BY_ARCH.get(self.table.arch):
            raise LauncherError(f"Unsupported dtype: {K.dtype} on {self.table.arch}")
        if kernel_name is not None:
            raise LauncherError("the contract model has no named-kernel mode")
        if qo_indptr is not None and max_qlen > 1:
            mtp, msk = max_qlen + 10, 1
        else:
            mtp, msk = 0, 0
        hp = {1: 1, 2: 2}.get(int(high_precision or 0), 0)
        gqa = Q.size(1) // K.size(1)
        row = self.table.find(
            q_type=q_type,
            kv_type=kv_type,
            gqa=gqa,
            block_size=K.size(3),
            high_precision=hp,
            mtp=mtp,
            msk=msk,
        )
        if row is None:
            raise LauncherError(
                f"cannot get heuristic kernel! arch:{self.table.arch} q_type:{q_type} "
                f"kv_type:{kv_type} gqa:{gqa} mtp:{mtp} msk:{msk} hp:{hp} "
                f"block_size:{K.size(3)}"
            )
        if mtp:
            raise LauncherError("the contract model covers single-token decode only")
        return row

    @staticmethod
    def _compute(
        Q: torch.Tensor,
        K: torch.Tensor,
        V: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        bt_stride0: int,
        k_scale: torch.Tensor | None,
        v_scale: torch.Tensor | None,
        out: torch.Tensor,
        fp8: bool,
        block_id_mask: int | None = None,
        span: tuple[int | None, int] = (None, WAVE_PAGES),
    ) -> None:
        batch = context_lens.size(0)
        num_heads, head_size = Q.size(1), Q.size(2)
        num_blocks, num_kv_heads, block_size = K.size(0), K.size(1), K.size(3)
        x = 16 // K.element_size()
        gqa = num_heads // num_kv_heads
        if fp8 and (k_scale is None or v_scale is None):
            raise LauncherError("an fp8 KV cache needs K_QScale and V_QScale")

        # The kernel's view of memory, ignoring every stride it is not given.
        k_pages = _dense(K, (num_blocks, num_kv_heads, head_size // x, block_size, x))
        v_pages = _dense(V, (num_blocks, num_kv_heads, block_size // x, head_size, x))
        q_rows = torch.as_strided(
            Q, (batch, num_heads, head_size), (Q.stride(0), head_size, 1), Q.storage_offset()
        )
        o_rows = _dense(out, (batch, num_heads, head_size))
        max_blocks = block_tables.size(1)
        bt_rows = torch.as_strided(
            block_tables, (batch, max_blocks), (bt_stride0, 1), block_tables.storage_offset()
        )
        if fp8:
            ks = _dense(k_scale, (num_blocks, num_kv_heads, block_size))
            vs = _dense(v_scale, (num_blocks, num_kv_heads, block_size))
            ks, vs = _within_records(ks), _within_records(vs)
        sm_scale = float(torch.tensor(1.0 / math.sqrt(head_size), dtype=torch.float32))

        for i, ctx in enumerate(context_lens.tolist()):
            if ctx <= 0:
                o_rows[i] = EMPTY_ROW
                continue
            n_pages = (ctx + block_size - 1) // block_size
            pages = bt_rows[i, :n_pages].long()
            if block_id_mask is not None:
                pages = pages & block_id_mask
            if span[0] is not None:
                pages = _rebased(pages, span[0], span[1], K.stride(0) * K.element_size())
                pages = pages % num_blocks  # a wrapped offset reads some other page
            # K: [pages, kvh, hd/x, bs, x] -> [kvh, tokens, hd]
            k = k_pages[pages].float().permute(1, 0, 3, 2, 4)
            k = k.reshape(num_kv_heads, n_pages * block_size, head_size)
            # V: [pages, kvh, bs/x, hd, x] -> [kvh, tokens, hd]
            v = v_pages[pages].float().permute(1, 0, 2, 4, 3)
            v = v.reshape(num_kv_heads, n_pages * block_size, head_size)
            if fp8:
                k = k * ks[pages].permute(1, 0, 2).reshape(num_kv_heads, -1, 1)
                v = v * vs[pages].permute(1, 0, 2).reshape(num_kv_heads, -1, 1)
            k, v = k[:, :ctx], v[:, :ctx]
            q = q_rows[i].float().view(num_kv_heads, gqa, head_size)
            scores = torch.einsum("hgd,htd->hgt", q, k) * sm_scale
            probs = torch.softmax(scores, dim=-1)
            o_rows[i] = (
                torch.einsum("hgt,htd->hgd", probs, v).reshape(num_heads, head_size).to(out.dtype)
            )


def _rebased(pages: torch.Tensor, limit: int, wave: int, page_bytes: int) -> torch.Tensor:
    """The pages a kernel reads that addresses each group of ``wave`` pages as a 32-bit
    byte offset from the group's lowest page: an offset from ``limit`` on wraps to a
    signed 32-bit value (``page_bytes``: the dense page stride)."""
    if (int(pages.max()) - int(pages.min())) * page_bytes < limit:
        return pages  # no two pages of the sequence that far apart
    read = pages.clone()
    for start in range(0, len(pages), wave):
        group = pages[start : start + wave]
        anchor = int(group.min())
        for i, page in enumerate(group.tolist()):
            offset = (page - anchor) * page_bytes
            if offset >= limit:
                wrapped = (offset + 2**31) % 2**32 - 2**31
                read[start + i] = anchor + wrapped // page_bytes
    return read


# --------------------------------------------------------------------------------------
# Launch shape and time

#: Threads of one workgroup (4 waves of 64), as AITER's launcher starts them.
WORKGROUP_THREADS = 256


def launch_shape(num_kv_heads: int, batch: int) -> tuple[tuple[int, int, int], int]:
    """AITER's launch of ``pa_fwd_asm`` (``csrc/py_itfs_cu/asm_pa.cu``, ROCm/aiter
    e4048607): grid ``(num_kv_heads, batch, 1)`` of 256-thread workgroups; each walks its
    sequence's whole context (no split of the context, no reduce)."""
    return (num_kv_heads, batch, 1), WORKGROUP_THREADS


@dataclass(frozen=True)
class KernelTimeModel:
    """Microseconds per ``impl.forward`` call of each decode, from host integers.

    asm: ``max(wg0 + wg_token x longest context, asm_head_token x head-tokens)``: one
    workgroup walks each (KV head, sequence), so the longest sequence bounds the step,
    and the whole batch is bound by bandwidth. HIP: ``hip0 + hip_head_token x
    head-tokens``: it splits contexts into 256-token partitions. Head-tokens are the sum
    of the contexts times the KV heads."""

    wg0_us: float
    wg_token_us: float
    asm_head_token_us: float
    hip0_us: float
    hip_head_token_us: float

    def asm_us(self, contexts: Sequence[int], num_kv_heads: int) -> float:
        workgroup = self.wg0_us + self.wg_token_us * max(contexts)
        return max(workgroup, self.asm_head_token_us * sum(contexts) * num_kv_heads)

    def hip_us(self, contexts: Sequence[int], num_kv_heads: int) -> float:
        return self.hip0_us + self.hip_head_token_us * sum(contexts) * num_kv_heads

    @property
    def skew_ratio(self) -> float:
        """Head-tokens of the HIP decode that cost what one token of an asm workgroup
        does: asm loses once the longest context times this passes the head-tokens plus
        :attr:`skew_head_tokens`."""
        return self.wg_token_us / self.hip_head_token_us

    @property
    def skew_head_tokens(self) -> float:
        """The head-tokens the HIP decode's larger start-up time is worth."""
        return (self.hip0_us - self.wg0_us) / self.hip_head_token_us


def _line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares intercept and slope."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


def fit_time_model(
    rows: Sequence[tuple[Sequence[int], int, float, float]], num_cus: int = 256
) -> KernelTimeModel:
    """Fit to ``(contexts, kv_heads, hip_us, asm_us)`` rows: HIP a line in head-tokens;
    asm's two terms by alternating assignment (each row to the term the last fit finds
    larger, starting from a wave of workgroups per CU), a line in the longest context for
    the workgroup term, a slope through the origin for the bandwidth term."""
    hip0, hip_slope = _line([(sum(c) * h, hip) for c, h, hip, _ in rows])
    by_workgroup = [len(c) * h <= num_cus for c, h, _, _ in rows]
    for _ in range(20):
        wg = [(max(c), asm) for (c, _, _, asm), w in zip(rows, by_workgroup, strict=True) if w]
        bw = [
            (sum(c) * h, asm) for (c, h, _, asm), w in zip(rows, by_workgroup, strict=True) if not w
        ]
        wg0, wg_slope = _line(wg)
        bw_slope = sum(x * y for x, y in bw) / sum(x * x for x, _ in bw)
        again = [wg0 + wg_slope * max(c) >= bw_slope * sum(c) * h for c, h, _, _ in rows]
        if again == by_workgroup:
            break
        by_workgroup = again
    return KernelTimeModel(wg0, wg_slope, bw_slope, hip0, hip_slope)


def original_time_model() -> KernelTimeModel:
    """The model fitted to the original change's kernel table (MI355X)."""
    from .original import kernel_timings

    rows = [(t.contexts, t.kv_heads, t.hip_us, t.asm_us) for t in kernel_timings()]
    return fit_time_model(rows)
