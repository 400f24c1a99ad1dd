"""The kernel tests ``upstream`` writes into vLLM as
``tests/kernels/attention/test_rocm_attn_asm_decode.py``, run here through the plugin on
an AMD gfx942/gfx950 GPU with AITER (skipped, with the reason, everywhere else).
``tests/e2e/test_in_tree.py`` runs them on the CPU with the contract model."""

from __future__ import annotations

from vllm_rocm_asm_decode.tools.upstream.in_tree.kernel_test import *  # noqa: F403
from vllm_rocm_asm_decode.tools.upstream.in_tree.kernel_test import (  # noqa: F401
    _asm_kernel,  # the module's autouse fixture (not in ``*``)
)
