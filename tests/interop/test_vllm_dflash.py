"""vLLM's CPU build serves the DFlash bundle trtspec exports (speculative method dflash): greedy outputs equal the
target's alone and trtspec's runtime's, and vLLM's own acceptance counters equal the runtime's within 2%."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_harness import build_on_ci_data, eos_of, vllm_run

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh --engines vllm)")

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "build_configs" / "smollm2-135m-dflash-ci.yaml"
# trained long enough to learn its 18 training answers by heart: on those prompts acceptance is high and sensitive;
# acceptance measured at the end only (the recipe's eval_steps 4 is for notebook 02's curve): the same head
OVERRIDES = ["train.epochs=24", "draft.length=7", "train.eval_steps=0"]
K, MAX_NEW = 7, 48


@pytest.fixture(scope="module")
def dflash_run(ci_run, tmp_path_factory) -> Path:
    """The DFlash CI recipe up to the bundle, on the EAGLE-3 interop run's data stage (the same answers)."""
    return build_on_ci_data(ci_run, tmp_path_factory.mktemp("dflash") / "run", CONFIG, OVERRIDES)


@pytest.fixture(scope="module")
def prompts(dflash_run) -> list[list[int]]:
    from trtspec.chat import encode_prompt
    from trtspec.models import load_tokenizer

    tok = load_tokenizer(dflash_run / "bundle" / "target")
    rows = [json.loads(line) for line in (dflash_run / "data" / "train.jsonl").read_text().splitlines() if line.strip()]
    return [encode_prompt(tok, r["messages"][:-1]) for r in rows[:6]]


def runtime_run(dflash_run: Path, prompts: list[list[int]], k: int):
    """trtspec's runtime with the DFlash draft, chains of k guesses: (outputs, Stats)."""
    from trtspec.draft_families import load_drafter
    from trtspec.runtime import DraftSpec, load_transformer, speculative_on_prompts

    bundle = dflash_run / "bundle"
    target, _ = load_transformer(bundle / "target")
    drafter = load_drafter(bundle / "draft", target)
    return speculative_on_prompts(target, drafter, prompts, MAX_NEW, DraftSpec(k=k), eos_of(bundle))


@pytest.fixture(scope="module")
def runtime(dflash_run, prompts):
    return runtime_run(dflash_run, prompts, K)


def test_the_bundle_names_dflash_for_every_engine(dflash_run):
    import yaml

    bundle = dflash_run / "bundle"
    cfg = json.loads((bundle / "draft" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 8
    assert set(cfg["dflash_config"]) >= {"mask_token_id", "target_layer_ids", "causal"}
    spec = yaml.safe_load((bundle / "llm_api_options.yaml").read_text())["speculative_config"]
    assert spec == {"decoding_type": "DFlash", "max_draft_len": K, "speculative_model": "./draft"}
    assert '"method": "dflash"' in (bundle / "snippets" / "vllm.sh").read_text()
    assert "--speculative-algorithm DFLASH" in (bundle / "snippets" / "sglang.sh").read_text()


def test_vllm_serves_the_dflash_draft_like_the_runtime(dflash_run, prompts, runtime):
    bundle = dflash_run / "bundle"
    outputs, acc = vllm_run(bundle, bundle / "draft", prompts, K, MAX_NEW)
    alone, _ = vllm_run(bundle, None, prompts, K, MAX_NEW)
    assert outputs == alone == runtime[0]
    stats = runtime[1]
    assert stats.acceptance_length() > 1.5  # a draft that drafts: a wrong layer or mask token could not hide
    assert acc["acceptance_length"] == pytest.approx(stats.acceptance_length(), rel=0.02)
    assert acc["per_position"] == pytest.approx(stats.per_position(K), abs=0.02)


def test_a_chain_shorter_than_the_block_accepts_in_vllm_as_in_the_runtime(dflash_run, prompts):
    """k = 3 guesses from a draft trained on blocks of 8: vLLM drafts them from a block of k + 1 rows, and so does the
    runtime (dflash/runtime.py); with the whole block of 8 the runtime's guesses, and so its acceptance, would differ."""
    bundle = dflash_run / "bundle"
    outputs, acc = vllm_run(bundle, bundle / "draft", prompts, 3, MAX_NEW)
    ours, stats = runtime_run(dflash_run, prompts, 3)
    assert outputs == ours
    assert stats.acceptance_length() > 1.5
    assert acc["acceptance_length"] == pytest.approx(stats.acceptance_length(), rel=0.02)
    assert acc["per_position"] == pytest.approx(stats.per_position(3), abs=0.02)
