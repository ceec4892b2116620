"""The export stage (placeholder until its issue lands: it records itself as skipped, never as done)."""

from __future__ import annotations

from trtspec.pipeline import StageContext, StageSkipped


def run(ctx: StageContext) -> dict:
    raise StageSkipped("the export stage is not implemented yet")
