"""Fixtures the runtime's unit tests share (test_runtime, test_dflash): the tiny target and two chat prompts."""

from __future__ import annotations

from pathlib import Path

import pytest
from stagekit import rerandomized


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory, tiny_model_dir) -> Path:
    """The tiny model re-drawn at unit gain: its greedy text wanders, so equality checks mean something."""
    return rerandomized(tiny_model_dir, tmp_path_factory.mktemp("target") / "model", seed=0)


@pytest.fixture(scope="module")
def prompts(tiny_model_dir):
    import torch

    from trtspec.models import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    texts = ["Name three colors.", "Write a Python function that adds two numbers."]
    return [torch.tensor(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                                 return_dict=False)) for t in texts]
