"""scripts/bench_categories.py on the interop tier's CI run: every held-out prompt decoded without and with the draft
(the head alone, and a suffix match in front of it), greedy outputs identical, a summary per category."""

from __future__ import annotations

import json
import sys

import pytest
from stagekit import load_script


@pytest.mark.parametrize("suffix", [0, 2])
def test_categories_bench_keeps_greedy_output(ci_run, monkeypatch, capsys, suffix):
    bench = load_script("bench_categories")
    monkeypatch.setattr(sys, "argv", ["bench_categories.py", str(ci_run), "--prompts", "4", "--max-new-tokens", "24",
                                      "--no-compile", "--suffix-min-match", str(suffix), "--json"])
    bench.main()
    out = json.loads(capsys.readouterr().out)
    assert out["prompts"] == 4 and out["draft"] == "eagle3" + ("+suffix" if suffix else "")
    assert sum(c["exact"] for c in out["per_category"].values()) == 4
    assert 1.0 <= out["acceptance_length"] <= 4.0 and out["speedup_vs_no_draft"] > 0
