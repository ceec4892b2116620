"""Kill tests: SIGKILL `trtspec build` inside each stage (mid-training and mid-export too), re-run, and check the
run resumes (training from its last checkpoint, not from zero) and ends with the same results as an uninterrupted
run. Plus determinism: the same config and seed give the same head weights and report figures.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from trtspec.artifacts import sha256_file

ROWS = [
    ("Name three colors.", "Red, green and blue are three colors that people like."),
    ("What is 12 plus 30?", "12 plus 30 is 42. You add the tens and then the ones."),
    ("Write a haiku about rain.", "Soft rain on the roof, a quiet song in the night, puddles hold the sky."),
    ("Explain what a CPU does.", "A CPU runs the instructions of programs: it fetches, decodes and executes them."),
    ("Say hello to a friend.", "Hello, my friend! It is good to see you again after so long."),
    ("List two fruits.", "Apples and bananas are two fruits that many people eat."),
    ("What is the capital of France?", "The capital of France is Paris, a city on the Seine."),
    ("Give me a tip for sleeping well.", "Go to bed at the same time every night and keep the room dark."),
    ("Write a Python function that doubles a number.", "def double(x):\n    return 2 * x"),
    ("What color is the sky?", "On a clear day the sky is blue, because air scatters blue light most."),
]

# (stage, trigger): the build is killed as soon as the trigger path pattern exists under the run dir
KILL_POINTS = [
    ("data", ".tmp-data"),
    ("convert", ".tmp-convert"),
    ("train", ".work/train-*/checkpoints/checkpoint-*/trainer_state.json"),  # mid-training, after a full checkpoint
    ("quantize", ".tmp-quantize"),
    ("export", ".tmp-export/draft"),  # mid-export: the draft written, the rest not yet
    ("validate", ".tmp-validate"),
]


def write_config(tmp: Path, model: Path) -> Path:
    data = tmp / "convs.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n" for q, a in ROWS))
    raw = {
        "seed": 0,
        "model": {"source": str(model)},
        "data": {"sources": [{"kind": "jsonl", "path": str(data)}], "seq_len": 64, "holdout_fraction": 0.2},
        "convert": {"draft_vocab_size": 512},
        "train": {"mode": "offline", "epochs": 6.0, "batch_size": 2, "save_steps": 4},
        # fp8 (simulated on CPU): a real quantize stage to kill, and the quantized path through export and validate
        "quantize": {"format": "fp8", "calib_samples": 4},
        "export": {"onnx": True},
        "eval": {"num_prompts": 2, "max_new_tokens": 12, "repeats": 1, "acceptance_prompts": 2},
        # eager: compiling (35 s) is not what a kill tests; tests/stages/test_validate.py covers the compiled runtime
        "validate": {"compile": False, "compare_hf": False, "sampling_temperature": None},
    }
    p = tmp / "tiny.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


def build_cmd(cfg: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "trtspec.cli", "build", str(cfg), "--out", str(out), "--until", "validate"]


def run_to_end(cfg: Path, out: Path) -> subprocess.CompletedProcess:
    r = subprocess.run(build_cmd(cfg, out), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def kill_when(cfg: Path, out: Path, pattern: str, timeout: float = 600) -> bool:
    """Start a build; SIGKILL it when `pattern` exists under `out`. False if it finished before that."""
    proc = subprocess.Popen(build_cmd(cfg, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            return False
        if any(out.glob(pattern)):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"trigger {pattern} never appeared")


def results(out: Path) -> dict:
    """What must not depend on interruptions: the data, the head, the draft checkpoint, the greedy/AL figures."""
    report = json.loads((out / "validate" / "report.json").read_text())
    return {
        "train.jsonl": sha256_file(out / "data" / "train.jsonl"),
        "head": sha256_file(out / "train" / "head.safetensors"),
        "draft": sha256_file(out / "bundle" / "draft" / "model.safetensors"),
        "greedy_match": report["greedy_match"],
        "acceptance_length": report["acceptance_length"],
    }


@pytest.mark.integration
def test_killed_in_every_stage_resumes_to_the_same_result(tmp_path, tiny_model_dir):
    cfg = write_config(tmp_path, tiny_model_dir)
    reference = tmp_path / "reference"
    run_to_end(cfg, reference)
    expected = results(reference)

    out = tmp_path / "killed"
    hit = [stage for stage, pattern in KILL_POINTS if kill_when(cfg, out, pattern)]
    assert hit == [s for s, _ in KILL_POINTS], f"kill points reached: {hit}"
    final = run_to_end(cfg, out)
    # training resumed from the checkpoint it was killed after, not from step 0
    train_log = [json.loads(x) for x in (out / "train" / "train_log.jsonl").read_text().splitlines() if x.strip()]
    steps = [r["step"] for r in train_log if "step" in r]
    assert steps == sorted(set(steps)), "train_log has repeated or missing steps after resume"
    assert json.loads((out / "train" / "manifest.json").read_text())["metrics"].get("resumed_from_step", 0) > 0
    assert results(out) == expected
    assert "Traceback" not in final.stderr


@pytest.mark.integration
@pytest.mark.full
def test_same_seed_same_head_and_figures(tmp_path, tiny_model_dir):
    cfg = write_config(tmp_path, tiny_model_dir)
    run_to_end(cfg, tmp_path / "a")
    run_to_end(cfg, tmp_path / "b")
    assert results(tmp_path / "a") == results(tmp_path / "b")
