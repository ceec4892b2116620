"""Where a measurement was taken, for what depends on it: a draft-length schedule (where speculation stops paying
differs by engine and hardware) says where it was measured, and deploy serves it only there unless asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def measured_on(eng: Any) -> dict[str, Any]:
    """Where a measurement was taken, for what depends on it (a draft-length schedule: where speculation stops paying
    differs by engine and hardware): {engine, version, device: gpu | cpu, device_name, machine}."""
    import platform

    import torch

    gpu = torch.cuda.is_available()
    return {"engine": eng.SHORT, "version": eng.version(), "device": "gpu" if gpu else "cpu",
            "device_name": torch.cuda.get_device_name(0) if gpu else cpu_name(), "machine": platform.machine()}


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else the platform's processor string."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def provenance(where: dict | None) -> str:
    """'vllm/cpu' -- the engine and device class a measurement was taken on ('unknown' for one that does not say)."""
    return f"{where['engine']}/{where['device']}" if where else "unknown"
