#!/usr/bin/env bash
# One command on a fresh machine: set up .venv (with vLLM's CPU build and speculators: the interop tier runs the
# bundle in them), then run lint, the unit tests, the integration tests on the real demo model, the notebooks and
# the interop tests.   bash scripts/test.sh [extra pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --engines vllm --bench
. "${TRTSPEC_VENV:-.venv}/bin/activate"
export TRTSPEC_TRANSFORMERS4=${TRTSPEC_TRANSFORMERS4:-$(cd "${TRTSPEC_VENV:-.venv}" && pwd)/transformers4}
ruff check trtspec tests scripts notebooks
python -m pytest -q -ra --timeout=3600 "$@"
