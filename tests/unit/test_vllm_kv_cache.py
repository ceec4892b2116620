"""The KV cache a vLLM engine takes on a CPU when its caller names none: what its sequences hold, not a fixed 4 GiB
(the engine stage's two engines of a few short prompts each held 4 GiB of RAM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtspec.engines import vllm as vllm_engine


def folder(path: Path, **config) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture
def target(tmp_path) -> Path:
    # 30 layers of 3 KV heads of 64 in float32: 46,080 bytes of keys and values a token, 47,616 with one draft layer
    return folder(tmp_path / "target", num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                  hidden_size=576, head_dim=64, dtype="float32")


def test_a_few_short_sequences_take_the_floor(target, tmp_path):
    draft = folder(tmp_path / "draft", num_hidden_layers=1)
    assert vllm_engine.kv_cache_gib_needed(target, draft, 4, 128) == 0.5


def test_many_long_sequences_take_what_they_hold_up_to_the_cap(target, tmp_path):
    target_only, with_one_draft_layer = 2 * 30 * 3 * 64 * 4, 2 * 31 * 3 * 64 * 4
    assert vllm_engine.kv_cache_gib_needed(target, None, 16, 2048) == round(1.5 * target_only * 16 * 2048 / 2**30, 2)
    assert 1.5 * with_one_draft_layer * 256 * 2048 / 2**30 > vllm_engine.KV_CACHE_GIB_AT_MOST
    assert vllm_engine.kv_cache_gib_needed(target, tmp_path / "draft-without-config", 256, 2048) == vllm_engine.KV_CACHE_GIB_AT_MOST


def test_the_drafts_layers_count(target, tmp_path):
    assert vllm_engine.layers_of_draft(None) == 0
    assert vllm_engine.layers_of_draft(folder(tmp_path / "dflash", num_hidden_layers=5)) == 5
    assert vllm_engine.layers_of_draft(tmp_path / "nowhere") == 1
    one, five = (vllm_engine.kv_cache_gib_needed(target, tmp_path / d, 16, 2048) for d in ("nowhere", "dflash"))
    assert five > one
