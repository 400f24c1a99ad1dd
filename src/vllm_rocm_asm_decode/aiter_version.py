"""What the installed AITER proves about itself: its version, and whether its asm
kernels read every KV block of a large cache right.

AITER releases before 0.1.17 misaddress high KV blocks in every asm paged-attention
kernel (AITER issue 3062, fixed by PR 3211, first released in v0.1.17): a block-table
entry past the limit reads another block's K and V, with no error and a plausible wrong
answer. AITER's regression test fingerprints block 67000 read as 1464 (``id & 0xFFFF``)
at 32 KiB pages, and its fix replaced 32-bit byte offsets (``block_id x page bytes``)
with 64-bit addressing; the two readings agree at 32 KiB pages and differ elsewhere, so
an old AITER is trusted only with blocks that are safe under both: ids below 65536 whose
page starts below 2 GiB (:func:`safe_blocks`).

The version is the only proof there is at start-up, so a version that is unknown or
cannot be parsed counts as unfixed. A build that passed ``doctor``'s self-test on the
GPU (its block-id probe reads high blocks right, its fp16 probe is accurate) can be
trusted explicitly (``AiterBuild.trusted``): with every KV block and fp16 queries.

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
#: Block ids from here on are misread by older AITERs (a 16-bit block id): a cache of
#: more blocks than this can hand the kernel such an id.
BLOCK_ID_LIMIT = 65536
#: Byte offsets from here on are misread by older AITERs (a signed 32-bit offset).
OFFSET_LIMIT = 2**31
#: What AITER's setuptools_scm reports for a build without git metadata.
SCM_FALLBACK = "0.1.0"


def safe_blocks(page_bytes: int | None) -> int:
    """How many KV blocks an AITER before 0.1.17 reads right, for K pages of
    ``page_bytes`` (the launcher's block stride): ids below 65536 whose page ends by
    2 GiB. Unknown page size: the id limit alone."""
    if not page_bytes:
        return BLOCK_ID_LIMIT
    return min(BLOCK_ID_LIMIT, OFFSET_LIMIT // page_bytes)


def version_sources() -> tuple[str | None, str | None]:
    """The ``amd-aiter`` distribution's version and ``aiter._version.__version__`` (the
    module the imported package carries); None where absent."""
    try:
        from_metadata: str | None = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        from_metadata = None
    try:
        from aiter._version import __version__
    except Exception:  # not installed, no _version module, or it fails to import
        from_module = None
    else:
        from_module = str(__version__) if __version__ else None
    return from_metadata, from_module


def installed_version() -> str | None:
    """The installed AITER's version: the distribution metadata, else
    ``aiter._version``, else None (unknown). Where both parse and differ (the metadata
    of one install, the imported package of another), the older of the two."""
    from_metadata, from_module = version_sources()
    if from_metadata and from_module and from_metadata != from_module:
        try:
            return min(from_metadata, from_module, key=Version)
        except InvalidVersion:
            pass
    return from_metadata or from_module


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
    #: This build passed ``doctor`` (``VLLM_ROCM_ASM_DECODE_TRUST_AITER=1``): block ids
    #: >= 65536 are trusted whatever the version says, and so are fp16 queries.
    trusted: bool = False

    @property
    def block_id_fix(self) -> bool | None:
        return has_block_id_fix(self.version)

    @property
    def reads_high_block_ids(self) -> bool:
        """Whether a cache of more than :func:`safe_blocks` blocks may use the
        kernel."""
        return self.trusted or self.block_id_fix is True

    def block_id_problem(
        self, num_blocks: int, page_bytes: int | None = None
    ) -> str | None:
        """Why a cache of ``num_blocks`` blocks of ``page_bytes`` must keep the HIP
        decode; None if it need not."""
        limit = safe_blocks(page_bytes)
        if num_blocks <= limit or self.reads_high_block_ids:
            return None
        verb = "may misread" if self.block_id_fix is None else "misreads"
        which = (
            f"KV blocks >= {limit}"
            if limit == BLOCK_ID_LIMIT
            else f"KV blocks >= {limit} (pages past 2 GiB at {page_bytes} bytes a page)"
        )
        hint = (
            f"; {SCM_FALLBACK} is what a build without git metadata reports"
            if self.version == SCM_FALLBACK
            else ""
        )
        return (
            f"{describe(self.version)} {verb} {which} (fixed in {FIRST_FIXED}{hint}); "
            f"this cache has {num_blocks} blocks"
        )

    @classmethod
    def installed(cls, trusted: bool = False) -> AiterBuild:
        return cls(installed_version(), trusted)
