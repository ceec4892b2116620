"""trtspec.measure's warm-up: which networks it compiles and in what order it warms them (the compilation itself is
tested with the runtime, tests/unit/test_runtime.py)."""

from __future__ import annotations

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
