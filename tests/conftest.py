"""Shared fixtures: a tiny random Llama with the demo's real tokenizer (fast), and the real demo model (slow)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property tests check what inputs do, never how fast: a loaded CI host must not fail them on hypothesis' timing
# (its 200 ms per-example deadline, its "input generation is slow" health check: test_config's override round trip
# failed that one in a fresh clone sharing 2 cores).
settings.register_profile("trtspec", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("trtspec")

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as an HF folder (converted once into the trtspec cache)."""
    from trtspec.models import resolve_model

    return resolve_model("demo:smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, demo_model_dir) -> Path:
    """A 4-layer, 64-wide random Llama with the demo's tokenizer and chat template."""
    from stagekit import tiny_llama

    return tiny_llama(tmp_path_factory.mktemp("tiny") / "model", vocab_from=demo_model_dir)


@pytest.fixture(scope="session")
def tiny_prompts_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    rows = [
        {"prompt": "Name three colors.", "category": "lists"},
        {"prompt": "What is 12 plus 30?", "category": "math"},
        {"prompt": "Write a haiku about rain.", "category": "writing"},
        {"prompt": "Explain what a CPU does.", "category": "explanation"},
        {"prompt": "Write a Python function that adds two numbers.", "category": "code"},
        {"prompt": "Say hello to a friend.", "category": "chat"},
    ]
    import json

    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.fixture(scope="module")
def one_thread():
    """Tiny ops on a shared 2-core box: one torch thread is ~10x faster than two fighting over the cores."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def finished_runs() -> dict:
    """Runs a test built and checked, by what they were built from, for a later test that builds the same recipe:
    a copy of one is found finished by `trtspec build` (the same fingerprints), not built a second time."""
    return {}


def _kib(status: str, key: str) -> int:
    """A `VmRSS:`-style line of /proc/<pid>/status, in KiB (0 where the kernel gives none)."""
    line = next((s for s in status.splitlines() if s.startswith(key + ":")), "")
    return int(line.split()[1]) if line else 0


def pytest_sessionstart(session) -> None:
    """TRTSPEC_RSS_LOG=FILE: the log starts empty with each run (see pytest_runtest_logfinish)."""
    if path := os.environ.get("TRTSPEC_RSS_LOG"):
        Path(path).write_text("")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid: str, location) -> None:
    """TRTSPEC_RSS_LOG=FILE: after each test, a line of its memory in MiB: this process's resident set now and at its
    peak (VmRSS, VmHWM: the peak since a stage last reset it, trtspec.artifacts), and the largest peak of any child
    process it has waited for (RUSAGE_CHILDREN; a forked child's counts its parent's pages). What /usr/bin/time
    reports for the whole suite is about the largest of these; this log says which test reached it."""
    path = os.environ.get("TRTSPEC_RSS_LOG")
    if not path:
        return
    import resource

    status = Path("/proc/self/status").read_text()
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    with open(path, "a") as f:
        f.write(f"{_kib(status, 'VmRSS') // 1024}\t{_kib(status, 'VmHWM') // 1024}\t{children // 1024}\t{nodeid}\n")


def pytest_terminal_summary(terminalreporter) -> None:
    """TRTSPEC_RSS_LOG=FILE: one line naming the test after which the log's largest peak was first seen."""
    path = os.environ.get("TRTSPEC_RSS_LOG")
    rows = [line.split("\t") for line in Path(path).read_text().splitlines()] if path and Path(path).exists() else []
    if rows:  # the first row of the largest peak, this process's (VmHWM) or a child's
        own, child, nodeid = max(((int(r[1]), int(r[2]), r[3]) for r in rows), key=lambda r: max(r[0], r[1]))
        who = "this pytest process" if own >= child else "a child process"
        terminalreporter.write_line(f"memory: peak {max(own, child)} MiB in {who}, first seen after {nodeid} "
                                    f"(each test's line: {path})")
