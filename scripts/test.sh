#!/usr/bin/env bash
# One command on a fresh machine: set up .venv, then run lint, the unit tests, the integration tests on the real
# demo model, and the notebooks.   bash scripts/test.sh [extra pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. "${TRTSPEC_VENV:-.venv}/bin/activate"
ruff check trtspec tests scripts
python -m pytest -q -ra --timeout=3600 "$@"
