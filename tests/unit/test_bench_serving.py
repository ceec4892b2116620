"""scripts/bench_serving.py's table: aiperf's summary fields read, speedups and where speculation stops paying."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_serving.py"


def load():
    spec = importlib.util.spec_from_file_location("bench_serving", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(tps, ttft=100.0, itl=20.0, al=None):
    return {"tokens_per_s": tps, "ttft_ms": ttft, "itl_ms": itl, "requests_per_s": 1.0, "acceptance_length": al}


def test_table_and_crossover():
    b = load()
    text, where = b.table({1: row(30.0, al=2.1), 4: row(60.0, al=2.0), 32: row(90.0, al=1.9)},
                          {1: row(20.0), 4: row(60.0), 32: row(120.0)})
    assert where == "speculation pays at concurrency 1, 4; costs at 32 (0.75x)"
    lines = text.splitlines()
    assert len(lines) == 5 and lines[2].startswith("| 1 | 30.0 | 20.0 | 1.50x |") and lines[4].endswith("| 1.90 |")


def test_stat_reads_aiperf_exports():
    b = load()
    assert b.stat({"output_token_throughput": {"unit": "tokens/sec", "avg": 12.5}}, "output_token_throughput") == 12.5
    assert b.stat({"records": {"time_to_first_token": {"avg": 3.0}}}, "time_to_first_token") == 3.0
    assert b.stat({}, "inter_token_latency") is None
