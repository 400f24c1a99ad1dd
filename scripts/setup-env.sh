# Sourced by scripts/plan and scripts/test: make sure $VENV (default ./.venv) exists and
# holds vLLM 0.33.0 and this package with its test extras. Creates it when missing
# (about 10 GB, ~5 minutes the first time); later runs only confirm what is installed.
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV" >&2
  "${PYTHON:-python3}" -m venv "$VENV"
fi
# One quick check of what is installed, without importing torch or vLLM (seconds each):
# the distributions, and this checkout's own source as the installed package.
if ! "$VENV/bin/python" -c "
import importlib.metadata as m, importlib.util as u, os
assert m.version('vllm') == '0.33.0'
for name in ('vllm-rocm-asm-decode', 'pytest', 'hypothesis', 'ruff', 'matplotlib'):
    m.version(name)
assert u.find_spec('torch') and u.find_spec('vllm')
spec = u.find_spec('vllm_rocm_asm_decode.tools.cli')
assert spec and os.path.realpath(spec.origin).startswith(os.path.realpath('src') + os.sep)
" 2>/dev/null || [ pyproject.toml -nt "$VENV/.installed" ]; then
  echo "== installing vllm==0.33.0 and this package into $VENV" >&2
  # No wheel cache: the venv alone is about 10 GB, and a cached copy of the wheels would
  # add several more on the same disk. A failed install says how much room was left.
  if ! { "$VENV/bin/python" -m pip install -q --no-cache-dir --upgrade pip >&2 &&
    "$VENV/bin/python" -m pip install -q --no-cache-dir "vllm==0.33.0" -e ".[test]" >&2; }; then
    echo "== the install into $VENV failed; it needs about 10 GB free, and its disk has" \
      "$(df -Ph "$VENV" | awk 'NR == 2 {print $4}') free" >&2
    exit 1
  fi
  touch "$VENV/.installed"
fi
