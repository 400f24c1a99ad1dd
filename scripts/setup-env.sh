# Sourced by scripts/plan and scripts/test: make sure $VENV (default ./.venv) exists and
# holds vLLM 0.33.0 and this package with its test extras. Creates it when missing
# (about 9 GB, ~5 minutes the first time); later runs only confirm what is installed.
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV" >&2
  "${PYTHON:-python3}" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import vllm_rocm_asm_decode, vllm, pytest, hypothesis" 2>/dev/null \
   || [ "$("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null)" != "0.33.0" ] \
   || [ pyproject.toml -nt "$VENV/.installed" ]; then
  echo "== installing vllm==0.33.0 and this package into $VENV" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q "vllm==0.33.0" -e ".[test]" >&2
  touch "$VENV/.installed"
fi
