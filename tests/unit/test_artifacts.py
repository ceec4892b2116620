"""The run directory: marker, lock (live and stale), atomic commit, checksums that catch corruption."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trtspec.artifacts import RunDir
from trtspec.errors import ArtifactError, LockedError


def commit_stage(run, stage, content=b"weights", fp="abc"):
    with run.staging(stage) as tmp:
        (tmp / "w.bin").write_bytes(content)
        run.commit(stage, tmp, {"stage": stage, "status": "done", "fingerprint": fp})


def test_refuses_foreign_folder(tmp_path):
    (tmp_path / "precious.txt").write_text("mine")
    with pytest.raises(ArtifactError, match="not a trtspec run"):
        RunDir(tmp_path).ensure()
    assert (tmp_path / "precious.txt").read_text() == "mine"


def test_commit_and_check(tmp_path):
    run = RunDir(tmp_path / "r")
    run.ensure()
    commit_stage(run, "data")
    assert run.check_stage("data", "abc") is None
    assert run.check_stage("data", "other") == "config or inputs changed"
    assert not (run.path / ".tmp-data").exists()


def test_truncated_file_is_detected(tmp_path):
    run = RunDir(tmp_path / "r")
    run.ensure()
    commit_stage(run, "train", b"x" * 1000)
    w = run.stage_dir("train") / "w.bin"
    w.write_bytes(b"x" * 500)
    assert "size" in run.check_stage("train", "abc")
    w.write_bytes(b"y" * 1000)
    assert "checksum" in run.check_stage("train", "abc")
    w.unlink()
    assert "missing" in run.check_stage("train", "abc")


def test_export_stage_lives_in_bundle(tmp_path):
    run = RunDir(tmp_path / "r")
    run.ensure()
    commit_stage(run, "export")
    assert (run.path / "bundle" / "manifest.json").is_file()


def test_unfinished_staging_is_not_trusted(tmp_path):
    run = RunDir(tmp_path / "r")
    run.ensure()
    (run.path / ".tmp-data").mkdir()  # what a kill mid-stage leaves behind
    assert run.check_stage("data", "abc") == "not run yet"


def test_corrupt_manifest_is_redone(tmp_path):
    run = RunDir(tmp_path / "r")
    run.ensure()
    commit_stage(run, "data")
    (run.stage_dir("data") / "manifest.json").write_text("{not json")
    assert "manifest" in run.check_stage("data", "abc")


def test_read_manifest_names_a_corrupt_manifest(tmp_path):
    run = RunDir(tmp_path / "r")
    run.ensure()
    assert run.read_manifest("data") is None  # not run: nothing to report
    commit_stage(run, "data")
    manifest = run.stage_dir("data") / "manifest.json"
    manifest.write_text(manifest.read_text()[:30])
    with pytest.raises(ArtifactError, match=f"'{manifest}' is not valid JSON"):
        run.read_manifest("data")
    manifest.write_text("[1, 2]")
    with pytest.raises(ArtifactError, match="not a manifest"):
        run.read_manifest("data")
    assert run.manifest("data") is None and "manifest" in run.check_stage("data", "abc")


def test_lock_refuses_a_live_holder(tmp_path):
    run = RunDir(tmp_path / "r")
    run.ensure()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        import socket

        (run.path / ".lock").write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname()}))
        with pytest.raises(LockedError, match=f"pid {holder.pid}"):
            with run.locked():
                pass
    finally:
        holder.kill()
        holder.wait()


def test_stale_lock_is_taken_over(tmp_path):
    run = RunDir(tmp_path / "r")
    run.ensure()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket

    (run.path / ".lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    with run.locked():
        assert json.loads((run.path / ".lock").read_text())["pid"] == os.getpid()
    assert not (run.path / ".lock").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_run_dir(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        with pytest.raises(ArtifactError, match="not writable"):
            RunDir(d).ensure()
    finally:
        d.chmod(0o700)


def test_a_stage_keys_only_on_the_settings_this_config_uses():
    """train keys on eval.context_source only where eval.context_bins asks for bins: without them a change of the
    source retrains nothing; with them it does (the stage's `unused` hook: pipeline.runner.at_defaults)."""
    from trtspec.config import config_from_dict
    from trtspec.pipeline.runner import work_key

    def key(**ev):
        cfg = config_from_dict({"data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}, "eval": ev})
        return work_key(cfg, "train", {"data": "d", "convert": "c"})

    assert key() == key(context_source="documents", context_prompts=9)
    assert key(context_bins=[64]) != key(context_bins=[64], context_source="documents")
    import trtspec.stages.train as train

    unused, with_hook = train.unused, key()
    train.unused = lambda cfg: ()  # every key as set, as before the hook: a run keyed then keeps its key
    try:
        assert key() == with_hook and key(context_source="documents") != with_hook
    finally:
        train.unused = unused
    assert key() != key(context_bins=[64])
    assert work_key(config_from_dict({"data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}, "eval": {"context_source": "documents"}}),
                    "validate", {}) != work_key(config_from_dict({"data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}}), "validate", {})


def test_an_edited_baseline_file_redoes_validate(tmp_path):
    """validate.baseline is hashed into validate's fingerprint as its prompt files are (runner.input_files)."""
    from trtspec.config import config_from_dict
    from trtspec.pipeline.runner import input_files

    (tmp_path / "base.json").write_text('{"per_category": {"chat": {"acceptance_length": 2.0}}}')
    cfg = config_from_dict({"data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}, "validate": {"baseline": "base.json"}},
                           base_dir=tmp_path)
    before = input_files(cfg, "validate")
    (tmp_path / "base.json").write_text('{"per_category": {"chat": {"acceptance_length": 2.5}}}')
    assert list(before) == ["base.json"] and input_files(cfg, "validate") != before


def test_benchmarks_read_a_run_only_as_its_manifests_vouch(tmp_path):
    """The bench scripts' reads (bench.verified: open_bundle, load_prompt_rows, stage_metrics, model_source) check the
    stage's files first, as deploy does: an edited prompt file or a shard added to the bundle is refused by name."""
    from trtspec.bench import load_prompt_rows, stage_metrics, verified

    run = RunDir(tmp_path / "run")
    run.ensure()
    row = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    with run.staging("data") as out:
        (out / "heldout.jsonl").write_text(row + "\n")
        run.commit("data", out, {"stage": "data", "status": "done", "fingerprint": "f", "metrics": {"rows": 1}})
    with run.staging("export") as out:
        (out / "draft").mkdir()
        (out / "draft" / "model.safetensors").write_text("weights")
        run.commit("export", out, {"stage": "export", "status": "done", "fingerprint": "f"})
    assert len(load_prompt_rows(run.path, 4)) == 1 and stage_metrics(run.path, "data") == {"rows": 1}
    (run.path / "data" / "heldout.jsonl").write_text(row.replace("hi", "ho") + "\n")
    with pytest.raises(ArtifactError, match=r"data/heldout\.jsonl' no longer matches what the data stage wrote"):
        load_prompt_rows(run.path, 4)
    (run.path / "bundle" / "draft" / "model-00002-of-00002.safetensors").write_text("more")
    with pytest.raises(ArtifactError, match=r"model-00002-of-00002\.safetensors' no longer matches .* \(added after"):
        verified(run.path, "export")
