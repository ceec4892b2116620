"""trtspec.measure's timing pieces (a call's wall time, a generation's step time, time per call) and its warm-up:
which networks it compiles and in what order it warms them (the compilation itself is tested with the runtime,
tests/unit/test_runtime.py)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from trtspec import measure


@pytest.fixture
def recorded(monkeypatch):
    """compile_steps and warm_up_row_counts replaced by recorders: (networks compiled, calls in order)."""
    import trtspec.runtime
    import trtspec.runtime.decode

    calls, compiled = [], []

    def compile_steps(nets, run):
        compiled.append(list(nets))
        run()
        return 1.5, "compiled"

    monkeypatch.setattr(trtspec.runtime, "compile_steps", compile_steps)
    monkeypatch.setattr(trtspec.runtime.decode, "warm_up_row_counts",
                        lambda target, drafter, spec: calls.append(("rows", drafter.name, spec)))
    return compiled, calls


def test_warm_up_compiles_the_target_and_each_draft_network_once(recorded):
    compiled, calls = recorded
    target = SimpleNamespace(name="target")
    eagle, suffix = SimpleNamespace(name="eagle", net="eagle-net"), SimpleNamespace(name="suffix")
    got = measure.warm_up(target, [(eagle, 3), (eagle, 5), (suffix, 3)], lambda: calls.append(("extra",)),
                          before_draft=lambda d: calls.append(("before", d.name)))
    assert got == (1.5, "compiled")
    assert compiled == [[target, "eagle-net"]]  # the suffix drafter has no network; eagle's is compiled once
    assert calls == [("before", "eagle"), ("rows", "eagle", 3), ("before", "eagle"), ("rows", "eagle", 5),
                     ("before", "suffix"), ("rows", "suffix", 3), ("extra",)]


def test_warm_up_leaves_an_hf_target_to_its_own_forward(recorded):
    from trtspec.runtime import HFTarget

    compiled, calls = recorded
    target = HFTarget.__new__(HFTarget)
    assert measure.warm_up(target, [(SimpleNamespace(name="eagle", net="eagle-net"), 3)])[1] == "compiled"
    assert compiled == [["eagle-net"]] and calls == [("rows", "eagle", 3)]


def generation(prefill_s: float, steps: int) -> SimpleNamespace:
    """What step_ms reads of a runtime Generation: its prefill seconds and its steps after the prefill."""
    return SimpleNamespace(prefill_s=prefill_s, stats=SimpleNamespace(steps=steps), tokens=[1] * (steps + 1))


def test_timed_returns_the_result_and_at_least_the_time_it_took():
    out, seconds = measure.timed(lambda: time.sleep(0.02) or "done")
    assert out == "done" and seconds >= 0.02


def test_step_ms_excludes_the_prefill_and_divides_by_the_generation_steps():
    assert measure.step_ms(generation(0.5, 10), 1.5) == pytest.approx(100.0)  # (1.5 - 0.5) s / 10 steps


def test_step_ms_divides_by_the_steps_given():
    # the scripts that decode n tokens after the prefill divide by n, whatever the stats count
    assert measure.step_ms(generation(0.25, 7), 2.25, steps=4) == pytest.approx(500.0)


def test_ms_per_call_calls_n_times_and_averages():
    calls = []
    ms = measure.ms_per_call(lambda: calls.append(time.sleep(0.01)), 3)
    assert len(calls) == 3 and ms >= 10.0
