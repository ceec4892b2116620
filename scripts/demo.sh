#!/usr/bin/env bash
# One command on a fresh machine: set up .venv (with vLLM's CPU build, so the engine stage serves the bundle for
# real where TensorRT-LLM and a GPU are absent), then run the whole pipeline on the embedded demo model.
#   bash scripts/demo.sh [RUN_DIR] [extra trtspec build options...]
#   TRTSPEC_ENGINES= bash scripts/demo.sh    # without vLLM: the engine stage is skipped, saying why
set -euo pipefail
cd "$(dirname "$0")/.."
TRTSPEC_ENGINES=${TRTSPEC_ENGINES-vllm} bash scripts/setup.sh
. "${TRTSPEC_VENV:-.venv}/bin/activate"
out=${1:-runs/demo}; shift || true
trtspec build build_configs/smollm2-135m-eagle3.yaml --out "$out" "$@"
trtspec inspect "$out"
