"""Multi-process training as users launch it, on this CPU: `torchrun --nproc_per_node 2 ... trtspec build` with the
gloo backend. Rank 0 runs the pipeline; both ranks train (DDP). Two processes of batch b follow one process of batch
2b step by step, and a run whose rank 1 is killed resumes from its last checkpoint."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from e2e.test_kill_resume import ROWS

pytestmark = pytest.mark.timeout(900)

# a step's loss is the mean of each rank's mean over its rows' tokens (DDP averages the ranks' gradients); one
# process takes the mean over all tokens at once. They differ by the token counts of the two halves: measured
# < 0.03% per step on these rows, and the trained heads' weights by <= 0.2% (relative norm of the difference). A
# process training alone at the half batch (what a rank would do without the gradient all-reduce) differs by 1.6-3.9%
# in every weight matrix.
LOSS_RTOL = 5e-3
HEAD_RTOL = 5e-3


def write_config(tmp: Path, model: Path, batch_size: int, **train) -> Path:
    data = tmp / "convs.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n"
                            for q, a in ROWS * 4))
    raw = {
        "seed": 0,
        "model": {"source": str(model)},
        "data": {"sources": [{"kind": "jsonl", "path": str(data)}], "seq_len": 64, "holdout_fraction": 0.1},
        "convert": {"draft_vocab_size": 512},
        "train": {"mode": "offline", "epochs": 2.0, "batch_size": batch_size, "save_steps": 4, **train},
        "eval": {"acceptance_prompts": 2},
    }
    p = tmp / f"b{batch_size}.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


def torchrun(cfg: Path, out: Path, procs: int = 2) -> list[str]:
    # --log-dir: torchrun's folder of the ranks' logs, otherwise a torchelastic_* folder it leaves in the temp folder
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
            f"--log-dir={out}-ranks", "-m", "trtspec.cli", "build", str(cfg), "--out", str(out), "--until", "train"]


def single(cfg: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "trtspec.cli", "build", str(cfg), "--out", str(out), "--until", "train"]


def run_ok(cmd: list[str]) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def log_rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "train" / "train_log.jsonl").read_text().splitlines()]


def head(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(run / "train" / "head.safetensors")


def test_two_processes_follow_one_process_of_twice_the_batch(tmp_path, tiny_model_dir):
    two = run_ok(torchrun(write_config(tmp_path, tiny_model_dir, 2), tmp_path / "two"))
    run_ok(single(write_config(tmp_path, tiny_model_dir, 4), tmp_path / "one"))
    assert "2 processes" in two.stdout
    manifest = json.loads((tmp_path / "two" / "train" / "manifest.json").read_text())
    assert manifest["metrics"]["world_size"] == 2
    assert len(manifest["metrics"]["peak_rss_gib_by_rank"]) == 2
    a, b = log_rows(tmp_path / "one"), log_rows(tmp_path / "two")
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 19))  # 36 rows / 4 per step x 2 epochs
    for x, y in zip(a, b, strict=True):
        assert abs(x["loss"] - y["loss"]) <= LOSS_RTOL * x["loss"], (x, y)
    ha, hb = head(tmp_path / "one"), head(tmp_path / "two")
    for k in ha:
        if not ha[k].is_floating_point():  # the draft vocabulary's mapping
            assert ha[k].equal(hb[k])
            continue
        diff = float((ha[k] - hb[k]).norm() / max(float(ha[k].norm()), 1e-12))
        assert diff < HEAD_RTOL, (k, diff)
    # one process trains nothing else: its own run directory holds no follower's trace
    assert not list((tmp_path / "two").glob(".lock"))


@pytest.mark.parametrize("mode", ["offline", pytest.param("online", marks=pytest.mark.full)])
def test_fsdp_shards_the_head_and_follows_one_process(tmp_path, tiny_model_dir, mode):
    # online: every rank runs the frozen target itself, whole (FSDP's ignored parameters), beside its half of the head
    run_ok(single(write_config(tmp_path, tiny_model_dir, 4, mode=mode), tmp_path / "one"))
    fsdp = run_ok(torchrun(write_config(tmp_path, tiny_model_dir, 2, mode=mode, sharding="fsdp", eval_steps=9),
                           tmp_path / "fsdp"))
    assert "2 processes" in fsdp.stdout
    metrics = json.loads((tmp_path / "fsdp" / "train" / "manifest.json").read_text())["metrics"]
    assert metrics["sharding"] == "fsdp"
    whole = sum(v.numel() for v in head(tmp_path / "fsdp").values() if v.is_floating_point())
    assert sum(metrics["head_parameters_by_rank"]) == whole  # each rank held half of the head, not a copy
    assert max(metrics["head_parameters_by_rank"]) <= 0.55 * whole
    a, b = log_rows(tmp_path / "one"), log_rows(tmp_path / "fsdp")
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 19))
    for x, y in zip(a, b, strict=True):
        assert abs(x["loss"] - y["loss"]) <= LOSS_RTOL * x["loss"], (x, y)
    assert [r["step"] for r in b if "eval" in r] == [9, 18]  # the gathered head, measured during training
    ha, hb = head(tmp_path / "one"), head(tmp_path / "fsdp")
    for k in ha:
        if ha[k].is_floating_point():
            diff = float((ha[k] - hb[k]).norm() / max(float(ha[k].norm()), 1e-12))
            assert diff < HEAD_RTOL, (k, diff)


def rank_pid(launcher: subprocess.Popen, rank: int) -> int | None:
    import psutil

    for p in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if p.environ().get("RANK") == str(rank) and "trtspec.cli" in " ".join(p.cmdline()):
                return p.pid
        except psutil.Error:
            continue
    return None


def kill_rank_1_after_a_checkpoint(cfg: Path, out: Path) -> None:
    """Launch 2 ranks, SIGKILL rank 1 as soon as a checkpoint is complete; the launch fails and leaves no result."""
    import os

    launcher = subprocess.Popen(torchrun(cfg, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    t0, killed = time.time(), False
    while time.time() - t0 < 300 and launcher.poll() is None:
        if list(out.glob(".work/train-*/checkpoints/checkpoint-*/trainer_state.json")) and (pid := rank_pid(launcher, 1)):
            os.kill(pid, signal.SIGKILL)
            killed = True
            break
        time.sleep(0.05)
    assert killed, "training finished before a checkpoint could be caught"
    assert launcher.wait(timeout=120) != 0  # torchrun stops the other rank and fails
    assert not (out / "train" / "manifest.json").exists()


@pytest.mark.full
def test_a_killed_rank_is_resumed_from_the_last_checkpoint(tmp_path, tiny_model_dir):
    cfg = write_config(tmp_path, tiny_model_dir, 2, epochs=40.0, save_steps=20)  # 360 steps
    out = tmp_path / "run"
    kill_rank_1_after_a_checkpoint(cfg, out)
    again = run_ok(torchrun(cfg, out))
    assert "resuming from checkpoint-" in again.stderr
    steps = [r["step"] for r in log_rows(out)]
    assert steps == list(range(1, 361))  # logged once each: the log was cut back to the checkpoint
    metrics = json.loads((out / "train" / "manifest.json").read_text())["metrics"]
    assert metrics["resumed_from_step"] > 0 and metrics["world_size"] == 2


def accelerate_launch(cfg: Path, out: Path, procs: int = 2) -> list[str]:
    # --multi_gpu is accelerate's torch.distributed.run launcher; on a machine without GPUs the ranks use gloo.
    # (--cpu with several processes is accelerate's mpirun launcher, which needs MPI and a hostfile.)
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", f"--num_processes={procs}", "--num_machines=1",
            "--mixed_precision=no", "--dynamo_backend=no", f"--log_dir={out}-ranks", "-m", "trtspec.cli", "build", str(cfg), "--out", str(out),
            "--until", "train"]


@pytest.mark.full
def test_accelerate_launch_trains_as_torchrun_does(tmp_path, tiny_model_dir):
    cfg = write_config(tmp_path, tiny_model_dir, 2)
    run_ok(torchrun(cfg, tmp_path / "torchrun"))
    r = run_ok(accelerate_launch(cfg, tmp_path / "accelerate"))
    assert "2 processes" in r.stdout
    assert json.loads((tmp_path / "accelerate" / "train" / "manifest.json").read_text())["metrics"]["world_size"] == 2
    a, b = log_rows(tmp_path / "torchrun"), log_rows(tmp_path / "accelerate")
    assert [r["loss"] for r in a] == [r["loss"] for r in b]  # the same processes, rows and order: the same run


@pytest.mark.full
def test_a_killed_fsdp_run_resumes_its_optimizer_shards(tmp_path, tiny_model_dir):
    cfg = write_config(tmp_path, tiny_model_dir, 2, epochs=10.0, save_steps=10, sharding="fsdp")  # 90 steps
    whole = tmp_path / "whole"
    run_ok(torchrun(cfg, whole))
    out = tmp_path / "run"
    kill_rank_1_after_a_checkpoint(cfg, out)
    again = run_ok(torchrun(cfg, out))
    assert "resuming from checkpoint-" in again.stderr
    resumed = json.loads((out / "train" / "manifest.json").read_text())["metrics"]["resumed_from_step"]
    assert resumed > 0
    # after the checkpoint the resumed run takes the uninterrupted run's steps: the same weights, AdamW moments,
    # schedule and rows (a fresh optimizer would start its moments at zero and leave these curves)
    a, b = log_rows(whole), log_rows(out)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 91))
    for x, y in zip(a[resumed:], b[resumed:], strict=True):
        assert abs(x["loss"] - y["loss"]) <= 1e-3 * x["loss"], (x, y)
