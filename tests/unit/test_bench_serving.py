"""The serving sweep's table (trtspec.deploy.sweep): aiperf's summary fields read, speedups, the schedule against the
best fixed length and no draft, where speculation stops paying."""

from __future__ import annotations

from trtspec.deploy import sweep


def row(tps, ttft=100.0, itl=20.0, al=None):
    return {"tokens_per_s": tps, "ttft_ms": ttft, "itl_ms": itl, "requests_per_s": 1.0, "acceptance_length": al}


def test_sweep_table_and_crossover():
    b = sweep
    rows = {0: {1: row(20.0), 4: row(60.0), 32: row(120.0)},
            3: {1: row(30.0, al=2.1), 4: row(60.0, al=2.0), 32: row(90.0, al=1.9)}}
    text, where = b.sweep_table(rows, None)
    assert where == "k=3 pays at concurrency 1, 4; costs at 32 (0.75x)"
    lines = text.splitlines()
    assert lines[0] == "| concurrency | k=0 tok/s | k=3 tok/s | fastest k | AL k=3 |" and lines[1] == "|---:|---:|---:|---:|---:|"
    assert lines[2] == "| 1 | 20.0 | 30.0 | 3 | 2.10 |" and lines[3] == "| 4 | 60.0 | 60.0 | 0 | 2.00 |"  # a tie: no draft


def test_sweep_table_with_the_schedule_against_the_best_fixed_length_and_no_draft():
    b = sweep
    rows = {0: {1: row(20.0), 16: row(100.0)}, 3: {1: row(30.0, al=2.0), 16: row(80.0, al=2.0)}}
    text, _ = b.sweep_table(rows, {1: row(29.0), 16: row(95.0)})
    lines = text.splitlines()
    assert lines[0].endswith("| fastest k | schedule tok/s | vs fastest k | vs no draft | AL k=3 |")
    assert lines[2] == "| 1 | 20.0 | 30.0 | 3 | 29.0 | 0.97x | 1.45x | 2.00 |"
    assert lines[3] == "| 16 | 100.0 | 80.0 | 0 | 95.0 | 0.95x | 0.95x | 2.00 |"


def test_stat_reads_aiperf_exports():
    b = sweep
    assert b.stat({"output_token_throughput": {"unit": "tokens/sec", "avg": 12.5}}, "output_token_throughput") == 12.5
    assert b.stat({"records": {"time_to_first_token": {"avg": 3.0}}}, "time_to_first_token") == 3.0
    assert b.stat({}, "inter_token_latency") is None
