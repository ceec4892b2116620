"""The variables trtspec gives vLLM's CPU build: its threads bound to the CPUs this process may run on (a container's
cpuset of "2-3" is not CPUs 0 and 1; the suite's pytest-xdist workers each hold one core)."""

from __future__ import annotations

import os

import pytest

from trtspec.engines import vllm as vllm_engine


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this OS")
@pytest.mark.parametrize("cpus, bind", [({2, 3}, "2,3"), ({1}, "1"), ({0, 1, 5}, "0,1,5")])
def test_threads_are_bound_to_the_cpus_this_process_may_use(monkeypatch, cpus, bind):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cpus))
    assert vllm_engine.cpu_environment()["VLLM_CPU_OMP_THREADS_BIND"] == bind


def test_in_process_engines_run_without_vllms_engine_subprocess():
    assert vllm_engine.cpu_environment(2)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert vllm_engine.cpu_environment(2)["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in vllm_engine.cpu_environment(2, server=True)
