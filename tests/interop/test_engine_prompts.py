"""scripts/check_engine_prompts.py against a real vLLM server: the prompts trtspec asks for an agent's requests are
the ids vLLM's /tokenize renders from the same requests (a tiny family's bundle served with the tool template), and a
request vLLM refuses is reported as a difference."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from stagekit import load_script

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh --engines vllm)")

ROOT = Path(__file__).resolve().parents[2]


def test_an_agents_prompts_are_the_ones_vllm_renders(tmp_path, finished_runs):
    run = tmp_path / "run"
    if done := finished_runs.get(("tiny-families", "qwen3_moe", "eagle3")):
        shutil.copytree(done, run)  # the family matrix built this recipe: found finished
    built = subprocess.run([sys.executable, "-m", "trtspec.cli", "build", str(ROOT / "build_configs" / "tiny-families.yaml"),
                            "--out", str(run), "--until", "export"], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    make = load_script("make_agent_requests")
    rng = random.Random(0)
    requests = [make.agent_request(rng, i, "agent") for i in range(6)]
    bare = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": [requests[0]["tools"][0]["function"]]}
    prompts = tmp_path / "requests.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in [*requests, bare]))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_engine_prompts.py"), str(run / "bundle"),
                           "--prompts", str(prompts), "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]  # the bare function spec: vLLM refuses it, trtspec reads it
    result = json.loads(proc.stdout)
    assert result["requests"] == 7 and result["identical"] == 6 and list(result["differ"]) == ["6"]
    assert result["differ"]["6"]["vllm"].startswith("refused: ")
