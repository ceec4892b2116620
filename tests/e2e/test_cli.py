"""The CLI boundary: help with examples, one-line errors with exit codes, --debug tracebacks, locking."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trtspec.cli import main

COMMANDS = ["build", "data", "convert", "train", "quantize", "export", "engine", "validate", "inspect", "doctor"]


def run(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_has_help_with_example(cmd):
    for flag in ("--help", "-h"):
        r = run(cmd, flag)
        assert r.exit_code == 0 and "Example" in r.output, r.output


def one_error_line(r, code):
    assert r.exit_code == code, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert lines[0].startswith("Error: ") and "Traceback" not in r.output, r.output
    return lines[0]


def test_missing_config_file():
    assert "does not exist" in one_error_line(run("build", "nope.yaml"), 2)


def test_unknown_stage(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"sources": [{"kind": "jsonl", "path": "x"}]}}))
    line = one_error_line(run("build", str(cfg), "--out", str(tmp_path / "r"), "--until", "trian"), 2)
    assert "'trian' is not a stage" in line


def test_locked_run_dir(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"sources": [{"kind": "jsonl", "path": "x"}]}}))
    out = tmp_path / "r"
    out.mkdir()
    (out / "trtspec-run.json").write_text("{}")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (out / ".lock").write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname()}))
        assert "in use by another trtspec process" in one_error_line(run("build", str(cfg), "--out", str(out)), 4)
    finally:
        holder.kill()
        holder.wait()


def test_inspect_foreign_dir(tmp_path):
    assert "not a trtspec run" in one_error_line(run("inspect", str(tmp_path)), 2)


def finished_run(path: Path, stages=("data", "convert")) -> Path:
    from trtspec.artifacts import RunDir

    run = RunDir(path)
    run.ensure()
    for stage in stages:
        with run.staging(stage) as out:
            (out / "rows.jsonl").write_text("{}\n")
            run.commit(stage, out, {"stage": stage, "status": "done", "fingerprint": "f", "metrics": {"headline": f"{stage} ok"}})
    return path


def test_inspect_intact_run(tmp_path):
    r = run("inspect", str(finished_run(tmp_path / "r")))
    assert r.exit_code == 0 and "Error" not in r.output, r.output
    assert "data ok" in r.output and "convert ok" in r.output


def test_inspect_names_the_corrupt_manifest_and_fails(tmp_path):
    manifest = finished_run(tmp_path / "r") / "convert" / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])
    r = run("inspect", str(tmp_path / "r"), "--json")
    assert r.exit_code == 2, r.output
    rows = {row["stage"]: row for row in json.loads(r.output[: r.output.index("Error: ")])["stages"]}
    assert rows["data"]["status"] == "done" and rows["convert"]["status"] == "corrupted" and rows["train"]["status"] == "missing"
    line = next(ln for ln in r.output.splitlines() if ln.startswith("Error: "))
    assert f"stage convert: '{manifest}' is not valid JSON" in line, r.output


def test_inspect_names_a_changed_file_and_fails(tmp_path):
    (finished_run(tmp_path / "r") / "data" / "rows.jsonl").write_text("edited\n")
    r = run("inspect", str(tmp_path / "r"))
    line = next(ln for ln in r.output.splitlines() if ln.startswith("Error: "))
    assert r.exit_code == 2 and "data/rows.jsonl: size" in line, r.output


def test_doctor_json():
    r = run("doctor", "--json")
    info = json.loads(r.output)
    assert r.exit_code == 0 and "engine (trtllm)" in info["stages"] and "engine (vllm)" in info["stages"] and "torch" in info["versions"]


def test_debug_shows_traceback_real_entry_point(tmp_path):
    exe = [sys.executable, "-m", "trtspec.cli"]
    plain = subprocess.run([*exe, "build", str(tmp_path / "nope.yaml")], capture_output=True, text=True)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr and plain.stderr.startswith("Error: ")
    debug = subprocess.run([*exe, "--debug", "build", str(tmp_path / "nope.yaml")], capture_output=True, text=True)
    assert debug.returncode == 2 and "Traceback" in debug.stderr


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`trtspec families | head -0`: the pipe is closed before the table is written; no 'internal error', no
    traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "trtspec.cli", "families"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    assert proc.wait(timeout=60) == 0 and proc.stderr.read() == b""


def test_shipped_configs_validate():
    from trtspec.config import load_config

    configs = sorted(Path("build_configs").glob("*.yaml"))
    assert configs
    for p in configs:
        load_config(p)


def test_loading_model_optimizer_does_not_load_vllm():
    """trtspec's processes load Model Optimizer without its vLLM quantization plugin (which imports vLLM: seconds of
    every build's start)."""
    code = ("import sys, trtspec, modelopt.torch.speculative, modelopt.torch.quantization; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'vllm'}))")
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr[-2000:]
