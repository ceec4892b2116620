"""HF generation as the reference every method is held to, and greedy agreement with it. One implementation of each,
shared by the stages, the engines and the scripts (the timing around them: trtspec.measure)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trtspec.measure import tokens_per_s


def eos_ids(folder: Path, tok: Any) -> set[int]:
    """The ids that end an answer: the tokenizer's eos and those of the model folder's generation_config.json."""
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    gen = folder / "generation_config.json"
    if gen.is_file():
        e = json.loads(gen.read_text()).get("eos_token_id")
        ids |= set(e if isinstance(e, list) else [e] if e is not None else [])
    return ids


def cut_after_eos(ids: list[int], eos: Iterable[int]) -> list[int]:
    """`ids` up to and including the first eos (generate pads a finished row of a batch after it)."""
    eos = set(eos)
    return ids[: next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))]


def hf_greedy(model: Any, prompts: list[list[int]], max_new: int, eos: Iterable[int], pad_id: int | None = None,
              temperature: float = 0.0, **generate_kw: Any) -> list[list[int]]:
    """HF `generate` on token-id prompts in one left-padded batch -> each answer's ids, its first eos included.
    Greedy at temperature 0 (sampled above it). `generate_kw` goes to generate (e.g. prompt_lookup_num_tokens)."""
    import torch

    eos = sorted(set(eos))
    if pad_id is None:  # what fills the left of shorter prompts (masked out) and the rows that finished early
        pad_id = model.generation_config.pad_token_id or (eos[0] if eos else 0)
    width = max(map(len, prompts))
    dev = next(model.parameters()).device
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=dev)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=dev)
    sample = temperature > 0
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=sample,
                             temperature=temperature if sample else None, top_p=None, top_k=None,
                             eos_token_id=eos, pad_token_id=pad_id, **generate_kw)
    return [cut_after_eos(row, eos) for row in out[:, width:].tolist()]


def hf_answer(model: Any, prompt: list[int], max_new: int, eos: Iterable[int], **generate_kw: Any) -> list[int]:
    """HF generate's answer to one prompt, alone (no padding; as timed: one request at a time)."""
    return hf_greedy(model, [prompt], max_new, eos, **generate_kw)[0]


def hf_reference(source: Path, prompts: list[list[int]], max_new: int, batch_sizes: list[int], dtype: str) -> dict:
    """HF generate on the original model: greedy outputs (one prompt at a time) and tokens/s at each batch size."""
    import torch

    from trtspec.models import load_model, load_tokenizer

    model, tok = load_model(source, dtype), load_tokenizer(source)
    eos = model.generation_config.eos_token_id

    def generate(batch: list[list[int]]) -> list[list[int]]:
        return hf_greedy(model, batch, max_new, eos if isinstance(eos, list) else [eos], tok.pad_token_id)

    with torch.inference_mode():
        outputs = [generate([p])[0] for p in prompts]
        speed = {bs: tokens_per_s(generate, prompts, bs) for bs in batch_sizes}
    return {"outputs": outputs, "tokens_per_s": speed}


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (None when identical)."""
    return None if a == b else common_prefix(a, b)


def compare(got: list[list[int]], want: list[list[int]]) -> dict:
    """Greedy agreement: exact sequences, and the mean length of the common prefix relative to the reference."""
    exact = sum(g == w for g, w in zip(got, want, strict=True))
    prefix = [common_prefix(g, w) / max(len(w), 1) for g, w in zip(got, want, strict=True)]
    return {"exact": exact, "total": len(want), "exact_fraction": round(exact / max(len(want), 1), 4),
            "mean_common_prefix": round(sum(prefix) / max(len(prefix), 1), 4)}
