"""Stand-in for the ``aiter._version`` module AITER's setuptools_scm writes.

``__version__`` is ``$ASM_DECODE_TEST_AITER_VERSION``, read at each access so tests can
change it; unset, the module has no version (importing the name fails, as it does where
AITER's build wrote none).
"""

from __future__ import annotations

import os


def __getattr__(name: str) -> str:
    if name == "__version__":
        version = os.environ.get("ASM_DECODE_TEST_AITER_VERSION")
        if version:
            return version
    raise AttributeError(name)
