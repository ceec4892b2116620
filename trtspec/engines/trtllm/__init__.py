"""A thin, lazy adapter over TensorRT-LLM's LLM API: availability, version differences, the kwargs of LLM(...).

Nothing here imports tensorrt_llm at module import time. The differences handled (read from
tensorrt_llm/llmapi/llm_args.py across releases; see tests/contracts/trtllm_api.json):
- `Eagle3DecodingConfig` (1.1+) vs only `EagleDecodingConfig` (older);
- the draft path field `speculative_model` (newer; `speculative_model_dir` kept as an alias) vs
  `speculative_model_dir` (older) — picked by inspecting the installed class's fields;
trtspec serves on the LLM API's PyTorch backend only: the TensorRT engine backend (`trtllm-build`,
`tensorrt_llm._tensorrt_engine`) was removed from TensorRT-LLM's main in 2026, and every decoding trtspec writes
(EAGLE-3, draft-target, n-gram) runs on the PyTorch backend.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from trtspec.engines.trtllm import support
from trtspec.measure import tokens_per_s

NAME, SHORT, PACKAGE = "TensorRT-LLM", "trtllm", "tensorrt_llm"  # as reports name it, its columns' suffix, its package
RUNS_BUNDLE = True
INSTALL_HINT = "pip install trtspec[trtllm] on a Linux x86_64/aarch64 machine with an NVIDIA GPU"
SPEC_CLASSES = {"Eagle3": ("Eagle3DecodingConfig", "EagleDecodingConfig"), "NGram": ("NGramDecodingConfig",),
                "DraftTarget": ("DraftTargetDecodingConfig",)}


def installed() -> bool:
    return importlib.util.find_spec("tensorrt_llm") is not None


def version() -> str | None:
    """The installed tensorrt_llm version without importing it when the package metadata has it."""
    if not installed():
        return None
    for name in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return str(getattr(importlib.import_module("tensorrt_llm"), "__version__", "unknown"))


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def availability() -> tuple[bool, str]:
    """(can the engine stage run here, why) — the one check shared by the stage and `trtspec doctor`."""
    trt, cuda = installed(), cuda_available()
    if trt and cuda:
        return True, f"tensorrt_llm {version()} and a CUDA GPU present"
    missing = [what for what, ok in (("tensorrt_llm is not installed (" + INSTALL_HINT + ")", trt), ("no CUDA GPU", cuda)) if not ok]
    return False, "; ".join(missing)


def refusal(target: Path, method: str | None) -> str | None:
    """Why TensorRT-LLM serves no `method` draft (eagle3, dflash, dspark) for the target folder's family, by what its
    sources say (engines/trtllm/support.py), or None."""
    from trtspec.targets import family_if_known

    family = family_if_known(target)
    return support.refusal_for(family.name, method) if family is not None and method else None


def build_refusal(model_config: Any, method: str | None) -> str | None:
    """None: TensorRT-LLM is the default engine and runs on a GPU server, not here; a family it serves no draft for
    still gets its bundle (for vLLM and SGLang), and the engine stage skips saying why (refusal)."""
    return None


def support_row(family: str) -> dict[str, Any]:
    return {"eagle3": support.eagle3(family), "dflash": family in support.DFLASH}


def own_process(target: Path) -> bool:
    return False  # its LLM spawns its own workers and leaves this process as it was


def spec_class(llmapi: Any, decoding_type: str) -> type:
    """The installed config class for a decoding_type (EAGLE-3 falls back to EagleDecodingConfig on old releases)."""
    for name in SPEC_CLASSES.get(decoding_type, (f"{decoding_type}DecodingConfig",)):
        cls = getattr(llmapi, name, None)
        if cls is not None:
            return cls
    from trtspec.errors import MissingDependency

    raise MissingDependency(f"tensorrt_llm {version()} cannot serve this bundle: tensorrt_llm.llmapi has no config class "
                            f"for decoding_type '{decoding_type}'", "install a TensorRT-LLM release that has it")


def fields_of(cls: type) -> set[str]:
    fields = getattr(cls, "model_fields", None)
    if fields is None:  # pydantic v1 style
        fields = getattr(cls, "__fields__", {})
    return set(fields)


def draft_field(cls: type) -> str:
    """`speculative_model` on releases that have it, else `speculative_model_dir`."""
    return "speculative_model" if "speculative_model" in fields_of(cls) else "speculative_model_dir"


def spec_kwargs(spec: dict, cls: type, base_dir: Path) -> dict:
    """The speculative_config section of llm_api_options.yaml as kwargs of the installed config class.

    decoding_type picks the class (it is not a constructor field on older releases); the draft path is
    renamed to the installed field name and made absolute against the bundle folder. Any other field is
    passed as is, so a field the installed release does not know fails loudly (extra='forbid')."""
    kwargs = {k: v for k, v in spec.items() if k != "decoding_type"}
    draft = kwargs.pop("speculative_model", None) or kwargs.pop("speculative_model_dir", None)
    if draft is not None:
        p = Path(draft)
        kwargs[draft_field(cls)] = str(p if p.is_absolute() else (base_dir / p).resolve())
    return kwargs


def llm_kwargs(options: dict, model_dir: Path, base_dir: Path, speculative: bool = True) -> dict:
    """kwargs of tensorrt_llm.LLM(...) from the LLM-API options (the bundle's llm_api_options.yaml)."""
    from tensorrt_llm import llmapi

    kwargs: dict[str, Any] = {"model": str(model_dir)}
    spec = options.get("speculative_config")
    if speculative and spec:
        cls = spec_class(llmapi, spec.get("decoding_type", "Eagle3"))
        kwargs["speculative_config"] = cls(**spec_kwargs(spec, cls, base_dir))
    if options.get("kv_cache_config"):
        kwargs["kv_cache_config"] = llmapi.KvCacheConfig(**options["kv_cache_config"])
    for key in ("tensor_parallel_size", "max_batch_size"):
        if key in options:
            kwargs[key] = options[key]
    return kwargs


def spec_metrics(output: Any) -> tuple[int, int] | None:
    """(accepted, drafted) draft tokens of one RequestOutput, when the release reports them.

    Where: outputs[0].request_perf_metrics.speculative_decoding.{total_accepted_draft_tokens,
    total_draft_tokens} (needs SamplingParams(return_perf_metrics=True); Triton's llmapi model.py reads
    the same fields)."""
    comp = output.outputs[0]
    perf = getattr(comp, "request_perf_metrics", None)
    spec = getattr(perf, "speculative_decoding", None) if perf is not None else None
    if spec is None:
        return None
    accepted, drafted = getattr(spec, "total_accepted_draft_tokens", None), getattr(spec, "total_draft_tokens", None)
    if accepted is None or drafted is None:
        return None
    return int(accepted), int(drafted)


def gpu_memory_used_gib() -> float | None:
    """Device-wide memory in use (TensorRT-LLM's workers are other processes, so not torch's own counters)."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return round((total - free) / 2**30, 2)


# --- the engine interface (trtspec.engines): describe, run_bundle, report_options ---------------


def describe(options: dict) -> str:
    spec = options["speculative_config"]
    return (f"tensorrt_llm {version()}: LLM(target, {spec['decoding_type']}, max_draft_len={spec['max_draft_len']}, "
            f"tp={options.get('tensor_parallel_size', 1)})")


def report_options(options: dict) -> dict:
    return {"llm_api_options": options}


def sampling_params(SamplingParams: type, max_tokens: int) -> Any:
    try:
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, return_perf_metrics=True)
    except TypeError:  # releases without per-request perf metrics
        return SamplingParams(max_tokens=max_tokens, temperature=0.0)


def acceptance(outputs: list[Any], draft_per_step: int) -> dict:
    """Acceptance from TensorRT-LLM's counters.

    Each decoding step drafts `draft_per_step` tokens; the target verifies them in one forward and emits the
    accepted ones plus one of its own. So steps = drafted / draft_per_step and
    acceptance length AL = tokens per step = (accepted + steps) / steps = 1 + accepted / steps."""
    counts = [c for c in (spec_metrics(o) for o in outputs) if c is not None]
    if not counts:
        return {"acceptance_length": None, "acceptance_note": "this TensorRT-LLM release reports no draft counters"}
    accepted, drafted = sum(c[0] for c in counts), sum(c[1] for c in counts)
    steps = drafted / draft_per_step
    return {
        "acceptance_length": round(1 + accepted / steps, 3) if steps else None,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "accepted_draft_tokens": accepted,
        "draft_tokens": drafted,
    }


def run_bundle(bundle: Path, options: dict, prompts: list[list[int]], max_new: int, batch_sizes: list[int]) -> dict:
    """The bundle with its draft, then without -> {"speculative": ..., "base": ...} (run_engine). One after the
    other, not in turn as in vLLM: each LLM reserves most of the GPU memory left for its KV cache."""
    return {"speculative": run_engine(bundle, options, prompts, max_new, batch_sizes, speculative=True),
            "base": run_engine(bundle, options, prompts, max_new, batch_sizes, speculative=False)}


def run_engine(bundle: Path, options: dict, prompts: list[list[int]], max_new: int, batch_sizes: list[int],
               speculative: bool = True) -> dict:
    """LLM(...) over bundle/target with the options' speculative_config (or none): greedy answers to every prompt
    (one batch), acceptance from the engine's counters, tokens/s at each batch size, load time, GPU memory."""
    from tensorrt_llm import LLM, SamplingParams

    params = sampling_params(SamplingParams, max_new)
    t0 = time.perf_counter()
    llm = LLM(**llm_kwargs(options, bundle / "target", bundle, speculative=speculative))
    load_s = time.perf_counter() - t0

    def answer(batch: list[list[int]]) -> list[Any]:
        return list(llm.generate(batch, params))

    answer(prompts[:1])  # warm-up (CUDA graphs, autotuning)
    gpu_gib = gpu_memory_used_gib()
    spec = options["speculative_config"]
    # acceptance counts steps as drafted / max_draft_len: with a draft length per batch size, only prompts answered
    # one at a time draft max_draft_len every step
    outputs = [o for p in prompts for o in answer([p])] if spec.get("draft_len_schedule") else answer(prompts)
    acc = acceptance(outputs, spec.get("max_total_draft_tokens") or spec["max_draft_len"]) if speculative else {}
    tps = {bs: tokens_per_s(lambda b: [list(o.outputs[0].token_ids) for o in answer(b)], prompts, bs) for bs in batch_sizes}
    llm.shutdown()
    return {"outputs": [list(o.outputs[0].token_ids) for o in outputs], "acceptance": acc, "tokens_per_s": tps,
            "load_s": round(load_s, 2), "gpu_memory_gib": gpu_gib}
