"""What a build will take of this machine, estimated before it runs (`trtspec build --check`): per stage, the memory
it holds at its peak and the disk it leaves, against what is free; the training rows its data sources hold.

Exact where the inputs say it (a checkpoint's size, a file's lines, the states' layout), None where they cannot
(a dataset on the hub). The memory figures count what dominates at scale (weights, the draft's training state, vLLM's
engines and KV cache), not activations or the libraries' own few GiB: a floor, flagged when even it is more than is
free."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trtspec.config import BuildConfig

GIB = 2**30
# fewer training conversations than this and a draft learns its answers, not the target: the CI recipe's 18 make a
# draft that accepts about nothing held out (AL@3 1.06), the demo's 2134 one of AL@3 1.86
FEW_ROWS = 256
# a process's own memory before any model: torch, transformers and a stage's libraries (the demo's data stage peaks
# at 1.87 GiB holding 0.3 GiB of weights)
LIBRARIES_GIB = 1.5


def estimate(cfg: BuildConfig, run_dir: Path, stages: list[str] | None = None) -> dict[str, Any]:
    """{target_weights_gib, free_memory_gib, training_rows, states_gib, free_disk_gib, trainer_loads, stages: [{stage,
    memory_gib, memory_holds, disk_gib, disk_holds}] for `stages` (default: every stage)}."""
    from transformers import AutoConfig

    from trtspec.config import STAGES
    from trtspec.models import resolve_model
    from trtspec.runtime.kernels import available_memory_mb
    from trtspec.targets import text_config

    target = Path(resolve_model(cfg.model.source))
    weights = sum(p.stat().st_size for p in target.glob("*.safetensors")) / GIB
    text = text_config(AutoConfig.from_pretrained(target))
    rows = training_rows(cfg)
    states = None
    if rows is not None and cfg.train.mode == "offline":
        aux = len(cfg.convert.aux_layers or [0, 0, 0])  # EAGLE-3's and DFlash's default: three target layers
        per_value = 1 if cfg.train.states_storage == "fp8" else 2
        states = per_value * rows * cfg.data.seq_len * text.hidden_size * (aux + 1) / GIB  # every row padded to seq_len
    free_mb = available_memory_mb()
    probe = next(p for p in (Path(run_dir).resolve(), *Path(run_dir).resolve().parents) if p.is_dir())
    est = {
        "target_weights_gib": round(weights, 2),
        "trainer_loads": "embeddings, final norm and output head" if cfg.train.states_from != "hf" else "the whole target",
        "free_memory_gib": round(free_mb / 1024, 1) if free_mb is not None else None,
        "training_rows": rows,
        "states_gib": round(states, 2) if states is not None else None,
        "free_disk_gib": round(shutil.disk_usage(probe).free / GIB, 1),
    }
    sizes = Sizes(cfg, target, text, weights, states)
    est["stages"] = [sizes.stage(s) for s in (stages if stages is not None else STAGES)]
    return est


def width(dtype: str, build: bool = False) -> int:
    """Bytes per value of a model.dtype / model.build_dtype on this machine ("auto" as the stages resolve it)."""
    import torch

    from trtspec.models import cpu_has_native_bf16

    if dtype == "auto":
        return 2 if torch.cuda.is_available() or (build and cpu_has_native_bf16()) else 4
    return 4 if dtype == "float32" else 2


class Sizes:
    """Each stage's memory at its peak and the disk it leaves, in GiB, from the target's checkpoint and config."""

    def __init__(self, cfg: BuildConfig, target: Path, text: Any, weights_gib: float, states_gib: float | None):
        self.cfg, self.target, self.text, self.states = cfg, target, text, states_gib
        stored = width(str(getattr(text, "dtype", None) or "bfloat16").replace("torch.", ""))
        self.params = weights_gib * GIB / stored  # the target's parameters, from its checkpoint's bytes
        from trtspec.draft_families import family
        from trtspec.targets import global_attr

        h, i = text.hidden_size, global_attr(text, "intermediate_size") or 4 * text.hidden_size

        # the draft's layers, in the first section its family reads (EAGLE-3: convert; DFlash and DFlash2: dflash)
        layers = getattr(getattr(cfg, family(cfg.draft.method).sections[0]), "num_layers", 1)
        vocab = cfg.convert.draft_vocab_size or text.vocab_size
        # a draft layer (attention reading 2h, MLP) per layer, EAGLE-3's fc over three target layers, its head
        self.draft_params = layers * (6 * h * h + 3 * h * i) + 3 * h * h + vocab * h
        self.head_params = 2 * text.vocab_size * h  # the target's embeddings and output head the trainer keeps

    def target_gib(self, dtype: str, build: bool = False) -> float:
        return self.params * width(dtype, build) / GIB

    def vllm_gib(self, engines: int, sequences: int) -> float:
        """`engines` vLLM engines of the target, each with the KV cache of `sequences` sequences of data.seq_len."""
        from trtspec.engines import vllm as vllm_engine

        kv = vllm_engine.kv_cache_gib_for(self.target, sequences * self.cfg.data.seq_len)
        return vllm_engine.engines_memory_gib(self.target, engines, kv)

    def stage(self, stage: str) -> dict[str, Any]:
        memory, memory_holds, disk, disk_holds = getattr(self, stage)()
        if memory is not None:
            memory += LIBRARIES_GIB
        return {"stage": stage, "memory_gib": None if memory is None else round(memory, 1), "memory_holds": memory_holds,
                "disk_gib": None if disk is None else round(disk, 2), "disk_holds": disk_holds}

    def data(self) -> tuple:
        c, rows = self.cfg, training_rows(self.cfg)
        disk = None if rows is None else rows * c.data.seq_len * 8 / GIB  # token ids and text of each conversation
        if not any(s.kind == "regenerate" or s.regenerate for s in c.data.sources) or c.data.answer_with == "endpoint":
            return 0.0, "the tokenizer", disk, "the conversations"
        if c.data.answer_with == "vllm":  # the engine answer_vllm loads: VLLM_WINDOW requests in flight
            from trtspec.answering import VLLM_WINDOW
            from trtspec.engines import vllm as vllm_engine

            kv = vllm_engine.kv_cache_gib_needed(self.target, None, min(VLLM_WINDOW, rows or VLLM_WINDOW), c.data.seq_len)
            return vllm_engine.engines_memory_gib(self.target, 1, kv), "a vLLM engine of the target", disk, "the conversations"
        return self.target_gib(c.model.build_dtype, True), "the target answering", disk, "the conversations"

    def convert(self) -> tuple:
        return self.target_gib(self.cfg.model.build_dtype, True), "the target", self.draft_params * 4 / GIB, "the draft"

    def train(self) -> tuple:
        c = self.cfg
        vocab = c.convert.draft_vocab_size or self.text.vocab_size
        tokens = c.train.batch_size * c.data.seq_len
        # fp32 weights, gradients and Adam's two moments; the target's logits (no gradient) and the draft's at each
        # step of its length, with their gradients
        learning = (self.draft_params * 16 + tokens * 4 * (self.text.vocab_size + 2 * c.draft.length * vocab)) / GIB
        if c.train.states_from == "hf":
            memory, holds = self.target_gib(c.model.build_dtype, True) + learning, "the target and the draft learning"
        else:
            memory = self.vllm_gib(1, c.train.batch_size) + self.head_params * 4 / GIB + learning
            holds = "a vLLM engine, the target's embeddings and head, the draft learning"
        disk, disk_holds = self.draft_params * 4 / GIB, "the draft"
        if c.train.mode == "offline" and self.states is not None:
            disk, disk_holds = disk + self.states, "the draft and the offline states"
        return memory, holds, disk, disk_holds

    def quantize(self) -> tuple:
        if self.cfg.quantize.format == "none":
            return 0.0, "nothing (quantize.format: none)", 0.0, "nothing"
        one = self.target_gib(self.cfg.model.dtype)
        return 2 * one, "the target twice: quantized, and reloaded to check the restore", one, "the quantized state"

    def export(self) -> tuple:
        per = {"none": width(self.cfg.model.dtype), "fp8": 1, "int8_sq": 1, "int4_awq": 0.5, "nvfp4": 0.5}
        target = self.params * per.get(self.cfg.quantize.format, 2) / GIB
        return (self.target_gib(self.cfg.model.dtype), "the target", target + self.draft_params * width(self.cfg.model.dtype)
                / GIB, "the bundle (target and draft)")

    def engine(self) -> tuple:
        e = self.cfg.engine
        if e.backend == "trtllm":
            return None, "TensorRT-LLM's engine on the GPU", None, "the engine"
        if e.sweep:
            from trtspec.engines import vllm as vllm_engine
            from trtspec.engines.vllm.sweep import engine_sizes

            _, kv, _ = engine_sizes(self.cfg)
            return (vllm_engine.engines_memory_gib(self.target, 2, kv), "two vLLM engines at once (the sweep groups the "
                    "rest)", 0.0, "its report")
        return self.vllm_gib(2, max(e.batch_sizes)), "two vLLM engines (with and without the draft)", 0.0, "its report"

    def validate(self) -> tuple:
        one = self.target_gib(self.cfg.model.dtype)
        both = 2 if self.cfg.validate_.compare_hf else 1
        return both * one + self.draft_params * width(self.cfg.model.dtype) / GIB, (
            "the target in the runtime and in HF, the draft" if both == 2 else "the target and the draft"), 0.0, "its report"


def training_rows(cfg: BuildConfig) -> int | None:
    """The training rows the data sources give at most: each local file's rows (lines), cut at its limit, less the
    held-out share; None when a source's size is not known before it is read (a dataset on the hub, a run)."""
    total = 0
    for s in cfg.data.sources:
        path = cfg.resolve_path(s.path)
        if s.kind in ("hf", "run") or not path.is_file():
            if s.limit is None:
                return None
            total += s.limit
            continue
        with path.open("rb") as f:
            lines = sum(1 for line in f if line.strip())
        total += min(lines, s.limit or lines)
    return int(total * (1 - cfg.data.holdout_fraction))


def lines(est: dict[str, Any]) -> list[str]:
    """`--check`'s words for an estimate."""
    def gib(v: float | None) -> str:
        return "unknown" if v is None else f"{v} GiB"

    def over(need: float | None, free: float | None) -> str:
        return " (MORE than is free)" if need is not None and free is not None and need > free else ""

    out = [f"memory: the target's weights {gib(est['target_weights_gib'])}"
           f"{over(est['target_weights_gib'], est['free_memory_gib'])} (the trainer loads {est['trainer_loads']}); "
           f"{gib(est['free_memory_gib'])} free now"]
    disk_total = 0.0
    if est.get("stages"):
        out.append(f"per stage, on this machine (a floor: weights, the draft's training, vLLM's engines and KV cache, "
                   f"{LIBRARIES_GIB} GiB of libraries; not the activations of answering or measuring):")
    for s in est.get("stages", []):
        disk_total += s["disk_gib"] or 0.0
        out.append(f"  {s['stage']:<9} memory {gib(s['memory_gib'])} ({s['memory_holds']})"
                   f"{over(s['memory_gib'], est['free_memory_gib'])}; disk {gib(s['disk_gib'])} ({s['disk_holds']}), "
                   f"{round(disk_total, 2)} GiB in all{over(disk_total, est['free_disk_gib'])}")
    rows = "unknown before the data stage reads its sources" if est["training_rows"] is None else f"at most {est['training_rows']}"
    disk = (f"offline states at most {gib(est['states_gib'])}{over(est['states_gib'], est['free_disk_gib'])}; "
            if est["states_gib"] is not None else "")
    out.append(f"data: training rows {rows}{few(est['training_rows']) or ''}; disk: {disk}{gib(est['free_disk_gib'])} "
               "free where the run is written")
    return out


def few(rows: int | None) -> str | None:
    """Why `rows` training conversations are too few to expect a useful draft, or None."""
    if rows is None or rows >= FEW_ROWS:
        return None
    return (f" (FEW: a draft trained on fewer than {FEW_ROWS} conversations learns its answers, not the target; "
            "expect little acceptance on other prompts)")


def few_rows_warning(cfg: BuildConfig) -> str | None:
    """The line a build prints before its data stage when its sources hold few training rows (a warning, not a
    refusal: a smoke test of the path is a use too)."""
    rows = training_rows(cfg)
    return f"warning: the data sources give at most {rows} training rows{few(rows)}" if few(rows) else None
