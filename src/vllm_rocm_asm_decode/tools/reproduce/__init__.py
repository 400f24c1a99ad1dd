"""``reproduce``: the original change's whole validation in one command, on one AMD GPU,
ending in one report that sets every figure beside the original's.

Steps, in order (--quick: a subset of about an hour that still answers "faster, and as
accurate?"):

  doctor               stops the run when it fails, with its failing line
  kernel-table         bench kernel at the original shapes (40/8 and 32/8 heads,
                       contexts 1024 and 4096, 16 or 24 / 64 / 256 sequences)
  kernel-skew          one long sequence among 127 short ones (bench kernel --skew)
  kernel-sweep         batch sizes from 1 at 40/8 heads, context 4096: the crossover
                       (all three kernel steps at AITER's default precision, as the
                       original was timed; its serving runs found high_precision=2,
                       the shipped kernel, as fast)
  serve-random         A/B, fresh server per arm, VLLM_ROCM_ASM_DECODE=0 as the
                       baseline: random 1024 in / 1024 out, --ignore-eos, concurrency
                       1/8/16/64/128 with 8/32/64/256/256 prompts, two repeats
                       (--quick: 1/64/128, one repeat)
  serve-sharegpt       with --dataset FILE only: ShareGPT lengths at concurrency 64/128
  accuracy-ARM         per arm (ARM: plugin-off, asm-decode), one fresh server:
                       GSM8K through lm_eval (1319 questions, 5-shot chat, greedy, 64
                       in flight) and passkey retrieval at 3K/8K/16K/32K tokens (24
                       prompts, 30 in flight)
  gsm8k-ARM-2          a second CUDA-graph GSM8K run per arm (not with --quick)
  gsm8k-ARM-eager      an --enforce-eager GSM8K run per arm (not with --quick)
  sync-check           the asm arm under VLLM_GPU_SYNC_CHECK=error: GSM8K, and (not
                       with --quick) the five concurrencies

Each step writes its result into --out DIR as it finishes; running the same command
again skips the steps that finished and retries those that failed (--redo STEP runs a
finished one again); other options into the same DIR are refused once a step has
finished there, and replace a reproduction that finished none. A failed step is
reported as failed, never dropped. The
environment of each invocation (GPU, ROCm, the --vllm executable and what it answers
to --version, the --lm-eval executable (its version is what its GSM8K results name),
AITER, model, settings, git revision) is recorded beside the results. At the end, and
after Ctrl-C, DIR holds report.md and report.json: the original's tables in the
original's format with this run's figures beside them, the relative change, whether
each claim holds within the original's run-to-run spread (computed from the original's
figures, kept as data with their source), plots, and what was not run and why.

Progress goes to stderr: a line as --vllm is asked its --version (up to two minutes),
a line with the current step and an ETA, and one line per finished step. Ctrl-C stops
the running server's process group and keeps what finished; the same command resumes.
Exit status: 0 every step passed, 1 a step failed (or doctor stopped the run), 2 an
input error, or a machine where doctor's GPU self-test cannot run (no gfx942/gfx950 GPU,
or no AITER: the report says so), 130 interrupted.
"""
