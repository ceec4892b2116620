"""The runtime's HF path (any decoder family through its own forward and cache): greedy output with a draft equals
greedy output without one and HF generate's, on families the native runtime does not serve."""

from __future__ import annotations

import pytest
import torch

from trtspec.errors import DataError
from trtspec.runtime import DraftSpec, NgramDrafter, generate, load_target, speculative_decode
from trtspec.runtime.tree import Tree


@pytest.fixture(scope="module")
def tiny_family(tmp_path_factory, demo_model_dir):
    from trtspec.models import load_tokenizer
    from trtspec.targets.tiny import build_tiny

    tok, root = load_tokenizer(demo_model_dir), tmp_path_factory.mktemp("families")
    return lambda name: build_tiny(name, root / name, tok)


def repeating_prompt(seed: int) -> torch.Tensor:
    """A prompt that repeats itself, so that n-gram drafts are proposed and some accepted."""
    base = torch.randint(100, 3000, (6,), generator=torch.Generator().manual_seed(seed))
    return torch.cat((base, base, base[:3]))


class OracleDrafter:
    """Drafts the reference answer itself (every draft accepted), or, with `wrong_every`, a wrong last token every few
    steps: the perfect-draft case of transformers' assisted-generation tests, and partial acceptance."""

    def __init__(self, answer: list[int], wrong_every: int = 0):
        self.answer, self.wrong_every, self.steps = answer, wrong_every, 0

    def setup(self, max_len: int) -> None:
        pass

    def start(self, prompt, first, aux) -> None:
        self.done = 1  # answer tokens known to the loop so far

    def accepted(self, tokens, aux) -> None:
        self.done += len(tokens)

    def draft(self, root, spec, temperature=0.0, generator=None):
        guess = self.answer[self.done : self.done + spec.k] or [0]
        self.steps += 1
        if self.wrong_every and self.steps % self.wrong_every == 0:
            guess = [*guess[:-1], (guess[-1] + 1) % 1000]
        n = len(guess)
        return Tree([root, *guess], [-1, *range(n)], list(range(n + 1))), None


@pytest.mark.parametrize("name", ["qwen3_moe", "gemma3", "gpt_oss", "deepseek_v3", "granite"])
def test_hf_path_accepts_a_perfect_draft_and_recovers_from_wrong_ones(name, tiny_family, one_thread):
    from transformers import AutoModelForCausalLM

    folder = tiny_family(name)
    target, _ = load_target(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompt = repeating_prompt(7)
    with torch.inference_mode():
        ref = hf.generate(prompt[None], max_new_tokens=24, min_new_tokens=24, do_sample=False)[0, prompt.numel():].tolist()
    perfect = speculative_decode(target, OracleDrafter(ref), prompt, 24, DraftSpec(shape="chain", k=3))
    assert perfect.tokens == ref and perfect.stats.acceptance_length() > 3.5
    partial = speculative_decode(target, OracleDrafter(ref, wrong_every=2), prompt, 24, DraftSpec(shape="chain", k=3))
    assert partial.tokens == ref and 0 < sum(partial.stats.accepted) < 3 * partial.stats.steps


@pytest.mark.parametrize("name", ["qwen3_moe", "gemma3", "gpt_oss", "deepseek_v3", "granite"])
def test_hf_path_is_exact_with_and_without_an_ngram_draft(name, tiny_family, one_thread):
    from transformers import AutoModelForCausalLM

    folder = tiny_family(name)
    target, _ = load_target(folder)
    assert target.path == "hf"
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for seed in range(3):
        prompt = repeating_prompt(seed)
        with torch.inference_mode():
            ref = hf.generate(prompt[None], max_new_tokens=24, min_new_tokens=24, do_sample=False)[0, prompt.numel():].tolist()
        assert generate(target, prompt, 24).tokens == ref
        spec = speculative_decode(target, NgramDrafter(), prompt, 24, DraftSpec(shape="chain", k=3))
        assert spec.tokens == ref


def test_hf_path_refuses_trees(tiny_family):
    target, _ = load_target(tiny_family("qwen3_moe"))
    prompt = torch.arange(1, 9)
    target(prompt, torch.arange(8), torch.arange(8), 8, "causal", logits_from=7)
    tree = Tree([5, 6, 7], [-1, 0, 0], [0, 1, 1])  # two children of the root: not a chain
    mask = torch.cat((torch.ones(3, 8, dtype=torch.bool), tree.ancestor_mask()), dim=1)
    with pytest.raises(DataError, match="chains only"):
        target.step(torch.tensor(tree.tokens), 8 + torch.tensor(tree.depth), torch.arange(8, 11), 11, mask)


def test_trtllm_refuses_families_its_sources_do_not_serve(tiny_family):
    from trtspec.engines import trtllm

    assert "no EAGLE-3 draft for gemma3" in trtllm.refusal(tiny_family("gemma3"), "eagle3")
    assert trtllm.refusal(tiny_family("qwen3_moe"), "eagle3") is None
    assert "one-model only" in trtllm.refusal(tiny_family("mistral"), "dflash")
    assert trtllm.refusal(tiny_family("qwen3_moe"), "dflash") is None


def test_vllm_on_a_cpu_refuses_a_modelopt_quantized_target_with_or_without_a_draft(tiny_family, tmp_path, monkeypatch):
    """A bundle whose target Model Optimizer exported quantized (config.json's quantization_config) is skipped by the
    engine stage on a CPU, with or without a draft, where vLLM's CPU build would end the build in a ValidationError."""
    import json
    import shutil

    import torch

    from trtspec.engines import vllm

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    target = tmp_path / "fp8"
    shutil.copytree(tiny_family("llama3"), target)
    config = json.loads((target / "config.json").read_text())
    assert vllm.refusal(target, "eagle3") is None and vllm.modelopt_quantized(target) is None
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8"}
    (target / "config.json").write_text(json.dumps(config))
    for method in ("eagle3", None):
        assert vllm.refusal(target, method).startswith("vLLM's CPU build runs no Model Optimizer quantized checkpoint "
                                                       "(the bundle's target is FP8")
