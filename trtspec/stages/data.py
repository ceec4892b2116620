"""The data stage: conversations for training the head, split into train and held-out, and tokenized.

Sources (data.sources[*].kind):
  regenerate  a prompt file (JSONL `prompt` or chat turns + optional `category`, or one prompt per line) answered
              by the target itself, greedy: the draft learns to predict exactly what it will be asked to predict.
  jsonl       conversations: OpenAI/HF `messages` [{role, content}], `conversations` (ShareGPT's [{from, value}], or
              [{role, content}] as SpecForge and Model Optimizer write them), LMSYS-Chat `conversation`, or
              instruction rows (Alpaca, Dolly, OpenOrca: chat.row_turns); an agent's with the `tools` offered,
              tool calls and `tool` turns (chat.chat_turn), labelled where the model wrote them
  text        one document per line (no chat template; every token is a label)
  hf          a `datasets` hub id (needs a network) or its local copy (trtspec.hf_datasets); rows parsed like jsonl
              rows, or a `text` column
  run         an earlier run of the same target (trtspec.warm_start): its answered conversations with the target's
              tokens, its training rows trained on (`limit` of them) and its held-out rows held out here too
A jsonl or hf source with `regenerate: true` keeps each conversation's turns before its answer (all of them where it
has no answer yet, as Model Optimizer's prepared conversations) and has the target answer them again.

Writes data/train.jsonl, data/heldout.jsonl (rows {id, category, messages} and `tools` where offered; the last message
is the answer) and data/train_tokens.pt, data/heldout_tokens.pt: {input_ids, attention_mask, loss_mask} [N,
data.seq_len], right-padded (training cuts each batch to its longest row).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec import answering
from trtspec.answering import Answers
from trtspec.chat import (
    REFUSED,
    TEMPLATE_HINT,
    answered_by_target,
    conversations_from_rows,
    encode_row,
    long_context_rows,
    prompts_from_rows,
    read_source,
    rendered_rows,
    require_rows,
    tokenize_rows,
    usable_row,
)
from trtspec.errors import ConfigError, DataError
from trtspec.pipeline.stage import InputFile, StageContext
from trtspec.warm_start import run_rows

if TYPE_CHECKING:
    from trtspec.config import BuildConfig

UPSTREAM: tuple[str, ...] = ()
READS = ("model", "data", "seed")
HF_ROWS_CHECKED = 1000  # rows of a kind: hf source the preflight reads (the stage reads them all)


def preflight(cfg: BuildConfig, model_config: Any) -> None:
    """data.context_tokens and the answer after it within the target's window, each kind: run source a run of this
    target, each kind: hf source loaded with usable rows among its first HF_ROWS_CHECKED, model.chat_template a Jinja file
    and model.chat_template_kwargs read by the chat template, before minutes of answering."""
    from trtspec.config import check_fits_window
    from trtspec.models import resolve_model, target_tokenizer
    from trtspec.ptq import served_quantization
    from trtspec.targets import text_config
    from trtspec.warm_start import check_same_target, earlier_run

    if served_quantization(cfg) and cfg.data.answer_with != "hf":
        raise ConfigError(f"model.train_on_quantized: the quantized target answers here (data.answer_with: hf); "
                          f"{cfg.data.answer_with} answers as its own engine serves the target",
                          "set data.answer_with: hf, or model.train_on_quantized: null")
    for i, s in enumerate(cfg.data.sources):
        if s.kind == "run":
            key = f"data.sources[{i}].path"
            check_same_target(earlier_run(cfg.resolve_path(s.path), key), cfg, key)
        if s.kind == "hf":  # loaded (with no network: one line) and its first rows read, before any source is answered
            skips: Counter = Counter()
            require_rows(hf_conversations(cfg, i, skips, HF_ROWS_CHECKED), Path(s.path), f"data.sources[{i}] dataset",
                         usable_row(s.kind, s.regenerate), skips)

    if cfg.model.chat_template or cfg.model.chat_template_kwargs:  # a Jinja file; each a variable the template reads
        target_tokenizer(cfg, resolve_model(cfg.model.source))
    if d := cfg.data.context_tokens:
        check_fits_window(f"data.context_tokens {d}", d, "data.max_new_tokens", cfg.data.max_new_tokens,
                          text_config(model_config).max_position_embeddings)


def files_read(cfg: BuildConfig) -> list[InputFile]:
    """The local data sources, each with the reader this stage reads it with (chat.read_source)."""
    from functools import partial

    def read(s: Any) -> Callable:
        if s.kind == "run":
            return lambda path, skips: run_rows(cfg.resolve_path(s.path), skips, s.limit)[0]
        return partial(read_source, kind=s.kind, limit=s.limit, regenerate=s.regenerate, name=Path(s.path).stem)

    return [InputFile(f"data.sources[{i}].path", "data file", s.path,
                      cfg.resolve_path(s.path) / "data" / "train.jsonl" if s.kind == "run" else cfg.resolve_path(s.path),
                      usable_row(s.kind, s.regenerate), read(s))
            for i, s in enumerate(cfg.data.sources) if s.kind != "hf"]


def regenerate(prompts: list[dict], tok: Any, answers_file: Path, answer: Callable[[list[list[int]]], Answers],
               log: Any) -> list[dict]:
    """Answer each prompt not yet in `answers_file` with `answer` (trtspec.answering), appending each answer as it
    comes so a killed run resumes where it stopped and asks nothing twice.

    A row keeps the target's own tokens (`input_ids` = prompt + answer, `label_start`) beside the answer's text:
    training uses those, because the decoded text tokenized again is not always what the target wrote (many of the
    demo's answers split differently somewhere, e.g. "\\n\\n1." in lists), and from there on the row would show the
    head contexts the target never produces."""
    from tqdm import tqdm

    done: dict[str, dict] = {}
    if answers_file.is_file():
        for line in answers_file.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                done[row["id"]] = {"answer": str(row["answer"]), "prompt_ids": list(row["prompt_ids"]), "ids": list(row["ids"])}
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a half-written last line from a kill (or an answer saved without its tokens)
    prompt_ids = {p["id"]: encode_row(tok, p) for p in prompts}
    # an answer to the prompt as the chat template encoded it then: encoded otherwise now, it is asked again
    todo = [p for p in prompts if p["id"] not in done or done[p["id"]]["prompt_ids"] != prompt_ids[p["id"]]]
    if done:
        log(f"resuming: {len(prompts) - len(todo)} of {len(prompts)} prompts already answered")
    todo.sort(key=lambda p: len(prompt_ids[p["id"]]))  # similar lengths per batch: less padding
    bar = tqdm(total=len(todo), desc="regenerating answers", unit="prompt", disable=not todo)
    tokens, t0 = 0, time.perf_counter()
    with open(answers_file, "a", encoding="utf-8") as f:
        for i, ids in answer([prompt_ids[p["id"]] for p in todo]) if todo else ():
            p = todo[i]
            done[p["id"]] = {"answer": tok.decode(ids, skip_special_tokens=True).strip(), "prompt_ids": prompt_ids[p["id"]], "ids": ids}
            f.write(json.dumps({"id": p["id"], **done[p["id"]]}) + "\n")
            f.flush()
            tokens += len(ids)
            bar.set_postfix_str(f"{tokens / (time.perf_counter() - t0):.0f} tok/s", refresh=False)
            bar.update(1)
    bar.close()
    rows = []
    for p in prompts:
        if (a := done.get(p["id"])) and a["answer"]:
            rows.append({**p, "messages": p["messages"] + [{"role": "assistant", "content": a["answer"]}],
                         "input_ids": a["prompt_ids"] + a["ids"], "label_start": len(a["prompt_ids"])})
    return rows


class Target:
    """The target's folder and tokenizer, and its model loaded on first use (only HF regeneration needs it here)."""

    def __init__(self, model_dir: Path, tok: Any, cfg: BuildConfig):
        from trtspec.ptq import served_quantization

        self.model_dir, self.tok, self.cfg, self._model = model_dir, tok, cfg, None
        self.served = served_quantization(cfg)  # model.train_on_quantized: the target as it is served (checked once)

    def model(self) -> Any:
        from trtspec.models import load_answering_model
        from trtspec.ptq import as_served

        if self._model is None:
            self._model = load_answering_model(self.model_dir, self.cfg)
            if self.served:
                self._model = as_served(self._model, self.served[0])
        return self._model


def answerer(ctx: StageContext, target: Target, longest_prompt: int) -> Callable[[list[list[int]]], Answers]:
    """data.answer_with as a function of the prompts' token ids (trtspec.answering); the endpoint is checked here,
    before any prompt is sent."""
    from trtspec.generation import eos_ids

    d, tok, model_dir = ctx.cfg.data, target.tok, target.model_dir
    eos = eos_ids(model_dir, tok)
    if d.answer_with == "endpoint":
        endpoint = answering.Endpoint(d.endpoint, ctx.log)
        endpoint.check(tok, longest_prompt + d.max_new_tokens)
        ctx.log(f"answering through {endpoint.url} ('{endpoint.model}', {d.endpoint.concurrency} requests at once)")
        return lambda prompts: endpoint.answers(prompts, d.max_new_tokens, eos, d.temperature)
    if d.answer_with == "vllm":
        from trtspec.models import use_bf16

        dtype = "bfloat16" if use_bf16(ctx.cfg.model.build_dtype) else "float32"
        return lambda prompts: answering.answer_vllm(model_dir, dtype, prompts, d.max_new_tokens, eos, d.temperature)
    return lambda prompts: answering.answer_hf(target.model(), prompts, d.max_new_tokens, eos, tok.pad_token_id, d.temperature,
                                               d.batch_size)


def answers_dir(ctx: StageContext, served: tuple[Path, dict] | None) -> Path:
    """Scratch of the regenerated answers, keyed on what decides them (the target, its dtype, answer length,
    temperature, who answers) and not on how (batch size, the endpoint's URL, concurrency, retries): changing those
    after a kill asks nothing again."""
    from trtspec.artifacts import fingerprint, keyed_scratch
    from trtspec.models import rendering_key

    d = ctx.cfg.data
    key = fingerprint({"model": ctx.cfg.model.source, "stamp": ctx.model_stamp,
                       **({"quantized": served[1]["files"]} if served else {}),
                       "build_dtype": ctx.cfg.model.build_dtype, "max_new_tokens": d.max_new_tokens,
                       "temperature": d.temperature, "answer_with": d.answer_with,
                       "endpoint_model": d.endpoint.model if d.answer_with == "endpoint" else None,
                       **rendering_key(ctx.cfg)})  # keyed where set: older keys kept
    return keyed_scratch(ctx.work.parent, "answers", key)


def split_heldout(rows: list[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """A seeded shuffle; the first round(n * fraction) rows (at least 1 when fraction > 0 and n > 1) are held out."""
    order = list(rows)
    random.Random(seed).shuffle(order)
    k = round(len(order) * fraction)
    if fraction > 0 and len(order) > 1:
        k = min(max(k, 1), len(order) - 1)
    return order[k:], order[:k]


def source_rows(i: int, ctx: StageContext, skips: Counter, tok: Any) -> list[dict]:
    """data.sources[i]'s rows: a local file read by chat.read_source (as the build's preflight read it), or a datasets
    split (hf_conversations); those whose turns the target's chat template refuses skipped, a source left with none
    a DataError naming it."""
    src = ctx.cfg.data.sources[i]
    answered, own = answered_by_target(src.kind, src.regenerate), Counter()
    if src.kind == "hf":
        rows = hf_conversations(ctx.cfg, i, own)
    else:
        rows = read_source(ctx.cfg.resolve_path(src.path), own, src.kind, src.limit, src.regenerate, Path(src.path).stem)
    where = f"data.sources[{i}] dataset" if src.kind == "hf" else "data file"
    path = Path(src.path) if src.kind == "hf" else ctx.cfg.resolve_path(src.path)
    read, rows = rows, rendered_rows(rows, tok, own, prompts=answered)
    if read and not rows:
        why = next(k for k in own if k.startswith(REFUSED)).removeprefix(REFUSED)  # not a skip read_source counted
        raise DataError(f"{where} '{path}': the target's chat template refuses every row: {why}", TEMPLATE_HINT)
    require_rows(rows, path, where, usable_row(src.kind, src.regenerate), own)
    skips.update(own)
    return rows


def hf_rows(src: Any, resolve: Callable[[str], Path], where: str, limit: int | None = None) -> list[dict]:
    """The rows of a kind: hf source (its hub id or local copy: hf_datasets.load_hf_dataset), `limit` of them at most
    (data.sources[*].limit where None)."""
    from trtspec.hf_datasets import load_hf_dataset

    ds = load_hf_dataset(src.path, src.subset, src.split, resolve, where)
    n = min(x for x in (limit, src.limit, len(ds)) if x is not None)
    return ds.select(range(n)).to_list()


def hf_conversations(cfg: BuildConfig, i: int, skips: Counter, limit: int | None = None) -> list[dict]:
    """data.sources[i] (kind: hf): its rows as conversations, or as prompts where the target answers them
    (regenerate: true), `limit` rows read at most; a dataset that cannot be loaded is a DataError naming the key."""
    s = cfg.data.sources[i]
    where = f"data.sources[{i}] dataset '{s.path}'" + (f" [{s.subset}]" if s.subset else "") + f" split '{s.split}'"
    read = prompts_from_rows if answered_by_target(s.kind, s.regenerate) else conversations_from_rows
    return read(hf_rows(s, cfg.resolve_path, where, limit), Path(s.path).stem, skips)


def answer_prompts(prompts: list[dict], src: Any, ctx: StageContext, target: Any) -> list[dict]:
    """The target's own answers to `prompts` (source_rows refused a source without any), kept in a scratch file per
    source (a killed run resumes)."""
    longest = max(len(encode_row(target.tok, p)) for p in prompts)
    answer = answerer(ctx, target, longest)
    ctx.log(f"regenerating answers to {len(prompts)} prompts with the target ({ctx.cfg.data.answer_with}, "
            f"{ctx.cfg.data.max_new_tokens} new tokens max)")
    where = f"{src.path}:{src.split}" + (f":{src.subset}" if src.subset else "") if src.kind == "hf" else str(ctx.cfg.resolve_path(src.path))
    key = hashlib.sha1(where.encode()).hexdigest()[:8]
    return regenerate(prompts, target.tok, answers_dir(ctx, target.served) / f"answers-{key}.jsonl", answer, ctx.log)


def run(ctx: StageContext) -> dict:
    import torch

    from trtspec.models import target_tokenizer

    path = ctx.model_path
    tok = target_tokenizer(ctx.cfg, path)
    if not tok.chat_template and any(s.kind != "text" for s in ctx.cfg.data.sources):
        raise DataError(f"the tokenizer in '{path}' has no chat template", "use an instruct/chat model, or a text source only")
    target = Target(path, tok, ctx.cfg)

    skips: Counter = Counter()
    rows: list[dict] = []
    kept: dict[str, list[dict]] = {"train": [], "heldout": []}  # kind: run sources' rows, already split
    read = {i: source_rows(i, ctx, skips, tok) for i, src in enumerate(ctx.cfg.data.sources) if src.kind != "run"}
    for i, src in enumerate(ctx.cfg.data.sources):  # every source read and rendered before any is answered
        if src.kind == "run":
            train_rows, heldout_rows = run_rows(ctx.cfg.resolve_path(src.path), skips, src.limit)
            kept["train"] += train_rows
            kept["heldout"] += heldout_rows
            ctx.log(f"run '{src.path}': {len(train_rows)} training and {len(heldout_rows)} held-out conversations")
            continue
        got = answer_prompts(read[i], src, ctx, target) if answered_by_target(src.kind, src.regenerate) else read[i]
        ctx.log(f"{src.kind} '{src.path}': {len(got)} conversations")
        rows += got
    if skips:
        ctx.log("skipped: " + ", ".join(f"{n} {why}" for why, n in skips.items()))
    if not rows and not kept["train"]:
        raise DataError("the data sources gave no usable conversation", "check data.sources (each row needs an assistant turn)")
    train, heldout = split_heldout(rows, ctx.cfg.data.holdout_fraction, ctx.cfg.seed)
    train, heldout = train + kept["train"], kept["heldout"] + heldout
    rows = rows + kept["train"] + kept["heldout"]
    if n := ctx.cfg.data.context_tokens:
        train = long_context_rows(train, tok, n, ctx.cfg.data.context_share, ctx.cfg.seed)
    seq_len = ctx.cfg.data.seq_len
    metrics: dict[str, Any] = {"train_rows": len(train), "heldout_rows": len(heldout), "skipped": dict(skips)}
    for name, split in (("train", train), ("heldout", heldout)):
        (ctx.out / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in split), encoding="utf-8")
        tensors, truncated = tokenize_rows(split, tok, seq_len)
        unlabelled = int((tensors["loss_mask"].sum(1) == 0).sum())
        if name == "train" and unlabelled == len(split):
            raise DataError(f"no training conversation keeps a labelled token within data.seq_len={seq_len}",
                            "raise data.seq_len, or check that the chat template shows the answers as written "
                            "(python scripts/check_template_masks.py MODEL)")
        torch.save(tensors, ctx.out / f"{name}_tokens.pt")
        metrics[f"{name}_truncated"] = truncated
        metrics[f"{name}_unlabelled"] = unlabelled
        metrics[f"{name}_label_tokens"] = int(tensors["loss_mask"].sum())
        if truncated:
            ctx.log(f"{truncated} of {len(split)} {name} conversations truncated to data.seq_len={seq_len}")
        if unlabelled:
            ctx.log(f"{unlabelled} of {len(split)} {name} conversations keep no labelled token (their answer past "
                    f"data.seq_len={seq_len}, or not shown as written by the chat template): they teach nothing")
    metrics["categories"] = dict(Counter(r["category"] for r in rows))
    if ctx.cfg.data.context_tokens:
        metrics["train_long_context_rows"] = sum(1 for r in train if r.get("context_turns"))
    metrics["headline"] = (
        f"{len(train)} train + {len(heldout)} held-out conversations, {metrics['train_label_tokens']} label tokens"
        + (f" ({metrics['train_long_context_rows']} after earlier conversations)" if ctx.cfg.data.context_tokens else "")
        + (f", {sum(skips.values())} skipped" if skips else "")
        + (f", {metrics['train_truncated'] + metrics['heldout_truncated']} truncated" if metrics["train_truncated"] + metrics["heldout_truncated"] else "")
    )
    return metrics
