"""scripts/bench_heads_cross.py on the interop tier's CI run: a draft on its own run's rows, states from the HF
forward, measures what its train stage measured (the CI recipe's states come from HF too)."""

from __future__ import annotations

import json
import re
import sys

from stagekit import load_script


def test_a_draft_on_its_own_rows_measures_what_its_train_stage_did(ci_run, monkeypatch, capsys):
    bench = load_script("bench_heads_cross")
    monkeypatch.setattr(sys, "argv", ["bench_heads_cross.py", str(ci_run)])
    bench.main()
    als = [float(m) for m in re.findall(r"^\S+\s+\S+\s+([\d.]+) \(", capsys.readouterr().out, re.M)]
    trained = json.loads((ci_run / "train" / "manifest.json").read_text())["metrics"]["AL@3"]
    assert len(als) == 1 and abs(als[0] - trained) < 5e-4, (als, trained)
