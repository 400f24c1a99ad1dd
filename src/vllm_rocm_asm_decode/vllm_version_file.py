"""The version a vLLM's ``vllm/_version.py`` gives (setuptools-scm writes it at vLLM's
build), read from its text: no import, so no torch and no vLLM. ``upstream`` reads a
tree's and the commands read the imported vLLM's with the same pattern."""

from __future__ import annotations

import re

#: ``__version__ = version = '0.33.0'`` as setuptools-scm writes it, or with a ``: str``
#: annotation; the first such line counts.
VERSION_LINE = re.compile(
    r"^__version__\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]",
    re.MULTILINE,
)


def version_in(text: str) -> str | None:
    """The version ``text`` (a ``_version.py``) assigns; None when it gives none."""
    found = VERSION_LINE.search(text)
    return found[1] if found else None
