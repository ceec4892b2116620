"""train.states_from: vllm: the states vLLM extracts (speculative method extract_hidden_states, trtspec's CPU
connector) are the HF forward's, family by family, in trtspec's numbering (aux layer a = output of layer a; last =
the final norm's output). A draft trained on one and served on the other would otherwise accept nothing.

The families vLLM cannot extract from are refused by name (trtspec.training.engine_states.refusal). Three families
run in the default tier, every family in the full tier (TRTSPEC_TIER=full bash scripts/test.sh)."""

from __future__ import annotations

import pytest

from trtspec.engines.vllm.support import patches_transformers, refusal_for
from trtspec.targets import BY_MODEL_TYPE
from trtspec.targets.tiny import TINY

DEFAULT_TIER = ("llama3", "qwen3_moe", "gpt_oss")


def extractable(name: str) -> bool:
    return refusal_for(BY_MODEL_TYPE[TINY[name][0]].name, "eagle3", on_gpu=False) is None


FAMILIES = [pytest.param(n, marks=() if n in DEFAULT_TIER else pytest.mark.full) for n in TINY if extractable(n)]


def vllm_states(model_dir, aux, layers, norm, folder, rows, spawned=False):
    """The states vLLM extracts for `rows` (VllmStates, opened and closed)."""
    from trtspec.training.engine_states import VllmStates

    vllm = VllmStates(model_dir, aux, layers, norm, folder, "float32", 128, spawned=spawned)
    try:
        return vllm.extract(rows)
    finally:
        vllm.close()


@pytest.mark.parametrize("name", FAMILIES)
def test_vllm_states_equal_hf_states(name, tmp_path):
    import numpy as np
    import torch

    from trtspec.models import load_model, resolve_model
    from trtspec.training.engine_states import final_norm
    from trtspec.training.states import HFStates

    model_dir = resolve_model(f"tiny:{name}")
    base = load_model(model_dir, "float32")
    layers = base.config.num_hidden_layers
    aux = [0, 1, layers - 2]
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 400, (n,), generator=g) for n in (5, 37, 70)]
    hf = HFStates(base, aux).extract(rows)
    # vLLM's Transformers backend rewrites transformers' classes in the process it runs in: VllmStates runs it in a
    # spawned one, as a build does, so that later tests in this process build those families with transformers' own
    spawned = patches_transformers(BY_MODEL_TYPE[TINY[name][0]].name)
    got = vllm_states(model_dir, aux, layers, final_norm(base), tmp_path / "states", rows, spawned)
    assert not list((tmp_path / "states").glob("*")), "every file vLLM wrote is deleted once read"
    for (ha, hl), (va, vl), r in zip(hf, got, rows, strict=True):
        assert ha.shape == va.shape == (len(r), len(aux) * base.config.hidden_size)
        assert hl.shape == vl.shape == (len(r), base.config.hidden_size)
        for what, h, v in (("aux", ha, va), ("last", hl, vl)):
            h, v = h.astype(np.float32), v.astype(np.float32)
            scale = float(np.abs(h).max())
            err = float(np.abs(h - v).max())
            assert err <= 2e-3 * scale + 2e-3, f"{name} {what}: max |hf - vllm| {err:.4g} (|hf| up to {scale:.3g})"


def test_a_family_vllm_cannot_extract_from_is_refused_by_name():
    from types import SimpleNamespace

    from trtspec.errors import ConfigError
    from trtspec.training.engine_states import check_engine_states

    config = SimpleNamespace(model_type="mixtral")
    with pytest.raises(ConfigError, match="mixtral.*train.states_from: hf"):
        check_engine_states(config)


@pytest.mark.full  # OLMo 2 is a full-tier family
def test_a_family_vllm_serves_through_its_transformers_backend_answers_and_extracts_in_a_spawned_process(tmp_path):
    """data.answer_with: vllm and train.states_from: vllm for OLMo 2, whose vLLM Transformers backend rewrites
    transformers' classes in the process it runs in: vLLM runs in a spawned process, so the same build's convert and
    export still load the target with transformers (they failed as 'corrupted' when vLLM ran in the build's process),
    and vLLM's greedy answers are the HF forward's."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    runs = {}
    for name, extra in (("hf", ["--until", "data"]),
                        ("vllm", ["--until", "export", "--set", "data.answer_with=vllm", "--set", "train.states_from=vllm",
                                  "--set", "train.mode=streamed"])):
        run = tmp_path / name
        proc = subprocess.run([sys.executable, "-m", "trtspec.cli", "build", str(root / "build_configs" / "tiny-families.yaml"),
                               "--out", str(run), "--set", "model.source=tiny:olmo2", *extra],
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = [json.loads(line)["input_ids"] for line in (run / "data" / "train.jsonl").read_text().splitlines()]
    assert runs["vllm"] == runs["hf"]
    train = json.loads((tmp_path / "vllm" / "train" / "manifest.json").read_text())["metrics"]
    assert train["states"]["from"] == "vllm" and train["states"]["rows_extracted"] > 0
    assert (tmp_path / "vllm" / "bundle" / "manifest.json").is_file()


@pytest.mark.full  # the default tier's states-server test trains with no target layer too
def test_the_trainer_holds_no_target_layer_when_vllm_computes_the_states(tmp_path):
    """train.states_from: vllm, streamed: the train stage loads the target without its decoder layers (embeddings,
    final norm, output head only: Model Optimizer's offline path), its held-out greedy answers come from vLLM and
    equal the HF forward's, and the draft it trains accepts as the one trained on the HF forward's states."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    import torch

    root = Path(__file__).resolve().parents[2]
    runs = {}
    for name, extra in (("hf", []), ("vllm", ["--set", "train.states_from=vllm", "--set", "train.mode=streamed"])):
        run = tmp_path / name
        proc = subprocess.run([sys.executable, "-m", "trtspec.cli", "build", str(root / "build_configs" / "tiny-families.yaml"),
                               "--out", str(run), "--set", "model.source=tiny:llama3", "--until", "train", *extra],
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = json.loads((run / "train" / "manifest.json").read_text())["metrics"]
    hf, vllm = runs["hf"], runs["vllm"]
    assert hf["target_in_trainer"]["decoder_layers"] == hf["target_in_trainer"]["of_layers"] == 4
    assert vllm["target_in_trainer"]["decoder_layers"] == 0 and vllm["target_in_trainer"]["of_layers"] == 4
    assert vllm["target_in_trainer"]["parameters"] < hf["target_in_trainer"]["parameters"]
    assert vllm["states"]["from"] == "vllm" and vllm["states"]["rows_extracted"] > 0
    answers = {name: torch.load(next((tmp_path / name).glob(f".work/target-*/eval_seqs-{tag}3x24.pt")), weights_only=True)
               for name, tag in (("hf", ""), ("vllm", "vllm-"))}
    assert [a["input_ids"].tolist() for a in answers["vllm"]] == [a["input_ids"].tolist() for a in answers["hf"]]
    assert abs(vllm["AL@3"] - hf["AL@3"]) <= 0.1, (vllm["AL@3"], hf["AL@3"])


def test_a_draft_trained_on_states_from_a_vllm_server_it_was_launched_for(tmp_path, vllm_temp_env):
    """train.states_from: endpoint, as a user runs it: convert, `trtspec states-server` prints the launch line, the
    server started by that very line (vLLM's OpenAI server with the extraction, on a CPU trtspec's connector), then the
    build trains on its states (streamed) and its greedy answers in two processes (torchrun), each fetching only the
    rows it reads, holding no decoder layer of the target; every file the server wrote is read and deleted."""
    import json
    import os
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    from trtspec.engines.vllm.sweep import end_group, free_port

    root = Path(__file__).resolve().parents[2]
    port = free_port()
    folder = tmp_path / "shared"
    run = tmp_path / "run"
    base = [sys.executable, "-m", "trtspec.cli"]
    sets = ["--set", "model.source=tiny:llama3", "--set", "train.states_from=endpoint", "--set", "train.mode=streamed",
            "--set", "train.batch_size=2",
            "--set", f"train.states_endpoint.url=http://127.0.0.1:{port}", "--set", f"train.states_endpoint.folder={folder}"]
    recipe = str(root / "build_configs" / "tiny-families.yaml")

    def cli(*args: str, launcher: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        proc = subprocess.run([*(launcher or base), *args], capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    cli("build", recipe, "--out", str(run), "--until", "convert", *sets)
    line = json.loads(cli("states-server", recipe, "--out", str(run), "--json", *sets).stdout)["launch"]
    assert f"--port {port}" in line and str(folder) in line and "extract_hidden_states" in line
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **vllm_temp_env}
    with (tmp_path / "server.log").open("w") as log:
        server = subprocess.Popen(["bash", "-c", line], env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        deadline = time.time() + 300
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
                break
            except OSError:
                assert time.time() < deadline, "the states server did not start"
                time.sleep(2)
        two = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               f"--log-dir={tmp_path / 'ranks'}", "-m", "trtspec.cli")
        cli("build", recipe, "--out", str(run), "--until", "train", *sets, launcher=two)
    finally:
        end_group(server)
    m = json.loads((run / "train" / "manifest.json").read_text())["metrics"]
    assert m["states"]["from"] == "endpoint" and m["world_size"] == 2
    # rank 0 reads half of each step's 4 rows; it extracts those (and a batch wrapped round at an epoch's end), not all
    assert m["steps"] * 2 <= m["states"]["rows_extracted"] < m["steps"] * 3, (m["steps"], m["states"])
    assert m["target_in_trainer"]["decoder_layers"] == 0 and m["AL@3"] >= 1.0
    assert not list(folder.glob("*.safetensors")), "every states file the server wrote was read and deleted"


@pytest.mark.full
def test_a_killed_streamed_run_resumes_without_training_or_extracting_again(tmp_path):
    """train.states_from: vllm, streamed, SIGKILLed after its first checkpoint: the rerun resumes from it, trains only
    the steps left (no step twice in the log), has vLLM extract only the rows of those steps, and ends with the head
    of a run never killed."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from trtspec.artifacts import sha256_file

    root = Path(__file__).resolve().parents[2]

    def cmd(run: Path) -> list[str]:
        return [sys.executable, "-m", "trtspec.cli", "build", str(root / "build_configs" / "tiny-families.yaml"),
                "--out", str(run), "--set", "model.source=tiny:llama3", "--until", "train", "--set", "train.states_from=vllm",
                "--set", "train.mode=streamed", "--set", "train.save_steps=20"]

    def finish(run: Path) -> dict:
        proc = subprocess.run(cmd(run), capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads((run / "train" / "manifest.json").read_text())["metrics"]

    whole = finish(tmp_path / "whole")
    killed = tmp_path / "killed"
    proc = subprocess.Popen(cmd(killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600
    while not any(killed.glob(".work/train-*/checkpoints/checkpoint-*/trainer_state.json")):
        assert proc.poll() is None and time.time() < deadline, "the build ended before its first checkpoint"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed = finish(killed)
    assert resumed["resumed_from_step"] >= 20 and resumed["steps"] == whole["steps"]
    log = [json.loads(x) for x in (killed / "train" / "train_log.jsonl").read_text().splitlines() if x.strip()]
    steps = [r["step"] for r in log if "step" in r]
    assert steps == sorted(set(steps))
    assert 0 < resumed["states"]["rows_extracted"] < whole["states"]["rows_extracted"]
    assert sha256_file(killed / "train" / "head.safetensors") == sha256_file(tmp_path / "whole" / "train" / "head.safetensors")
