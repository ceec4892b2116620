#!/usr/bin/env bash
# One command on a fresh machine: set up .venv (with vLLM's CPU build and speculators: the interop tier runs the
# bundle in them), then run lint, the unit tests, the integration tests on the real demo model, the notebooks and
# the interop tests.   bash scripts/test.sh [extra pytest args...]
# Tiers (README, "Tests"): the default leaves out the tests marked `full` (the whole family matrix, the aiperf
# sweep, every launcher variant); TRTSPEC_TIER=full bash scripts/test.sh runs them too, and only it sets up aiperf
# (.venv-bench: a minute of set-up that only the full tier's aiperf sweep uses).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${TRTSPEC_TIER:-default}" in
  default) tier=(-m "not full"); bench=() ;;
  full) tier=(); bench=(--bench) ;;
  *) echo "test.sh: unknown TRTSPEC_TIER '$TRTSPEC_TIER' (expected default or full)" >&2; exit 2 ;;
esac
# Two pytest-xdist workers, each on its own core (tests/conftest.py pins them), the tests sharing a build in one
# worker; TRTSPEC_TEST_WORKERS=1 runs them in this one process.
workers=${TRTSPEC_TEST_WORKERS:-2}
case "$workers" in ''|*[!0-9]*) echo "test.sh: TRTSPEC_TEST_WORKERS must be a number of workers (got '$workers')" >&2; exit 2 ;; esac
xdist=()
[ "$workers" -gt 1 ] && xdist=(-n "$workers")
bash scripts/setup.sh --engines vllm "${bench[@]}"
. "${TRTSPEC_VENV:-.venv}/bin/activate"
export TRTSPEC_TRANSFORMERS4=${TRTSPEC_TRANSFORMERS4:-$(cd "${TRTSPEC_VENV:-.venv}" && pwd)/transformers4}
ruff check trtspec tests scripts notebooks
python -m pytest -q -ra --timeout=3600 "${xdist[@]}" "${tier[@]}" "$@"
