"""The plugin's logger, inside vLLM's ``vllm`` logger tree so that vLLM's handler,
format and ``VLLM_LOGGING_LEVEL`` apply to it (a logger named after this package
would sit outside that tree and its info lines would be dropped)."""

from vllm.logger import init_logger

LOGGER_NAME = "vllm.rocm_asm_decode"

logger = init_logger(LOGGER_NAME)
