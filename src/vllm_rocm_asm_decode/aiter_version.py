"""What the installed AITER proves about itself: its version, and whether its asm kernels
read KV block ids >= 65536 right.

AITER releases before 0.1.17 narrow the block id in every asm paged-attention kernel
(AITER issue 3062, fixed by PR 3211, first released in v0.1.17): a block-table entry
>= 65536 reads another block's K and V, with no error and a plausible wrong answer.
The version is the only proof the plugin has at start-up, so a version that is unknown
or cannot be parsed counts as unfixed. ``VLLM_ROCM_ASM_DECODE_TRUST_AITER=1`` overrides
that for a build whose block-id probe (``vllm-rocm-asm-decode doctor``) has passed.

Read once per process, with the kernel (:func:`~.kernel.load_asm_kernel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from packaging.version import InvalidVersion, Version

#: The distribution AITER installs as (``pip show amd-aiter``).
DISTRIBUTION = "amd-aiter"
#: First AITER release whose asm kernels read block ids >= 65536 right.
FIRST_FIXED = "0.1.17"
#: Block ids from here on are misread by older AITERs: a cache of more blocks than this
#: can hand the kernel such an id.
BLOCK_ID_LIMIT = 65536
#: What AITER's setuptools_scm reports for a build without git metadata.
SCM_FALLBACK = "0.1.0"


def installed_version() -> str | None:
    """The installed AITER's version: the ``amd-aiter`` distribution's metadata, else
    ``aiter._version.__version__``, else None (unknown)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    try:
        from aiter._version import __version__
    except Exception:  # not installed, no _version module, or it fails to import
        return None
    return str(__version__) if __version__ else None


def has_block_id_fix(version: str | None) -> bool | None:
    """True from AITER 0.1.17 on, False before (pre-releases of 0.1.17 included), None
    when the version is unknown or not a PEP 440 version."""
    if version is None:
        return None
    try:
        return Version(version) >= Version(FIRST_FIXED)
    except InvalidVersion:
        return None


def describe(version: str | None) -> str:
    """``AITER 0.1.16.post5``, or ``AITER of unknown version``."""
    return f"AITER {version}" if version else "AITER of unknown version"


@dataclass(frozen=True)
class AiterBuild:
    """The installed AITER as far as it proves itself."""

    version: str | None
    #: VLLM_ROCM_ASM_DECODE_TRUST_AITER=1: block ids >= 65536 are trusted whatever the
    #: version says.
    trusted: bool = False

    @property
    def block_id_fix(self) -> bool | None:
        return has_block_id_fix(self.version)

    @property
    def reads_high_block_ids(self) -> bool:
        """Whether a cache of more than :data:`BLOCK_ID_LIMIT` blocks may use the kernel."""
        return self.trusted or self.block_id_fix is True

    def block_id_problem(self, num_blocks: int) -> str | None:
        """Why a cache of ``num_blocks`` blocks must keep the HIP decode; None if it need not."""
        if num_blocks <= BLOCK_ID_LIMIT or self.reads_high_block_ids:
            return None
        verb = "may misread" if self.block_id_fix is None else "misreads"
        hint = (
            f"; {SCM_FALLBACK} is what a build without git metadata reports"
            if self.version == SCM_FALLBACK
            else ""
        )
        return (
            f"{describe(self.version)} {verb} KV blocks >= {BLOCK_ID_LIMIT} (fixed in "
            f"{FIRST_FIXED}{hint}); this cache has {num_blocks} blocks"
        )

    @classmethod
    def installed(cls, trusted: bool = False) -> AiterBuild:
        return cls(installed_version(), trusted)
