"""What a stage declares, is given and may raise: the contract between the runner (trtspec.pipeline.runner) and the
stages. The runner reads these declarations and branches on no stage's name.

A stage is a module under trtspec.stages that declares
    UPSTREAM: tuple[str, ...]     the stages whose folders it reads (ctx.inputs)
    READS: tuple[str, ...]        the config sections, or `section.key`s, its results depend on (its fingerprint)
    run(ctx) -> dict              its work; returns its metrics ("headline" is shown in the summary)
and, where it has them,
    ALL_RANKS = True              every rank of a multi-process launch runs it (default: rank 0 alone)
    preflight(cfg, model_config)  settings checked against the model's config before the first stage of a build
    environment_key() -> dict     what of the machine its results depend on (default: nothing)
    files_read(cfg) -> [InputFile]          local text files it reads by path: hashed into its fingerprint and read
                                            by the preflight as the stage reads them (default: none)
    models_read(cfg) -> [(key, source)]     models besides model.source it loads, checked early (default: none)
    unused(cfg) -> tuple[str, ...]          `section.key`s of READS this config leaves unused: keyed at their
                                            defaults, so changing one redoes nothing (default: none)
Stages import this module and the library, never the runner or another stage.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from trtspec.artifacts import RunDir
from trtspec.config import BuildConfig
from trtspec.errors import TrtspecError


@dataclass(frozen=True)
class InputFile:
    """A local text file a stage reads, and how: `read(path, skips)` is the reader that stage uses."""

    name: str  # the config key that names it
    what: str  # how error messages name it ("data file", "eval.prompts file")
    written: str  # the path as the config writes it (its key in the stage's fingerprint)
    path: Path
    row: str  # what a usable row is: a key of chat.USABLE_ROW
    read: Callable[[Path, Counter], list]


HOOK_DEFAULTS: dict[str, Callable] = {
    "environment_key": lambda: None,
    "files_read": lambda cfg: [],
    "models_read": lambda cfg: [],
    "unused": lambda cfg: (),
}


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

    @cached_property
    def model_path(self) -> Path:
        """model.source as a local folder, resolved once for the whole stage (the demo's GGUF converted once)."""
        from trtspec.models import resolve_model

        return Path(resolve_model(self.cfg.model.source))

    @cached_property
    def model_stamp(self) -> dict | None:
        """A local model's file sizes and mtimes (models.model_stamp): caches keyed on the target include it."""
        from trtspec.models import model_stamp

        return model_stamp(self.cfg.model.source)

    def log(self, msg: str) -> None:
        if not self.quiet:
            print(f"[{self.stage}] {msg}", file=sys.stderr, flush=True)
