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


def pin_worker_to_its_cpus() -> None:
    """A pytest-xdist worker (`-n N`: scripts/test.sh runs 2) runs on its own 1/N of the CPUs, and so do the
    processes it starts (they inherit the affinity; trtspec binds vLLM's threads to it). Unpinned, two workers'
    torch and vLLM threads spin against each other on shared cores (as the `one_thread` fixture says of tiny ops).
    Before torch is imported: OpenMP sizes its thread pool then."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not worker.startswith("gw") or not count.isdigit() or not hasattr(os, "sched_setaffinity"):
        return
    cpus, n = sorted(os.sched_getaffinity(0)), int(count)
    if n > len(cpus):
        return  # fewer CPUs than workers: they share them all
    mine = cpus[int(worker[2:]) % n :: n]
    os.sched_setaffinity(0, mine)
    os.environ["OMP_NUM_THREADS"] = str(len(mine))


pin_worker_to_its_cpus()

# What runs in one pytest-xdist worker (scripts/test.sh): the test files sharing the interop run (the session-scoped
# `ci_run`, a build of minutes), the tests sharing the family matrix's tiny:qwen3_moe EAGLE-3 build (`finished_runs`:
# its adapt test and notebook 01 find it finished), and otherwise each test file (its module-scoped fixtures built
# once) but the family matrix, whose builds share nothing else and go one by one (the full tier has 75). The groups
# are handed out in GROUP_ORDER, the longest first, so that the last ones to finish are short.
INTEROP_RUN_FILES = {f"tests/interop/test_{name}.py" for name in (
    "adapt", "bench_categories", "bench_heads_cross", "speculators", "transformers4", "triton", "vllm", "vllm_dflash",
    "vllm_dspark")}
FAMILIES = "tests/e2e/test_families.py"
FAMILY_RUN_TESTS = {f"{FAMILIES}::test_family_end_to_end[qwen3_moe-eagle3]",
                    f"{FAMILIES}::test_adapt_continues_a_mixture_of_experts_draft", "tests/e2e/test_notebooks.py"}
GROUP_ORDER = ["interop-run", "family-runs", "tests/interop/", "tests/e2e/", "tests/stages/", "tests/unit/"]


def xdist_group(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    if path in INTEROP_RUN_FILES:
        return "interop-run"
    if nodeid in FAMILY_RUN_TESTS or path in FAMILY_RUN_TESTS:
        return "family-runs"
    return nodeid if path == FAMILIES else path


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: pytest without it must not refuse this file
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's workers take whole groups (xdist_group), in the collection's order. Its own `--dist loadgroup`
    does not group under pytest 9 (it renames items through an attribute pytest no longer reads)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    config.option.loadscopereorder = False
    return ByGroup(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    """Under pytest-xdist: the groups in GROUP_ORDER."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    items.sort(key=lambda item: group_rank(xdist_group(item.nodeid)))  # stable: each group's own order kept


def group_rank(group: str) -> int:
    """The place of a group in GROUP_ORDER (the first entry it starts with), after them all if none."""
    return next((i for i, g in enumerate(GROUP_ORDER) if group.startswith(g)), len(GROUP_ORDER))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """A test file using `ci_run` outside INTEROP_RUN_FILES would build that run again in another worker: its tests
    fail saying so, in one process or several, before any fixture (the run's build among them) is set up."""
    path = item.nodeid.split("::")[0]
    if "ci_run" in item.fixturenames and path not in INTEROP_RUN_FILES:
        pytest.fail(f"{path} uses ci_run: add it to INTEROP_RUN_FILES in tests/conftest.py", pytrace=False)


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
    """TRTSPEC_RSS_LOG=FILE: the log starts empty with each run (see pytest_runtest_teardown)."""
    if (path := os.environ.get("TRTSPEC_RSS_LOG")) and "PYTEST_XDIST_WORKER" not in os.environ:
        Path(path).write_text("")  # by the main process only: pytest-xdist's workers all append to it


def machine_mib_in_use() -> int:
    """The machine's memory in use now, MemTotal - MemAvailable of /proc/meminfo, in MiB (0 where there is none):
    every worker's and server's together, what a CI machine's limit is on."""
    info = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    return max(_kib(info, "MemTotal") - _kib(info, "MemAvailable"), 0) // 1024


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After each test's teardown, in the process that ran it (not pytest-xdist's main process, which only replays
    the workers' reports): its line in the memory log."""
    try:
        return (yield)
    finally:
        log_memory(item.nodeid)


def log_memory(nodeid: str) -> None:
    """TRTSPEC_RSS_LOG=FILE: after each test, a line of its memory in MiB: this process's resident set now and at its
    peak (VmRSS, VmHWM: the peak since a stage last reset it, trtspec.artifacts), and the largest peak of any child
    process it has waited for (RUSAGE_CHILDREN; a forked child's counts its parent's pages). What /usr/bin/time
    reports for the whole suite is about the largest of these; this log says which test reached it. Then the test,
    the pytest-xdist worker (or "main"), the time, and the machine's memory in use as the test ends: with two
    workers the machine holds both at once, and the log says which tests ran side by side."""
    path = os.environ.get("TRTSPEC_RSS_LOG")
    if not path:
        return
    import resource
    import time

    status = Path("/proc/self/status").read_text()
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(path, "a") as f:
        f.write(f"{_kib(status, 'VmRSS') // 1024}\t{_kib(status, 'VmHWM') // 1024}\t{children // 1024}\t{nodeid}\t"
                f"{worker}\t{time.strftime('%H:%M:%S')}\t{machine_mib_in_use()}\n")


def pytest_terminal_summary(terminalreporter) -> None:
    """TRTSPEC_RSS_LOG=FILE: a line naming the test after which the log's largest peak was first seen, and one
    naming the test at whose end the machine held the most."""
    path = os.environ.get("TRTSPEC_RSS_LOG")
    rows = [line.split("\t") for line in Path(path).read_text().splitlines()] if path and Path(path).exists() else []
    if rows:  # the first row of the largest peak, this process's (VmHWM) or a child's
        peak = max(rows, key=lambda r: max(int(r[1]), int(r[2])))
        own, child = int(peak[1]), int(peak[2])
        who = f"the pytest process ({peak[4]})" if own >= child else f"a child process (of {peak[4]})"
        terminalreporter.write_line(f"memory: peak {max(own, child)} MiB in {who}, first seen after {peak[3]} "
                                    f"(each test's line: {path})")
        machine = max(rows, key=lambda r: int(r[6]))
        terminalreporter.write_line(f"memory: the machine held at most {machine[6]} MiB at a test's end, after "
                                    f"{machine[3]} ({machine[4]}, {machine[5]})")
