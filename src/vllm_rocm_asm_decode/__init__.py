"""ROCM_ATTN decodes large pure-decode fp8 batches on AITER's asm paged attention.

Importing this package imports nothing from vLLM; see :mod:`.plugin` for the entry point
and :mod:`.backend` for the backend classes.
"""

__version__ = "0.1.0"
