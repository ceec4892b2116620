"""The serving sweep's table (trtspec.engines.vllm.sweep): aiperf's summary fields read, speedups, the schedule against the
best fixed length and no draft, where speculation stops paying."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtspec.engines.vllm import sweep


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


def test_a_server_writes_its_temp_files_in_a_folder_of_its_own(tmp_path, monkeypatch):
    """vLLM's sockets and rendezvous file go to the server's folder (TMPDIR too); inductor's cache stays where it
    was; the folder's path is short enough for a socket's name."""
    import tempfile

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the temp folder this process sees
    env = {"PATH": "/usr/bin"}
    folder = sweep.server_temp_folder(env)
    assert env["VLLM_RPC_BASE_PATH"] == env["TMPDIR"] == folder and Path(folder).parent == tmp_path
    assert env["TORCHINDUCTOR_CACHE_DIR"] == default_cache_dir() and Path(default_cache_dir()).parent == tmp_path
    assert len(folder) < len(str(tmp_path)) + 30


def test_a_stopped_server_leaves_no_temp_folder(tmp_path):
    """stop() ends the server's process group and removes the folder its sockets and rendezvous file were put in."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    (tmp_path / "server").mkdir()
    (tmp_path / "server" / "socket-left-by-vllm").touch()
    (tmp_path / "server" / "vllm_dist_0123").touch()
    sweep.stop(sweep.Server(proc, 0, str(tmp_path / "server")))
    assert proc.returncode is not None and not (tmp_path / "server").exists()


class FakePool:
    """A pool's interface (start, stop, rows) over a table of tokens/s per (label, concurrency), its rows measured by
    the real measure_interleaved, recording what ran in order."""

    speeds: dict = {}
    calls: list = []
    KIND = "fake"

    def __init__(self, plan):
        self.up: set[str] = set()
        self.plan = plan

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        FakePool.calls.append(("exit", sorted(self.up)))

    def start(self, label, k, schedule=None):
        self.up.add(label)
        FakePool.calls.append(("start", label, k, schedule))

    def stop(self, label):
        self.up.remove(label)
        FakePool.calls.append(("stop", label))

    def rows(self, levels, tag=""):
        return sweep.measure_interleaved(self, levels, "aiperf", None, tag, log=lambda m: None)

    def measure(self, label, c, aiperf, prompts, tag):
        assert label in self.up
        FakePool.calls.append(("measure", label, c))
        speed = FakePool.speeds[label, c]
        speed = speed.pop(0) if isinstance(speed, list) else speed
        return row(speed, al=2.0 if label != "k0" else None)


def test_the_sweep_interleaves_draft_lengths_then_measures_the_schedule_beside_no_draft_and_the_fastest():
    FakePool.calls = []
    FakePool.speeds = {("k0", 1): 10, ("k1", 1): 12, ("k2", 1): 15, ("k0", 16): 100, ("k1", 16): 80, ("k2", 16): 70,
                       ("schedule", 1): 14, ("schedule", 16): 95}
    plan = sweep.SweepPlan([1, 16], [0, 1, 2])
    result = sweep.run_sweep(FakePool(plan), plan, log=lambda m: None)
    measured = [c[1:] for c in FakePool.calls if c[0] == "measure"]
    # first every length at 1, then every length at 16; then the schedule beside the fastest and no draft at each
    assert measured[:6] == [("k0", 1), ("k1", 1), ("k2", 1), ("k0", 16), ("k1", 16), ("k2", 16)]
    assert measured[6:] == [("schedule", 1), ("k2", 1), ("k0", 1), ("schedule", 16), ("k0", 16)]
    assert ("stop", "k1") in FakePool.calls  # fastest nowhere: its memory goes to the schedule's engine
    assert ("start", "schedule", 2, {1: 2, 4: 0}) in FakePool.calls  # schedule[1] drafts, as TensorRT-LLM requires
    assert result["schedule"] == {1: 2, 4: 0} and FakePool.calls[-1] == ("exit", ["k0", "k2", "schedule"])
    assert {c: {n: r["tokens_per_s"] for n, r in v.items()} for c, v in result["compared"].items()} == {
        1: {"fastest": 15, "no_draft": 10}, 16: {"fastest": 100, "no_draft": 100}}
    lines = result["table"].splitlines()
    assert lines[2] == "| 1 | 10.0 | 12.0 | 15.0 | 2 | 14.0 | 0.93x | 1.40x | 2.00 |"
    assert lines[3] == "| 16 | 100.0 | 80.0 | 70.0 | 0 | 95.0 | 0.95x | 0.95x | 2.00 |"


def test_repeated_rounds_interleave_and_keep_each_levels_median_round():
    FakePool.calls = []
    FakePool.speeds = {("k0", 4): [30.0, 40.0, 35.0], ("k3", 4): [50.0, 20.0, 45.0]}
    pool = FakePool(sweep.SweepPlan([4], [0, 3], repeats=3))
    pool.start("k0", 0), pool.start("k3", 3)
    rows = pool.rows({4: ["k0", "k3"]})
    assert [c[1] for c in FakePool.calls if c[0] == "measure"] == ["k0", "k3"] * 3  # round by round, back to back
    assert rows["k0"][4]["tokens_per_s"] == 35.0 and rows["k0"][4]["runs"] == [30.0, 40.0, 35.0]
    assert rows["k3"][4]["tokens_per_s"] == 45.0


def test_lockstep_rounds_keep_each_engines_median_round(monkeypatch):
    """LockstepPool.rows (vLLM's lockstep replaced by a table of rounds): plan.repeats rounds of the engines together,
    each engine's median round kept with every round's tokens/s; at least 2 x concurrency requests a round."""
    from trtspec.engines import vllm as vllm_engine

    rounds = iter([{"k0": 30.0, "k3": 50.0}, {"k0": 40.0, "k3": 20.0}, {"k0": 35.0, "k3": 45.0}])
    asked = []

    def lockstep(engines, prompts, max_new, concurrency, requests):
        asked.append((sorted(engines), concurrency, requests))
        speeds = next(rounds)
        return {label: {"tokens_per_s": speeds[label], "ttft_ms": speeds[label], "itl_ms": 1.0} for label in engines}

    monkeypatch.setattr(vllm_engine, "lockstep", lockstep)
    pool = object.__new__(sweep.LockstepPool)  # its engines stand in: rows only steps them through lockstep
    pool.plan, pool.prompts, pool.log = sweep.SweepPlan([16], [0, 3], max_tokens=8, min_requests=8, repeats=3), [[1]], lambda m: None
    pool.engines = {"k0": object(), "k3": object()}
    rows = pool.rows({16: ["k0", "k3"]})
    assert asked == [(["k0", "k3"], 16, 32)] * 3
    assert rows["k0"][16] == {"tokens_per_s": 35.0, "ttft_ms": 35.0, "itl_ms": 1.0, "runs": [30.0, 40.0, 35.0]}
    assert rows["k3"][16]["tokens_per_s"] == 45.0 and rows["k3"][16]["runs"] == [50.0, 20.0, 45.0]


def test_the_schedules_ratio_is_the_median_of_its_rounds_ratios():
    """Rounds measured side by side pair up (a round where the host ran slow for both engines cancels out); the ratio
    of the two median rounds would mix rounds (here 100 / 100 = 1.0x, where the rounds read 1.0x, 0.8x, 0.95x)."""
    schedule = {"tokens_per_s": 100.0, "runs": [100.0, 40.0, 190.0]}
    no_draft = {"tokens_per_s": 100.0, "runs": [100.0, 50.0, 200.0]}
    assert sweep.paired_ratio(schedule, no_draft) == 0.95
    assert sweep.paired_ratio({"tokens_per_s": 90.0}, no_draft) == 0.9  # not measured in the same rounds
    assert sweep.paired_ratio(None, no_draft) is None


class DriftingPool(FakePool):
    """FakePool whose host runs at half speed from the second group on (every engine alike), recording the most
    engines up at once."""

    def __init__(self, plan):
        super().__init__(plan)
        self.most, self.groups_started = 0, 0

    def start(self, label, k, schedule=None):
        if not self.up:
            self.groups_started += 1
        super().start(label, k, schedule)
        self.most = max(self.most, len(self.up))

    def measure(self, label, c, aiperf, prompts, tag):
        r = super().measure(label, c, aiperf, prompts, tag)
        return {**r, "tokens_per_s": r["tokens_per_s"] / (2 if self.groups_started > 1 else 1)}


def test_a_sweep_the_memory_cannot_hold_at_once_runs_in_groups_each_beside_no_draft():
    """engine.sweep on a machine holding 3 engines of 5 draft lengths: groups [0, 1, 2] and [0, 3, 4], never more than
    3 engines up; the second group, measured while the host ran at half speed, is compared through its own no-draft
    row, so the schedule is the one the true speeds imply (k = 3 fastest at 1 request, k = 1 at 4, none at 16)."""
    FakePool.calls = []
    true = {0: {1: 10, 4: 30, 16: 100}, 1: {1: 12, 4: 36, 16: 90}, 2: {1: 13, 4: 33, 16: 80},
            3: {1: 15, 4: 31, 16: 70}, 4: {1: 14, 4: 29, 16: 60}}
    FakePool.speeds = {(f"k{k}", c): v for k, row in true.items() for c, v in row.items()}
    FakePool.speeds |= {("schedule", c): v for c, v in {1: 15, 4: 35, 16: 95}.items()}
    assert sweep.groups_of([0, 1, 2, 3, 4], 3) == [[0, 1, 2], [0, 3, 4]] and sweep.groups_of([0, 1, 2], 3) == [[0, 1, 2]]
    with pytest.raises(ValueError, match="room for no draft and one draft length"):
        sweep.groups_of([0, 1, 2], 1)
    plan = sweep.SweepPlan([1, 4, 16], [0, 1, 2, 3, 4], together=3)
    pool = DriftingPool(plan)
    result = sweep.run_sweep(pool, plan, log=lambda m: None)
    assert pool.most == 3 and result["groups"] == [[0, 1, 2], [0, 3, 4]]
    assert result["rows"][3][1]["tokens_per_s"] == 7.5  # as measured, at half speed
    assert result["schedule"] == {1: 3, 2: 1, 8: 0}  # decided on one clock: 15 > 13 at 1 request
    # the schedule beside no draft and the fastest length where they fit (3 engines: schedule, k0 and one more)
    assert result["compared"][16]["no_draft"]["tokens_per_s"] == 50  # the host still at half speed
