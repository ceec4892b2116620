#!/usr/bin/env bash
# One command on a fresh machine: set up .venv, then run the whole pipeline on the embedded demo model.
#   bash scripts/demo.sh [RUN_DIR] [extra trtspec build options...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. "${TRTSPEC_VENV:-.venv}/bin/activate"
out=${1:-runs/demo}; shift || true
trtspec build build_configs/smollm2-135m-eagle3.yaml --out "$out" "$@"
trtspec inspect "$out"
