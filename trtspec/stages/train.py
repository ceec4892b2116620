"""The train stage: fine-tune the draft with the base frozen (trtspec.training's HF Trainer, the family's loss:
modelopt's EAGLE-3 loss with train-time-test steps, DFlash's block loss), then measure acceptance on the held-out
split.

offline mode: the target's aux-layer hidden states (and its last, post-norm hidden state) are computed once into
ctx.work (fp16 memmaps) and every epoch reads them; the target's decoder layers are dropped from memory.
online mode: the target runs on every step (what multi-GPU users with large data sets want).

Writes train/head.safetensors, the family's config (train/eagle_config.json, train/dflash_config.json),
train/train_log.jsonl (per optimizer step: loss, per-TTT-step accuracy, lr) and acceptance metrics. Checkpoints
(head + optimizer) live in ctx.work; a killed run resumes from the last one.
"""

from __future__ import annotations

import gc
import json
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec import ranks
from trtspec.artifacts import peak_rss_gib
from trtspec.chat import prompt_rows, read_rows
from trtspec.draft_families import SECTIONS, family
from trtspec.errors import ArtifactError, ConfigError, DataError
from trtspec.pipeline.stage import StageContext
from trtspec.training import sharding
from trtspec.training.acceptance import (
    EVAL_BATCH,
    EVAL_SEQS,
    build_eval_set,
    context_acceptance,
    context_eval_sets,
    evaluate_acceptance,
    training_rows_set,
)
from trtspec.training.states import (
    CachedStates,
    HFStates,
    StreamedStates,
    cache_states,
    check_states_fit,
    window_rows,
)
from trtspec.training.trainer import HeadDataset, check_trainer_api, make_trainer, resume_point

if TYPE_CHECKING:
    from trtspec.config import BuildConfig, TrainSection
    from trtspec.draft_family import TrainableDraft

UPSTREAM = ("data", "convert")
READS = ("train", "model.train_on_quantized", "draft.method", "draft.length", "draft.max_category_drop", "draft.step_back", "validate.baseline_min_prompts", *SECTIONS, "eval.acceptance_prompts", "eval.acceptance_suite", "eval.context_bins",
         "eval.context_prompts", "eval.context_source", "eval.context_documents", "seed")
ALL_RANKS = True  # every process of a multi-process launch trains

CONTEXT_KEYS = ("eval.context_prompts", "eval.context_source", "eval.context_documents")  # used with eval.context_bins only


def preflight(cfg: BuildConfig, model_config: Any) -> None:
    """The installed transformers' Trainer as the head's trainer overrides it, eval.context_bins within the target's
    window, and eval.acceptance_suite's prompts rendered by the chat template, before the data stage spends minutes."""
    from collections import Counter

    from trtspec.chat import encode_prompts
    from trtspec.config import check_fits_window
    from trtspec.models import resolve_model, target_tokenizer
    from trtspec.suites import acceptance_suite_read
    from trtspec.targets import text_config

    check_trainer_api()
    if cfg.model.train_on_quantized and (cfg.train.states_from != "hf" or cfg.train.mode == "online"):
        raise ConfigError("model.train_on_quantized: the quantized target's states come from its HF forward before "
                          f"training (train.states_from: hf, mode offline or streamed), not train.states_from "
                          f"{cfg.train.states_from} in mode {cfg.train.mode}",
                          "set train.states_from: hf and train.mode: offline")
    if cfg.train.states_from != "hf":
        from trtspec.training.engine_states import check_engine_states

        check_engine_states(model_config, cfg.train.states_from)
    if cfg.train.mode == "streamed":  # with the fewest aux layers a draft reads (1): only budgets surely too small
        check_buffer_holds_a_batch(cfg.train, cfg.data.seq_len, text_config(model_config).hidden_size, 1)
    for b in sorted(cfg.eval.context_bins or []):
        check_fits_window(f"eval.context_bins {b}", b, "data.max_new_tokens", cfg.data.max_new_tokens,
                          text_config(model_config).max_position_embeddings)
    if suite := acceptance_suite_read(cfg):  # its prompts encoded as the stage will encode them
        tok = target_tokenizer(cfg, resolve_model(cfg.model.source))
        encode_prompts(tok, suite[0].read(suite[0].path, Counter()), f"eval.acceptance_suite file '{suite[0].path}'")


def unused(cfg: BuildConfig) -> tuple[str, ...]:
    """eval.context_bins' settings where no bin is asked for: the held-out acceptance by context length is then not
    measured, and a change of them trains nothing again."""
    return () if cfg.eval.context_bins else CONTEXT_KEYS


def files_read(cfg: BuildConfig) -> list:
    """eval.acceptance_suite, and eval.context_documents where the held-out acceptance by context length reads
    documents."""
    from trtspec.suites import acceptance_suite_read, context_documents_read

    return acceptance_suite_read(cfg) + context_documents_read(cfg)


def environment_key() -> dict | None:
    """The number of training processes: it multiplies the rows of an optimizer step, so a run trained with
    another is not this one (and its checkpoints do not resume here)."""
    return {"world_size": ranks.size()} if ranks.size() > 1 else None


def training_args(ctx: StageContext, out_dir: Path, rows: int, sharded: bool = False) -> Any:
    import torch
    from transformers import TrainingArguments

    from trtspec.models import use_bf16

    t = ctx.cfg.train
    gpu = torch.cuda.is_available()
    return TrainingArguments(
        output_dir=str(out_dir),
        per_device_train_batch_size=t.batch_size,
        gradient_accumulation_steps=t.grad_accum,
        learning_rate=t.lr,
        lr_scheduler_type=t.lr_schedule,
        # transformers 5: a float < 1 is a share of the steps, an int a number of steps
        warmup_steps=t.warmup_steps if t.warmup_steps is not None else t.warmup_ratio,
        num_train_epochs=t.epochs,
        max_steps=t.max_steps or -1,
        save_strategy="steps",
        save_steps=t.save_steps,
        save_total_limit=2,
        logging_steps=log_every(rows, t),
        bf16=use_bf16(ctx.cfg.model.build_dtype),  # autocast; the head's weights and optimizer state stay fp32
        use_cpu=not gpu,
        seed=ctx.cfg.seed,
        data_seed=ctx.cfg.seed,
        report_to=[],
        remove_unused_columns=False,
        dataloader_num_workers=0,
        disable_tqdm=False,
        save_only_model=sharded,  # a sharded head's optimizer state is saved by trtspec (per rank), not the Trainer
        ddp_find_unused_parameters=False,  # multi-process: every trainable parameter (the head's) has a gradient
    )


def log_every(rows: int, t: TrainSection) -> int:
    """Optimizer steps between rows of train_log.jsonl (and lines on the console): about 100 rows per run."""
    per_epoch = math.ceil(rows / (t.batch_size * t.grad_accum))
    steps = t.max_steps or math.ceil(per_epoch * t.epochs)
    return max(1, steps // 100)


def target_states_dir(ctx: StageContext, aux_layers: list[int], served: tuple[Path, dict] | None = None) -> Path:
    """Scratch for what the frozen target computes (hidden states of the training rows, held-out greedy answers),
    beside the stage's own scratch.

    Keyed on the target (a local one by its files' sizes and mtimes too; `served`, its quantization with
    model.train_on_quantized; how its prompts render, models.rendering_key), the data stage's files and the aux layers
    only: a new lr, schedule, epoch count or batch size reuses it, so trying a recipe costs the training alone."""
    from trtspec.artifacts import fingerprint, keyed_scratch
    from trtspec.models import rendering_key, use_bf16

    files = ctx.manifests["data"]["files"]  # sha256 recorded by the data stage (and checked by the pipeline)
    what = {
        "model": [ctx.cfg.model.source, ctx.cfg.model.dtype],
        **({"quantized": served[1]["files"]} if served else {}),
        "data": {f: files[f]["sha256"] for f in ("train_tokens.pt", "heldout.jsonl")},
        "aux_layers": aux_layers,
        "bf16": use_bf16(ctx.cfg.model.build_dtype),
    }
    if stamp := ctx.model_stamp:
        what["model_files"] = stamp
    what.update(rendering_key(ctx.cfg))  # the held-out prompts' answers are the target's to the prompts it renders
    key = fingerprint(what)
    return keyed_scratch(ctx.work.parent, "target", key)


def training_tokens(data_dir: Path) -> dict:
    """The data stage's training tensors; none at all is an error the user can act on."""
    import torch

    path = data_dir / "train_tokens.pt"
    if not path.is_file():
        raise ArtifactError(f"'{path}' is missing", "re-run the data stage")
    tokens = torch.load(path, weights_only=True)
    if len(tokens["input_ids"]) == 0:
        raise DataError("the data stage produced no training rows", "add data sources")
    return tokens


def first_rows(ctx: StageContext, tokens: dict) -> dict:
    """train.max_rows: the first rows only (the cached states line up: same order, a prefix)."""
    t = ctx.cfg.train
    if t.max_rows and t.max_rows < len(tokens["input_ids"]):
        ctx.log(f"training on the first {t.max_rows} of {len(tokens['input_ids'])} rows (train.max_rows)")
        tokens = {k: v[: t.max_rows] for k, v in tokens.items()}
    return tokens


def heldout_eval_set(ctx: StageContext, base: Any, tok: Any, aux_layers: list[int], target_dir: Path,
                     engine: Any = None) -> tuple[list | None, Path]:
    """The target's greedy answers to the held-out prompts (quantized with model.train_on_quantized), with its states
    (rank 0 alone measures acceptance: None on the other ranks), and the file that caches them. engine: an EngineTarget, whose answers and
    states come from the engine that serves the target (cached apart from the HF forward's)."""
    from trtspec.models import matmul_attention_on_cpu

    heldout = read_rows(ctx.inputs["data"] / "heldout.jsonl")[: ctx.cfg.eval.acceptance_prompts]
    n_new = ctx.cfg.data.max_new_tokens
    eval_file = target_dir / f"eval_seqs-{'' if engine is None else 'vllm-'}{len(heldout)}x{n_new}.pt"
    if not ranks.is_main():
        return None, eval_file
    with matmul_attention_on_cpu(base):
        return build_eval_set(base, tok, prompt_rows(heldout), aux_layers, n_new, eval_file, ctx.log, EVAL_BATCH,
                              engine), eval_file


def suite_eval_set(ctx: StageContext, base: Any, tok: Any, aux_layers: list[int], target_dir: Path,
                   engine: Any = None) -> list | None:
    """eval.acceptance_suite: the target's greedy answers to the suite's prompts (none of them trained on), with its
    states, cached by the file's content beside the held-out answers (rank 0 alone measures; engine: as
    heldout_eval_set's); None without a suite."""
    import hashlib
    from collections import Counter

    from trtspec.models import matmul_attention_on_cpu
    from trtspec.suites import acceptance_suite_read

    if not (files := acceptance_suite_read(ctx.cfg)) or not ranks.is_main():
        return None
    rows = files[0].read(files[0].path, Counter())
    digest = hashlib.sha256(files[0].path.read_bytes()).hexdigest()[:16]
    cache = target_dir / f"suite_seqs-{'' if engine is None else 'vllm-'}{digest}x{ctx.cfg.data.max_new_tokens}.pt"
    with matmul_attention_on_cpu(base):
        return build_eval_set(base, tok, rows, aux_layers, ctx.cfg.data.max_new_tokens, cache, ctx.log, EVAL_BATCH, engine)


def twin_split(ctx: StageContext, acc: dict, k: int) -> dict | None:
    """The held-out AL split between the prompts with a near-twin among the prompts trained on (chat.near_twins: a
    template filled in again) and those without: how much of the held-out figure is the templates."""
    from trtspec.chat import NEAR_TWIN, held_out_twins
    from trtspec.training.acceptance import split_by_twins

    twins = held_out_twins(ctx.inputs["data"], ctx.cfg.eval.acceptance_prompts, ctx.cfg.train.max_rows)
    if len(twins) != len(acc["per_prompt"]):
        return None  # answers not one per held-out prompt (cannot be told apart)
    return {"overlap": NEAR_TWIN, **split_by_twins(acc, twins, k)}


def suite_acceptance(model: Any, suite_set: list, k: int, drafts_fn: Any, held_out: dict) -> dict:
    """The draft on eval.acceptance_suite's prompts: AL@k with its interval, per category, and its ratio to the
    held-out AL (how far what the draft learned carries to prompts unlike its training ones)."""
    acc = evaluate_acceptance(model, suite_set, k, drafts_fn)
    return {"prompts": len(suite_set), f"AL@{k}": acc[f"AL@{k}"], f"AL@{k}_ci95": acc[f"AL@{k}_ci95"],
            "vs_held_out": round(acc[f"AL@{k}"] / max(held_out[f"AL@{k}"], 1e-9), 3),
            "per_category": {c: v[f"AL@{k}"] for c, v in acc["per_category"].items()},
            "accept_rate_by_position": acc["accept_rate_by_position"]}


def heldout_context_sets(ctx: StageContext, base: Any, tok: Any, aux_layers: list[int], engine: Any = None) -> list[dict] | None:
    """eval.context_bins: the first eval.context_prompts held-out prompts after earlier training conversations or
    documents (suites.context_fill) filling each bin, with the target's greedy answers and states (rank 0 alone
    measures; engine: as heldout_eval_set's)."""
    from trtspec.models import matmul_attention_on_cpu
    from trtspec.suites import context_fill

    e = ctx.cfg.eval
    if not e.context_bins or not ranks.is_main():
        return None
    prompts = prompt_rows(read_rows(ctx.inputs["data"] / "heldout.jsonl"))[: e.context_prompts]
    fill = context_fill(ctx.cfg, ctx.inputs["data"])
    with matmul_attention_on_cpu(base):
        return context_eval_sets(base, tok, prompts, fill, sorted(e.context_bins), aux_layers,
                                 ctx.cfg.data.max_new_tokens, ctx.log, EVAL_BATCH, engine)


def states_source(ctx: StageContext, base: Any, tok: Any, aux_layers: list[int], target_dir: Path) -> Any:
    """Where the target's states come from (train.states_from): the HF forward here, vLLM serving the target in this
    process (in a spawned one where it would rewrite transformers' classes), or a states server (checked before
    anything else runs against it)."""
    from trtspec.engines import vllm as vllm_engine
    from trtspec.models import use_bf16
    from trtspec.training.engine_states import (
        EndpointStates,
        VllmStates,
        final_norm,
        server_launch_line,
        target_dtype_for_states,
    )

    bf16 = use_bf16(ctx.cfg.model.build_dtype)
    if ctx.cfg.train.states_from == "hf":
        return HFStates(base, aux_layers, bf16)
    if ctx.cfg.train.states_from == "endpoint":
        layers = base.config.num_orig_hidden_layers
        launch = server_launch_line(ctx.cfg, ctx.model_path, aux_layers, layers)
        source = EndpointStates(ctx.cfg.train.states_endpoint, aux_layers, layers, final_norm(base), launch)
        source.check(tok, ctx.cfg.data.seq_len + ctx.cfg.data.max_new_tokens)
        return source
    return VllmStates(ctx.model_path, aux_layers, base.config.num_orig_hidden_layers, final_norm(base),
                      target_dir / f"vllm-rank{ranks.rank()}", target_dtype_for_states(bf16, ctx.model_path),
                      ctx.cfg.data.seq_len + ctx.cfg.data.max_new_tokens + 8,  # the held-out prompts and answers too
                      engine_args=ctx.cfg.train.states_engine.engine_args(), spawned=vllm_engine.own_process(ctx.model_path))


def target_states(ctx: StageContext, source: Any, base: Any, tokens: dict, aux_layers: list[int], target_dir: Path) -> Any:
    """offline mode: the target's states of every training row from `source` (states_source), computed once (rank 0
    first, the others read them); streamed: extracted a window ahead of the rows training reads; online: None (the
    target runs in every step)."""
    t = ctx.cfg.train
    if t.mode == "online":
        return None
    if t.mode == "streamed":
        window = check_buffer_holds_a_batch(t, tokens["input_ids"].shape[1], base.config.hidden_size, len(aux_layers))
        ctx.log(f"streaming target states from {source.name}, {window} rows at a time ({t.states_storage})")
        return StreamedStates(source, tokens, window, t.states_storage, len(aux_layers))
    with ranks.main_first():
        maps = cache_states(source, tokens, base.config.hidden_size, aux_layers,
                            states_folder(target_dir, t.states_from, t.states_storage), ctx.log, storage=t.states_storage)
    source.close()
    return CachedStates(maps)


def states_folder(target_dir: Path, states_from: str, storage: str = "fp16") -> Path:
    """Where the offline states of one source and storage are cached (each its own: their rounding differs)."""
    return target_dir / "-".join(["states", *([states_from] if states_from != "hf" else []), *([storage] if storage != "fp16" else [])])


def engine_target(ctx: StageContext, tok: Any, source: Any) -> Any:
    """The held-out answers and states from the engine (training.engine_states.EngineTarget): the source's own
    answers (the states server's, or vLLM's offline engine in the dtype it extracts in)."""
    from trtspec.training.engine_states import EngineTarget

    return EngineTarget(source.answers, source, {tok.eos_token_id})


def target_in_trainer(base: Any) -> dict:
    """What of the target this process holds: its decoder layers (of how many) and parameters."""
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else base.model
    return {"decoder_layers": len(getattr(decoder, "layers", [])), "of_layers": base.config.num_orig_hidden_layers,
            "parameters": sum(p.numel() for p in base.parameters())}


def check_buffer_holds_a_batch(t: TrainSection, seq_len: int, hidden: int, aux: int) -> int:
    """The rows train.states_buffer_mib holds (streamed states), refused when fewer than one batch."""
    window = window_rows(t.states_buffer_mib, seq_len, hidden, aux, t.states_storage)
    if window < t.batch_size:
        raise ConfigError(f"train.states_buffer_mib {t.states_buffer_mib} holds {window} rows of {seq_len} tokens, "
                          f"fewer than one batch ({t.batch_size})", "raise train.states_buffer_mib")
    return window


def states_metrics(states: Any, storage: str) -> dict:
    """What the states cost, held as `storage` (train.states_storage): the offline cache's bytes on disk; for streamed
    states, the rows extracted and the buffer's and the engine's files' peaks."""
    if isinstance(states, CachedStates):
        return {"states_storage": storage, "states_disk_bytes": sum(int(m.nbytes) for m in states.maps.values())}
    if not isinstance(states, StreamedStates):
        return {}
    return {"states_storage": storage, **states.stats, "peak_engine_files_bytes": getattr(states.source, "peak_disk", 0)}


def train_head(ctx: StageContext, fam: TrainableDraft, model: Any, head: Any, tokens: dict, states: dict | None,
               eval_set: list | None, suite_set: list | None = None) -> tuple[dict, dict]:
    """The HF Trainer run, resumed from the last checkpoint in ctx.work; returns the rows it trained on
    (train.max_rows) and what the run did (steps, loss, seconds, per-rank memory and head parameters). Every
    train.eval_steps the held-out acceptance is logged, and the suite's (eval.acceptance_suite) beside it."""
    import time

    t, k = ctx.cfg.train, ctx.cfg.draft.length
    ckpt_dir, log_file = ctx.work / "checkpoints", ctx.work / "train_log.jsonl"
    last_ckpt, resumed_step = ranks.broadcast(resume_point(ckpt_dir, log_file, ctx.log) if ranks.is_main() else None)
    tokens = first_rows(ctx, tokens)
    # train.loss_on_prompt: every real token is a label, prompt included (not the padding)
    scored = {**tokens, "loss_mask": tokens["attention_mask"].clone()} if t.loss_on_prompt else tokens

    def evaluate_now() -> dict | None:  # every rank (a sharded head is gathered); rank 0 measures
        with sharding.full_head(model, head):
            if not ranks.is_main():
                return None
            held = reported(evaluate_acceptance(model, eval_set, k, fam.drafts))
            return {**held, "suite": suite_acceptance(model, suite_set, k, fam.drafts, held)} if suite_set else held

    args = training_args(ctx, ckpt_dir, len(tokens["input_ids"]), sharded=head is not None)
    trainer = make_trainer(model, HeadDataset(scored, states, fam.shift_labels), args, log_file, evaluate_now,
                           t.eval_steps, head, fam)
    t1 = time.time()
    result = trainer.train(resume_from_checkpoint=last_ckpt)
    return tokens, {
        "steps": trainer.state.global_step, "resumed_from_step": resumed_step, "loss": result.training_loss,
        "train_s": time.time() - t1, "peak_rss_gib_by_rank": ranks.gather(peak_rss_gib()),
        "head_parameters_by_rank": ranks.gather(sharding.local_parameters(fam.module(model))),  # FSDP: each rank's shards
    }


def write_outputs(ctx: StageContext, fam: TrainableDraft, model: Any, draft_cfg: dict, eval_file: Path) -> None:
    """The trained draft, its config (for a full target), the held-out answers and the training log; the
    checkpoints go."""
    ckpt_dir, log_file = ctx.work / "checkpoints", ctx.work / "train_log.jsonl"
    fam.save_head(model, ctx.out / fam.head_file)
    shutil.copyfile(eval_file, ctx.out / EVAL_SEQS)  # export's acceptance check reuses these greedy answers
    fam.set_offline(draft_cfg, False)  # the draft is used with a full target from here on
    fam.write_config(ctx.out, draft_cfg)
    shutil.copyfile(log_file, ctx.out / "train_log.jsonl") if log_file.is_file() else (ctx.out / "train_log.jsonl").touch()
    # the head is in the stage's output now; a finished run's checkpoints would only make a forced redo (--force,
    # --from train) "resume" at its last step and train nothing. Killed between here and the manifest: it retrains.
    shutil.rmtree(ckpt_dir, ignore_errors=True)


def run(ctx: StageContext) -> dict:
    import time

    from trtspec.models import load_model, target_tokenizer
    from trtspec.ptq import as_served, served_quantization

    t_cfg, k = ctx.cfg.train, ctx.cfg.draft.length
    conv_dir = ctx.inputs["convert"]
    fam = family(ctx.cfg.draft.method)
    draft_cfg = fam.read_config(conv_dir)
    fam.set_length(draft_cfg, k)
    aux_layers = fam.state_layers(draft_cfg)
    tokens = training_tokens(ctx.inputs["data"])
    tok = target_tokenizer(ctx.cfg, ctx.model_path)
    from_engine = t_cfg.states_from != "hf"  # the engine serving the target computes every state the draft reads
    served = served_quantization(ctx.cfg)  # model.train_on_quantized: the states from the target as it is served
    base = load_model(ctx.model_path, ctx.cfg.model.dtype, layers=not (from_engine or served))  # else no decoder layer
    if not (from_engine or served):
        base.config.num_orig_hidden_layers = base.config.num_hidden_layers
    target_held = target_in_trainer(base)
    states_model = as_served(load_model(ctx.model_path, ctx.cfg.model.dtype), served[0]) if served else base

    target_dir = target_states_dir(ctx, aux_layers, served)
    if t_cfg.mode == "offline":  # before the held-out answers and the states: minutes a full disk would waste
        check_states_fit(states_folder(target_dir, t_cfg.states_from, t_cfg.states_storage), tokens, base.config.hidden_size,
                         len(aux_layers), t_cfg.states_storage)
    source = states_source(ctx, states_model, tok, aux_layers, target_dir) if t_cfg.mode != "online" else None
    engine = engine_target(ctx, tok, source) if from_engine else None
    eval_set, eval_file = heldout_eval_set(ctx, states_model, tok, aux_layers, target_dir, engine)
    context_sets = heldout_context_sets(ctx, states_model, tok, aux_layers, engine)
    suite_set = suite_eval_set(ctx, states_model, tok, aux_layers, target_dir, engine)
    t0 = time.time()
    states = target_states(ctx, source, states_model, tokens, aux_layers, target_dir)
    del states_model
    if states is not None:
        fam.set_offline(draft_cfg, True)  # modelopt drops the target's decoder layers
    cache_s = time.time() - t0
    model = fam.build(base, draft_cfg)
    fam.load_head(model, conv_dir / "head_init.safetensors")
    before = evaluate_acceptance(model, eval_set, k, fam.drafts) if ctx.cfg.draft.init_from and ranks.is_main() else None
    head = sharding.shard_head(model, fam.module_attr) if t_cfg.sharding == "fsdp" and ranks.size() > 1 else None
    gc.collect()

    tokens, trained = train_head(ctx, fam, model, head, tokens, states, eval_set, suite_set)
    if head is not None:
        sharding.keep_full_head(model, head)
    if not ranks.is_main():
        return {}
    fit_set = training_rows_set(tokens, states, model, aux_layers, len(eval_set))
    if states is not None:
        states.close()  # the engine streamed states came from
    ctx.log(f"measuring acceptance on {len(eval_set)} held-out prompts and {len(fit_set)} training rows")
    acc = evaluate_acceptance(model, eval_set, k, fam.drafts)
    gate = None
    if before is not None:
        gate, acc = warm_start_gate(ctx, fam, model, conv_dir / "head_init.safetensors", eval_set, before, acc)
    fit = evaluate_acceptance(model, fit_set, k, fam.drafts)
    write_outputs(ctx, fam, model, draft_cfg, eval_file)
    if gate is not None and not gate["passed"] and ctx.cfg.draft.max_category_drop is not None:
        refuse_fallen_draft(ctx, gate)
    metrics = train_metrics(ctx, fam.name, tokens, trained, cache_s, head is not None, len(eval_set), acc, fit)
    if before is not None:
        metrics["before"] = {key: v for key, v in reported(before).items() if "ci95" not in key}
        metrics["gate"] = gate
    metrics["states"] = {"from": t_cfg.states_from, **states_metrics(states, t_cfg.states_storage)} if states is not None else None
    metrics["target_in_trainer"] = target_held
    if twins := twin_split(ctx, acc, k):
        metrics["held_out_twins"] = twins
        part = {key: f"{p[f'AL@{k}']:.2f} on {p['prompts']}" if (p := twins[key]) else "none" for key in ("with_twin", "without_twin")}
        ctx.log(f"held-out AL@{k} of the prompts with a near-twin among the training prompts ({twins['overlap']:.0%} of "
                f"words shared): {part['with_twin']}; of those without: {part['without_twin']}")
    ctx.log(metrics["headline"] + f"; by draft position {acc['accept_rate_by_position']}; on training rows AL@{k} {fit[f'AL@{k}']:.2f}")
    if suite_set:
        path = ctx.cfg.eval.acceptance_suite  # as the YAML writes it, and where it is (an adaptation measures it again)
        metrics["suite"] = suite = {"path": path, "file": str(ctx.cfg.resolve_path(path)),
                                    **suite_acceptance(model, suite_set, k, fam.drafts, acc)}
        lo, hi = suite[f"AL@{k}_ci95"]
        ctx.log(f"eval.acceptance_suite: AL@{k} {suite[f'AL@{k}']:.2f} ({lo:.2f}-{hi:.2f}) on {suite['prompts']} prompts, "
                f"{suite['vs_held_out']:.2f}x the held-out AL; " + ", ".join(f"{c} {v:.2f}" for c, v in suite["per_category"].items()))
    if context_sets:
        metrics["per_context"] = context_acceptance(model, context_sets, k, fam.drafts)
        for r in metrics["per_context"]:
            ctx.log(f"context {r['bin']}: {r['context_tokens']} tokens, held-out AL@{k} {r[f'AL@{k}']:.2f} "
                    f"({r[f'AL@{k}_ci95'][0]:.2f}-{r[f'AL@{k}_ci95'][1]:.2f}), {r['vs_shortest']:.2f}x the shortest bin's")
    return metrics


def reported(acc: dict) -> dict:
    """An acceptance measurement as manifests and logs keep it (without its per-prompt counts)."""
    return {key: v for key, v in acc.items() if key not in ("per_prompt", "categories")}


def warm_start_gate(ctx: StageContext, fam: TrainableDraft, model: Any, start_file: Path, eval_set: list, before: dict,
                    after: dict) -> tuple[dict, dict]:
    """draft.init_from: each category's held-out AL against the earlier draft's on the same rows (draft.max_category_drop).
    A draft that falls is moved back toward the earlier one by draft.step_back's shares in turn, each measured, until
    one passes; (the gate, the kept draft's acceptance), the model left holding the kept draft (the fine-tune when
    none passes)."""
    from trtspec.artifacts import read_tensors
    from trtspec.warm_start import stepped_back

    gate = category_gate(ctx, before, after)
    shares = ctx.cfg.draft.step_back
    if gate["passed"] or ctx.cfg.draft.max_category_drop is None or not shares:
        return {**gate, "share": 1.0}, after
    module = fam.module(model)
    tuned = {key: v.detach().clone() for key, v in module.state_dict().items()}
    start = read_tensors(start_file, "the warm start's weights")
    for share in shares:
        module.load_state_dict(stepped_back(start, tuned, share), strict=False)
        acc = evaluate_acceptance(model, eval_set, ctx.cfg.draft.length, fam.drafts)
        ctx.log(f"stepped back to {share:.2f} of the fine-tune:")
        if (moved := category_gate(ctx, before, acc))["passed"]:
            return {**moved, "share": share, "fine_tune": gate}, acc
    module.load_state_dict(tuned)
    return {**gate, "share": 1.0, "stepped_back": list(shares)}, after


def category_gate(ctx: StageContext, before: dict, after: dict) -> dict:
    """Each category's held-out AL before and after, with the paired 95% interval of its change (logged, and in the
    gate's `change_ci95`: a fall the interval spans zero on is within the draw of the category's prompts), gated at
    draft.max_category_drop (null: at 0, reported)."""
    from trtspec.checks import baseline_gate
    from trtspec.runtime.decode import al_ratio_interval

    k, tolerance = ctx.cfg.draft.length, ctx.cfg.draft.max_category_drop
    als = {name: {c: v[f"AL@{k}"] for c, v in m["per_category"].items()} for name, m in (("before", before), ("after", after))}
    change = {}
    for c in als["after"]:
        rows = [i for i, ex in enumerate(before["categories"]) if ex == c]
        lo, hi = change[c] = al_ratio_interval([before["per_prompt"][i] for i in rows], [after["per_prompt"][i] for i in rows])
        ctx.log(f"category {c}: held-out AL@{k} {als['before'][c]:.2f} -> {als['after'][c]:.2f} "
                f"({als['after'][c] / als['before'][c] - 1:+.1%}; paired 95% CI {lo - 1:+.1%} to {hi - 1:+.1%}, {len(rows)} prompts)")
    now = {c: {"acceptance_length": v, "prompts": after["per_category"][c].get("prompts")} for c, v in als["after"].items()}
    gate = baseline_gate({"per_category": now}, als["before"], tolerance or 0.0, ctx.cfg.validate_.baseline_min_prompts)
    return {**gate, "al_before": als["before"], "al_after": als["after"], "change_ci95": change}


def refuse_fallen_draft(ctx: StageContext, gate: dict) -> None:
    """Fail the stage on a draft that fell past draft.max_category_drop: nothing is exported from it, its outputs kept
    in RUN/train-failed with the gate's figures (gate.json: each category's AL before and after)."""
    from trtspec.errors import ValidationFailed

    failed = ctx.run.path / "train-failed"
    shutil.rmtree(failed, ignore_errors=True)
    shutil.copytree(ctx.out, failed)
    (failed / "gate.json").write_text(json.dumps(gate, indent=1) + "\n")
    tried = f" (stepped back to {', '.join(f'{s:.2f}' for s in gate['stepped_back'])} of the fine-tune too)" if gate.get("stepped_back") else ""
    raise ValidationFailed(f"the adapted draft falls behind the one it started from{tried}: "
                           f"{gate['message'].replace('baseline', 'earlier draft')}",
                           f"its outputs and each category's figures (gate.json) are kept in {failed}; lower draft.init_from's learning rate (train.lr) or "
                           "epochs, keep more of the earlier rows (data.sources kind: run, limit), or set draft.step_back")


def train_metrics(ctx: StageContext, method: str, tokens: dict, trained: dict, cache_s: float, sharded: bool,
                  eval_prompts: int, acc: dict, fit: dict) -> dict:
    """The stage's metrics: the run (steps, loss, time, memory), the rows, and acceptance held-out and on training rows."""
    from trtspec.models import use_bf16

    t, k = ctx.cfg.train, ctx.cfg.draft.length
    rows = read_rows(ctx.out / "train_log.jsonl")
    final = rows[-1] if rows else {}
    steps, train_s, loss = trained["steps"], trained["train_s"], trained["loss"]
    mean_len = float(tokens["attention_mask"].sum()) / max(len(tokens["attention_mask"]), 1)
    return {
        "draft_method": method,
        "mode": t.mode,
        "steps": steps,
        "resumed_from_step": trained["resumed_from_step"],
        "train_loss": round(float(loss), 4) if math.isfinite(loss) else None,
        "final_acc_ttt": final.get("acc_ttt"),
        "cache_states_s": round(cache_s, 1),
        "train_s": round(train_s, 1),
        # real (unpadded) tokens: batches are grouped by length and cut to their longest row
        "world_size": ranks.size(),  # processes that trained (each a batch of train.batch_size per micro-step)
        "peak_rss_gib_by_rank": trained["peak_rss_gib_by_rank"],
        "sharding": "fsdp" if sharded else "ddp" if ranks.size() > 1 else None,
        "head_parameters_by_rank": trained["head_parameters_by_rank"],
        "train_tokens_per_s": round(steps * t.batch_size * t.grad_accum * ranks.size() * mean_len / max(train_s, 1e-9), 1),
        "precision": "bfloat16" if use_bf16(ctx.cfg.model.build_dtype) else "float32",
        "train_rows": len(tokens["input_ids"]),
        "label_tokens": int(tokens["loss_mask"].sum()),
        "eval_prompts": eval_prompts,
        **reported(acc),
        # the same measure on training rows: far above the held-out AL = short of data, close to it = short of fit
        "fit": {k: v for k, v in reported(fit).items() if "ci95" not in k and k != "per_category"},
        "headline": f"AL@{k} {acc[f'AL@{k}']:.2f} held-out ({eval_prompts} prompts"
        + (", 95% CI {:.2f}-{:.2f}".format(*acc[f"AL@{k}_ci95"]) if acc[f"AL@{k}_ci95"] else "")
        + f"), {steps} steps {t.mode}" + (f", {ranks.size()} processes" if ranks.size() > 1 else ""),
    }
