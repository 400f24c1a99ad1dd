"""An executable model of ``aiter.pa_fwd_asm``'s contract, for machines without an AMD GPU.

The asm kernel's binary is not readable, so this model encodes what is known of it
(AITER's C++ launcher, and AMD's description of how the kernel addresses memory):

* It raises where the launcher raises: head size other than 128, a query dtype other
  than bf16/fp16, a KV dtype it has no name for, and any request with no kernel row in
  the architecture's table (:class:`~vllm_rocm_asm_decode.kernel_table.KernelTable`).
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
* The batch is ``context_lens.size(0)``. Sequences of length 0 (CUDA-graph padding) are
  not computed and their output rows are left as they were.
* ``block_id_mask`` models AITER before 0.1.17, whose kernels read block id ``b`` as
  ``b & 0xFFFF`` (pass ``0xFFFF``); the default models the fixed kernels.

Numerics are fp32 math on dequantized values rounded once to the query dtype: the model
checks layout and semantics, not the kernel's precision modes.
"""

from __future__ import annotations

import math

import torch

from ..kernel_table import KernelTable, dtype_name


class LauncherError(RuntimeError):
    """Where AITER's launcher would raise (``AITER_CHECK`` failure)."""


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

    def __init__(self, table: KernelTable, block_id_mask: int | None = None) -> None:
        self.table = table
        self.block_id_mask = block_id_mask

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
        sm_scale = float(torch.tensor(1.0 / math.sqrt(head_size), dtype=torch.float32))

        for i, ctx in enumerate(context_lens.tolist()):
            if ctx <= 0:
                continue
            n_pages = (ctx + block_size - 1) // block_size
            pages = bt_rows[i, :n_pages].long()
            if block_id_mask is not None:
                pages = pages & block_id_mask
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
