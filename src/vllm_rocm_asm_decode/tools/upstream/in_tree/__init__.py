"""Files written into vLLM verbatim (imports pointed into vLLM, SPDX header added)."""
