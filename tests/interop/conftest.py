"""Interop tier: the bundle trtspec exports, loaded by real third-party code (vLLM's CPU build, speculators,
transformers 4.x). `bash scripts/test.sh` installs them (scripts/setup.sh --engines vllm); where one is missing
its tests skip and say which."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CI_CONFIG = ROOT / "build_configs" / "smollm2-135m-eagle3-ci.yaml"
# The CI recipe, with a head that starts as the target's layer after the deepest aux layer: it drafts well before
# much training (acceptance far from 1), so an engine that fed it other layers' states would show in the counters.
OVERRIDES = ["convert.init_from_target=true", "engine.max_draft_len=3"]


def pytest_collection_modifyitems(items):
    for item in items:
        if "/interop/" in str(item.fspath):
            item.add_marker(pytest.mark.interop)


@pytest.fixture(scope="session")
def ci_run(tmp_path_factory) -> Path:
    """A run of the CI recipe up to the bundle (TRTSPEC_INTEROP_RUN: reuse a finished one)."""
    if os.environ.get("TRTSPEC_INTEROP_RUN"):
        return Path(os.environ["TRTSPEC_INTEROP_RUN"])
    from trtspec import pipeline
    from trtspec.config import load_config

    run = tmp_path_factory.mktemp("interop") / "run"
    results = pipeline.run_build(load_config(CI_CONFIG, OVERRIDES), run, until="export")
    failed = [r for r in results if r.status == "failed"]
    assert not failed, failed
    return run


@pytest.fixture(scope="session")
def ci_bundle(ci_run) -> Path:
    return ci_run / "bundle"
