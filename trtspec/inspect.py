"""Summarize a run directory from its manifests (what each stage produced, metrics, versions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.artifacts import RunDir, verify_files
from trtspec.config import STAGES
from trtspec.errors import ArtifactError


def inspect_run(path: Path) -> dict[str, Any]:
    """Each stage's row (status, time, headline, metrics, files, problems) and the versions that built the run.

    A stage whose manifest cannot be read, or whose files differ from it, is `corrupted`, with the problems named;
    `damage` turns those into the error `trtspec inspect` exits with."""
    run = RunDir(path)
    if not path.is_dir():
        raise ArtifactError(f"run directory '{path}' does not exist")
    if not run.is_run():
        raise ArtifactError(f"'{path}' is not a trtspec run directory (no trtspec-run.json)")
    rows, versions = [], {}
    for stage in STAGES:
        try:
            m = run.read_manifest(stage)
        except ArtifactError as e:
            rows.append({"stage": stage, "status": "corrupted", "problems": [e.message]})
            continue
        if m is None:
            rows.append({"stage": stage, "status": "missing"})
            continue
        problems = [f"{run.stage_dir(stage) / p}" for p in verify_files(run.stage_dir(stage), m)]
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


def damage(info: dict[str, Any]) -> ArtifactError | None:
    """The error for a run with corrupted stages (their manifest or files), naming the first problem; None if intact."""
    problems = [(row["stage"], p) for row in info["stages"] for p in row.get("problems", [])]
    if not problems:
        return None
    stages = sorted({s for s, _ in problems}, key=STAGES.index)
    more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
    return ArtifactError(f"stage {stages[0]}: {problems[0][1]}{more}",
                         f"a build into this run directory redoes {', '.join(stages)}")
