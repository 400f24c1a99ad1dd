"""One named check and its outcome, as ``doctor`` and the self-tests report them (no
import of vLLM or torch, so that ``doctor`` can report an environment without them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


#: ``doctor``'s self-test state where the vLLM this Python finds cannot be used (it does
#: not import, or is not one doctor can read): ``reproduce`` names the vllm check then.
NO_VLLM = "not run: the vLLM here cannot be used"
