"""TEST DOUBLE of tensorrt_llm.LLM / SamplingParams / RequestOutput (shapes as the real llmapi documents them).

Tokens: Hugging Face greedy generate of the target folder on the CPU. Draft counters: synthetic (every
decoding step accepts max_draft_len // 2 tokens) — only there so the stage's arithmetic has input.
"""

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tensorrt_llm.llmapi.llm_args import DecodingBaseConfig, KvCacheConfig

CALLS: list[dict] = []  # every LLM(...) kwargs, for tests
_MODELS: dict[str, Any] = {}


@dataclass
class SamplingParams:
    max_tokens: int = 32
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    end_id: int | None = None
    return_perf_metrics: bool = False


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list = field(default_factory=list)
    finish_reason: str | None = None
    request_perf_metrics: Any = None


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list
    outputs: list
    finished: bool = True


@dataclass
class BuildConfig:
    max_batch_size: int = 2048
    max_draft_len: int = 0
    speculative_decoding_mode: Any = None


def _hf(path: str):
    if path not in _MODELS:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        _MODELS[path] = (AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path))
    return _MODELS[path]


# modeling_dspark.py _DSPARK_HEAD_WEIGHT_ALIASES: the names GQADSparkForCausalLM takes the Markov head from, in order
DSPARK_HEAD_ALIASES = {"markov_w1.weight": ("markov_head.markov_w1.weight", "markov_w1.weight"),
                       "markov_w2.weight": ("markov_head.markov_w2.weight", "markov_w2.weight")}


def _head_setting(cfg: dict, key: str):
    """modeling_dflash.py resolve_dspark_head_config: dspark_config, dflash_config, top-level dspark_<key>, <key>."""
    for value in ((cfg.get("dspark_config") or {}).get(key), (cfg.get("dflash_config") or {}).get(key),
                  cfg.get(f"dspark_{key}"), cfg.get(key)):
        if value is not None:
            return value
    return None


def _check_block_draft(spec, draft: Path) -> None:
    """What the real LLM(...) checks of a DFlash or DSpark draft before it runs: decoding_type DFlash refuses a draft
    declaring DSpark heads; DSpark resolves its fields from the draft's config.json (TorchLlmArgs), and its standalone
    drafter (GQADSparkForCausalLM) takes a vanilla Markov head and non-causal blocks only, its weights [vocab, rank]."""
    from safetensors import safe_open

    cfg = json.loads((draft / "config.json").read_text())
    declares = (_head_setting(cfg, "projector_type") == "dspark" or bool(_head_setting(cfg, "shift_label"))
                or bool(_head_setting(cfg, "use_confidence_head")) or int(_head_setting(cfg, "markov_rank") or 0) > 0)
    if spec.decoding_type == "DFlash":
        if declares:
            raise ValueError("This drafter checkpoint declares the DSpark head set, which decoding_type 'DFlash' does "
                             "not implement. Set speculative_config.decoding_type to 'DSpark' to run it.")
        return
    spec.resolve_from_draft(cfg)
    head = str(_head_setting(cfg, "markov_head_type") or "vanilla").lower()
    if (spec.markov_rank or 0) > 0 and head != "vanilla":
        raise ValueError(f"DSpark drafter declares markov_head_type='{head}'; only 'vanilla' is supported")
    if _head_setting(cfg, "causal"):
        raise ValueError("DSpark drafter sets causal=true; the block decode only supports the non-causal convention")
    with safe_open(str(draft / "model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    for canonical, aliases in DSPARK_HEAD_ALIASES.items():
        name = next((a for a in aliases if a in shapes), None)
        if (spec.markov_rank or 0) > 0 and name is None:
            raise ValueError(f"DSpark drafter declares markov_rank={spec.markov_rank} but the checkpoint is missing {canonical}.")
        if name is not None and shapes[name] != (cfg["vocab_size"], spec.markov_rank):
            raise ValueError(f"DSpark {canonical} has shape {shapes[name]}, expected [vocab, markov_rank]")


class LLM:
    def __init__(self, model: str, speculative_config=None, kv_cache_config=None, tensor_parallel_size: int = 1,
                 max_batch_size: int | None = None, backend: str | None = None, build_config=None, **extra):
        if extra:  # the real TorchLlmArgs is extra="forbid"
            raise TypeError(f"LLM() got unexpected arguments {sorted(extra)}")
        if backend not in (None, "pytorch"):
            raise ValueError("fake LLM: only the PyTorch backend (the TensorRT engine backend was removed from main)")
        if speculative_config is not None and not isinstance(speculative_config, DecodingBaseConfig):
            raise TypeError("speculative_config must be a DecodingBaseConfig")
        if kv_cache_config is not None and not isinstance(kv_cache_config, KvCacheConfig):
            raise TypeError("kv_cache_config must be a KvCacheConfig")
        if not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
            raise ValueError("tensor_parallel_size must be a positive int")
        if not (Path(model) / "config.json").is_file():
            raise ValueError(f"fake LLM: no HF checkpoint at {model}")
        draft = getattr(speculative_config, "draft_dir", None) or getattr(speculative_config, "speculative_model", None)
        if draft is not None and not (Path(draft) / "config.json").is_file():
            raise ValueError(f"fake LLM: no draft checkpoint at {draft}")
        if hasattr(speculative_config, "eagle3_one_model"):
            arch = json.loads((Path(draft) / "config.json").read_text()).get("architectures", [])
            if "LlamaForCausalLMEagle3" not in arch:
                raise ValueError(f"fake LLM: {draft} is not an EAGLE-3 checkpoint (architectures {arch})")
        if getattr(speculative_config, "decoding_type", None) in ("DFlash", "DSpark"):
            _check_block_draft(speculative_config, Path(draft))
        CALLS.append({"model": model, "speculative_config": speculative_config, "kv_cache_config": kv_cache_config,
                      "tensor_parallel_size": tensor_parallel_size, "max_batch_size": max_batch_size})
        self.model, self.spec = str(model), speculative_config
        self.build_config = build_config

    def _one(self, i: int, prompt, sp: SamplingParams) -> RequestOutput:
        import torch

        model, tok = _hf(self.model)
        ids = tok(prompt)["input_ids"] if isinstance(prompt, str) else list(prompt)
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=sp.max_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
        new = out[0, len(ids):].tolist()
        eos = model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        cut = next((j + 1 for j, t in enumerate(new) if t in eos), None)
        new = new[:cut] if cut else new
        perf = None
        if sp.return_perf_metrics and self.spec is not None:
            k = self.spec.max_draft_len
            per_step = self.spec.max_total_draft_tokens or k
            steps = math.ceil(max(len(new) - 1, 0) / (k // 2 + 1))
            accepted = max(len(new) - 1 - steps, 0)
            spec = SimpleNamespace(acceptance_rate=accepted / max(steps * per_step, 1),
                                   total_accepted_draft_tokens=accepted, total_draft_tokens=steps * per_step)
            perf = SimpleNamespace(speculative_decoding=spec, kv_cache_metrics=None, timing_metrics=None)
        text = tok.decode(new, skip_special_tokens=True)
        comp = CompletionOutput(0, text, new, "stop" if cut else "length", perf)
        return RequestOutput(i, ids, [comp])

    def generate(self, inputs, sampling_params: SamplingParams | None = None):
        sp = sampling_params or SamplingParams()
        single = isinstance(inputs, str) or (isinstance(inputs, list) and inputs and isinstance(inputs[0], int))
        batch = [inputs] if single else list(inputs)
        outs = [self._one(i, p, sp) for i, p in enumerate(batch)]
        return outs[0] if single else outs

    def shutdown(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
