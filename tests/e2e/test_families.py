"""The architecture matrix in CI: every decoder family, with an EAGLE-3 head and with a DFlash block drafter, of trtspec.targets.tiny (a tiny random model built in code
with a real tokenizer and chat template) through convert -> train -> export -> engine (vLLM's CPU build, or its
declared refusal) -> validate, by `trtspec build` as a user runs it. Greedy output with the draft equals HF generate on
every prompt, in the runtime path the family declares and in vLLM where it serves the family."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trtspec.draft_families import family as draft_family
from trtspec.engines.vllm.support import refusal_for
from trtspec.targets import BY_MODEL_TYPE
from trtspec.targets.tiny import TINY, split_source

ROOT = Path(__file__).resolve().parents[2]
RECIPES = {"eagle3": ROOT / "build_configs" / "tiny-families.yaml", "dflash": ROOT / "build_configs" / "tiny-families-dflash.yaml",
           "dflash2": ROOT / "build_configs" / "tiny-families-dflash.yaml"}  # with draft.method dflash2


def has_vllm() -> bool:
    from importlib.util import find_spec

    return find_spec("vllm") is not None


# The default tier builds one row per runtime path and engine outcome (native and hf runtime paths, a mixture of
# experts, vLLM serving and vLLM refusing, every draft method); the full tier (TRTSPEC_TIER=full) every row.
DEFAULT_TIER = {("llama3", "eagle3"), ("qwen3_moe", "eagle3"), ("gpt_oss", "eagle3"), ("qwen3", "dflash"), ("gemma3", "dflash"),
                ("llama3", "dflash2")}
# Each family in its second shape too (tiny:FAMILY:deep: more layers, other head groups and layer-type patterns),
# EAGLE-3 and DFlash, in the full tier.
ROWS = [pytest.param(name, method, marks=() if (name, method) in DEFAULT_TIER else pytest.mark.full)
        for method in RECIPES for name in TINY] + [
        pytest.param(f"{name}:deep", method, marks=pytest.mark.full) for method in ("eagle3", "dflash") for name in TINY]


@pytest.mark.parametrize(("name", "method"), ROWS)
def test_family_end_to_end(name, method, tmp_path, demo_model_dir, finished_runs):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "trtspec.cli", "build", str(RECIPES[method]), "--out", str(run),
                           "--set", f"model.source=tiny:{name}", "--set", "engine.backend=auto", "--set", f"draft.method={method}"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    family = BY_MODEL_TYPE[TINY[split_source(name)[0]][0]]
    report = json.loads((run / "validate" / "report.json").read_text())
    assert report["target_family"] == family.name
    assert report["target_path"] == family.runtime
    match = report["greedy_match"]
    assert match["matched"] == match["total"] == 2
    engine = json.loads((run / "engine" / "manifest.json").read_text())
    refusal = refusal_for(family.name, method, on_gpu=False)
    if no_engine := draft_family(method).no_engine:  # a draft no engine serves here: the stage says why
        assert engine["status"] == "skipped" and engine["reason"] == no_engine, engine
    elif not has_vllm():
        assert engine["status"] == "skipped"
    elif refusal:  # vLLM cannot serve this family's draft: the manifest says why, in the family's own words
        assert engine["status"] == "skipped" and refusal in engine["reason"], engine
    else:
        assert engine["status"] == "done", engine
        m = engine["metrics"]["greedy_vs_hf"]
        assert m["exact"] == m["total"] == 2
        # the same draft on the same prompts: vLLM's counters and trtspec's runtime accept alike
        assert abs(engine["metrics"]["runtime_agreement"]["engine_over_runtime"] - 1) <= 0.02, engine["metrics"]
    finished_runs[("tiny-families", name, method)] = run  # notebook 01 builds tiny:qwen3_moe with EAGLE-3 too


def agent_requests() -> list[dict]:
    """Six of an agent's requests (scripts/make_agent_requests.py's, seeded): tools offered, half after a call and its
    output."""
    import random

    from stagekit import load_script

    make = load_script("make_agent_requests")
    rng = random.Random(0)
    return [make.agent_request(rng, i, "agent") for i in range(6)]


def test_adapt_continues_a_mixture_of_experts_draft(tmp_path, demo_model_dir, finished_runs):
    """`trtspec adapt` on a target that is no Llama (the tiny Qwen3-MoE, the matrix's run where it built one, served
    with a tool-calling template) and on an agent's requests beside chat: the draft starts from the run's, every
    category is measured before and after, the bundle names where it came from."""
    run = finished_runs.get(("tiny-families", "qwen3_moe", "eagle3"))
    if run is None:
        run = tmp_path / "run"
        built = subprocess.run([sys.executable, "-m", "trtspec.cli", "build", str(RECIPES["eagle3"]), "--out", str(run),
                                "--set", "model.source=tiny:qwen3_moe", "--until", "export"], capture_output=True, text=True, timeout=900)
        assert built.returncode == 0, built.stderr[-3000:]
    traffic = tmp_path / "requests.jsonl"
    chat = [{"messages": [{"role": "user", "content": p}]} for p in (
        "Name two animals that can fly.", "What is 15 plus 27?", "Write one sentence about the sea.",
        "List three things found in a kitchen.", "Name a planet with rings.", "What is 9 times 6?")]
    traffic.write_text("".join(json.dumps(r) + "\n" for r in chat + agent_requests()))
    new = tmp_path / "new"
    proc = subprocess.run([sys.executable, "-m", "trtspec.cli", "adapt", str(run), "--prompts", str(traffic), "--out", str(new),
                           "--category", "traffic", "--epochs", "1", "--tolerance", "1.0"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    read = lambda stage: json.loads((new / stage / "manifest.json").read_text())["metrics"]  # noqa: E731
    old_head = json.loads((run / "train" / "manifest.json").read_text())["files"]["head.safetensors"]["sha256"]
    assert read("convert")["init_from"]["head_sha256"] == old_head == read("bundle")["lineage"]["head_sha256"]
    train = read("train")
    assert {"traffic", "agent"} <= set(train["per_category"]) and set(train["before"]["per_category"]) == set(train["per_category"])
    assert all("tools" in json.loads(r) for r in (new / "data" / "train.jsonl").read_text().splitlines()
               if json.loads(r)["category"] == "agent")
    assert read("bundle")["aux_layers"] == json.loads((run / "bundle" / "manifest.json").read_text())["metrics"]["aux_layers"]
