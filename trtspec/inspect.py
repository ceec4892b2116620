"""Summarize a run directory from its manifests (what each stage produced, metrics, versions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.artifacts import RunDir
from trtspec.config import STAGES
from trtspec.errors import ArtifactError


def inspect_run(path: Path) -> dict[str, Any]:
    run = RunDir(path)
    if not path.is_dir():
        raise ArtifactError(f"run directory '{path}' does not exist")
    if not run.is_run():
        raise ArtifactError(f"'{path}' is not a trtspec run directory (no trtspec-run.json)")
    rows, versions = [], {}
    for stage in STAGES:
        m = run.manifest(stage)
        if m is None:
            rows.append({"stage": stage, "status": "missing"})
            continue
        from trtspec.artifacts import verify_files

        problems = verify_files(run.stage_dir(stage), m)
        rows.append({
            "stage": stage,
            "status": "corrupted" if problems else m.get("status"),
            "wall_s": m.get("wall_s", 0.0),
            "headline": m.get("metrics", {}).get("headline") or m.get("reason", ""),
            "metrics": m.get("metrics", {}),
            "files": sorted(m.get("files", {})),
            "problems": problems,
        })
        versions = m.get("versions", versions)
    return {"run_dir": str(path), "stages": rows, "versions": versions}
