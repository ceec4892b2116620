"""What a stage is given and what it may raise: the contract between the runner (trtspec.pipeline.runner) and the stages.

A stage is a module under trtspec.stages with `run(ctx: StageContext) -> dict` (its metrics; "headline" is shown in
the summary) and optionally `preflight(cfg, model_config)` (checks run before the first stage of a build) and
`environment_key() -> dict` (what of the machine its results depend on). Stages import this module and the library,
never the runner or another stage.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.artifacts import RunDir
from trtspec.config import BuildConfig
from trtspec.errors import TrtspecError


class StageSkipped(TrtspecError):
    """Raised by a stage that cannot run here (no GPU, no tensorrt_llm): recorded as skipped, not failed."""

    exit_code = 3


@dataclass
class StageContext:
    cfg: BuildConfig
    run: RunDir
    stage: str
    out: Path  # temporary folder; renamed into RUN_DIR/<stage> when the stage returns
    work: Path  # resumable scratch that survives a kill (same fingerprint only)
    inputs: dict[str, Path] = field(default_factory=dict)  # upstream stage folders
    manifests: dict[str, dict] = field(default_factory=dict)  # upstream manifests
    quiet: bool = False  # a rank other than 0 of a multi-process launch: rank 0 says it all

    def log(self, msg: str) -> None:
        if not self.quiet:
            print(f"[{self.stage}] {msg}", file=sys.stderr, flush=True)
