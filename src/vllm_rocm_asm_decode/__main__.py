"""``python -m vllm_rocm_asm_decode``: the ``vllm-rocm-asm-decode`` command, for an
environment whose scripts directory is not on PATH."""

import sys

from .tools.console import main

sys.exit(main())
