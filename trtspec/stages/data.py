"""The data stage: conversations for training the head, split into train and held-out, and tokenized.

Sources (data.sources[*].kind):
  regenerate  a prompt file (JSONL `prompt`/`messages` + optional `category`, or one prompt per line) answered by
              the target itself, greedy: the draft learns to predict exactly what it will be asked to predict.
  jsonl       conversations: OpenAI/HF `messages` [{role, content}] or ShareGPT `conversations` [{from, value}]
  text        one document per line (no chat template; every token is a label)
  hf          a `datasets` name (needs a network); rows parsed like jsonl rows, or a `text` column

Writes data/train.jsonl, data/heldout.jsonl (rows {id, category, messages}; the last message is the answer) and
data/train_tokens.pt, data/heldout_tokens.pt: {input_ids, attention_mask, loss_mask} [N, seq_len], right-padded
to one fixed length (modelopt 0.47 fails when the padded length changes between steps).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from trtspec.errors import DataError
from trtspec.pipeline import StageContext

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bing": "assistant", "bard": "assistant", "model": "assistant", "system": "system"}


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise DataError(f"data file '{path}' does not exist", "check data.sources[*].path (relative to the YAML)")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (UnicodeDecodeError, OSError) as e:
        raise DataError(f"data file '{path}' cannot be read as UTF-8 text ({e.__class__.__name__})") from None


def read_jsonl(path: Path, skips: Counter) -> list[dict]:
    """JSON objects, one per line; blank lines ignored, unparsable lines counted as skips."""
    rows = []
    for line in _read_lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            skips["unparsable line"] += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            skips["not a JSON object"] += 1
    return rows


def to_messages(row: dict) -> list[dict] | None:
    """OpenAI/HF `messages` or ShareGPT `conversations` -> [{role, content}] ending on an assistant turn (or None)."""
    turns = row.get("messages")
    if turns is None and isinstance(row.get("conversations"), list):
        turns = [{"role": ROLES.get(str(t.get("from", "")).lower()), "content": t.get("value")}
                 for t in row["conversations"] if isinstance(t, dict)]
    if not isinstance(turns, list):
        return None
    msgs = []
    for t in turns:
        if not isinstance(t, dict) or not isinstance(t.get("content"), str):
            return None
        role = ROLES.get(str(t.get("role", "")).lower())
        if role is None:
            return None
        msgs.append({"role": role, "content": t["content"]})
    last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
    if last is None or not msgs[last]["content"].strip():
        return None
    return msgs[: last + 1]


def conversations_from_rows(rows: list[dict], name: str, skips: Counter) -> list[dict]:
    out = []
    for i, row in enumerate(rows):
        if isinstance(row.get("text"), str) and "messages" not in row and "conversations" not in row:
            out.append(text_row(row["text"], f"{name}:{i}"))
            continue
        msgs = to_messages(row)
        if msgs is None:
            skips["no assistant turn"] += 1
            continue
        out.append({"id": str(row.get("id", f"{name}:{i}")), "category": str(row.get("category", "chat")), "messages": msgs})
    return out


def text_row(text: str, row_id: str) -> dict:
    # a plain document: one assistant message, tokenized without the chat template (see tokenize_row)
    return {"id": row_id, "category": "text", "messages": [{"role": "assistant", "content": text}]}


def read_prompts(path: Path, skips: Counter) -> list[dict]:
    """Prompts to regenerate: JSONL with `prompt` (str) or `messages` (the turns before the answer), or plain lines.

    Duplicate prompts are dropped (counted)."""
    lines = [ln for ln in _read_lines(path) if ln.strip()]
    as_json = path.suffix == ".jsonl" or (lines and lines[0].lstrip().startswith("{"))
    prompts, seen = [], set()
    for line in lines:
        if as_json:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                skips["unparsable prompt line"] += 1
                continue
            if not isinstance(row, dict):
                skips["unparsable prompt line"] += 1
                continue
            if isinstance(row.get("prompt"), str) and row["prompt"].strip():
                msgs = [{"role": "user", "content": row["prompt"]}]
            elif isinstance(row.get("messages"), list) and row["messages"]:
                msgs = [m for m in row["messages"] if isinstance(m, dict) and isinstance(m.get("content"), str)]
                if msgs and msgs[-1].get("role") == "assistant":
                    msgs = msgs[:-1]  # regenerate the answer
            else:
                msgs = []
            if not msgs:
                skips["prompt row without prompt"] += 1
                continue
            category = str(row.get("category", "chat"))
        else:
            msgs, category = [{"role": "user", "content": line.strip()}], "chat"
        key = json.dumps(msgs, sort_keys=True)
        if key in seen:
            skips["duplicate prompt"] += 1
            continue
        seen.add(key)
        prompts.append({"id": hashlib.sha1(key.encode()).hexdigest()[:12], "category": category, "messages": msgs})
    return prompts


def regenerate(prompts: list[dict], model: Any, tok: Any, answers_file: Path, cfg: Any, log: Any) -> list[dict]:
    """Answer each prompt with the target (batched, left-padded generate), appending answers to `answers_file`
    as batches finish so a killed run resumes where it stopped.

    A row keeps the target's own tokens (`input_ids` = prompt + answer, `label_start`) beside the answer's text:
    training uses those, because the decoded text tokenized again is not always what the target wrote (22% of the
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
    todo = [p for p in prompts if p["id"] not in done]
    if done:
        log(f"resuming: {len(prompts) - len(todo)} of {len(prompts)} prompts already answered")
    texts = {p["id"]: tok.apply_chat_template(p["messages"], tokenize=False, add_generation_prompt=True) for p in todo}
    todo.sort(key=lambda p: len(texts[p["id"]]))  # similar lengths per batch: less padding
    bar = tqdm(total=len(todo), desc="regenerating answers", unit="prompt", disable=not todo)
    with open(answers_file, "a", encoding="utf-8") as f:
        for i in range(0, len(todo), cfg.batch_size):
            batch = todo[i : i + cfg.batch_size]
            answers = generate_batch(model, tok, [texts[p["id"]] for p in batch], cfg.max_new_tokens, cfg.temperature)
            for p, (prompt_ids, ids) in zip(batch, answers, strict=True):
                done[p["id"]] = {"answer": tok.decode(ids, skip_special_tokens=True).strip(), "prompt_ids": prompt_ids, "ids": ids}
                f.write(json.dumps({"id": p["id"], **done[p["id"]]}) + "\n")
            f.flush()
            bar.update(len(batch))
    bar.close()
    rows = []
    for p in prompts:
        if (a := done.get(p["id"])) and a["answer"]:
            rows.append({**p, "messages": p["messages"] + [{"role": "assistant", "content": a["answer"]}],
                         "input_ids": a["prompt_ids"] + a["ids"], "label_start": len(a["prompt_ids"])})
    return rows


def load_answering_model(path: Path, cfg: Any) -> Any:
    """The target as regeneration runs it: in data.dtype (auto = model.dtype; fastest = bf16 where it is native),
    with the matmul attention on a CPU."""
    from trtspec.models import load_model, use_bf16, use_matmul_attention

    dtype = cfg.data.dtype
    if dtype == "fastest":
        dtype = "bfloat16" if use_bf16("auto") else "auto"
    model = load_model(path, dtype if dtype != "auto" else cfg.model.dtype)
    return use_matmul_attention(model) if model.device.type == "cpu" else model


def generate_batch(model: Any, tok: Any, texts: list[str], max_new_tokens: int, temperature: float = 0.0) -> list[tuple[list[int], list[int]]]:
    """Answer chat-templated `texts` in one left-padded generate call -> (prompt ids, answer ids) per text; an
    answer ends with its eos (the padding generate writes after it is dropped). Greedy at temperature 0."""
    import torch

    side, tok.padding_side = tok.padding_side, "left"
    try:
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(next(model.parameters()).device)
    finally:
        tok.padding_side = side
    sample = temperature > 0
    with torch.no_grad():
        seqs = model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=sample, temperature=temperature if sample else None,
            top_p=None, top_k=None, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        )
    width = enc["input_ids"].shape[1]
    out = []
    for mask, seq in zip(enc["attention_mask"], seqs.tolist(), strict=True):
        answer = seq[width:]
        if tok.eos_token_id in answer:
            answer = answer[: answer.index(tok.eos_token_id) + 1]
        out.append((seq[int((mask == 0).sum()) : width], answer))
    return out


def tokenize_row(row: dict, tok: Any, seq_len: int) -> tuple[list[int], list[int], bool]:
    """(input_ids, loss_mask, truncated): chat template applied, loss on assistant tokens only. A regenerated row
    brings the target's own tokens (input_ids, label_start: see regenerate); they are used as they are."""
    msgs = row["messages"]
    if "input_ids" in row:
        ids = list(row["input_ids"])
        mask = [0] * row["label_start"] + [1] * (len(ids) - row["label_start"])
    elif row.get("category") == "text" and len(msgs) == 1:
        ids = tok(msgs[0]["content"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        mask = [1] * len(ids)
    else:
        ids = _template_ids(tok, msgs, False)
        mask = [0] * len(ids)
        for i, m in enumerate(msgs):
            if m["role"] == "assistant":
                # assistant tokens = template(msgs[:i+1]) minus template(msgs[:i] + generation prompt)
                start = len(_template_ids(tok, msgs[:i], True))
                end = len(_template_ids(tok, msgs[: i + 1], False))
                mask[start:end] = [1] * (end - start)
    truncated = len(ids) > seq_len
    return ids[:seq_len], mask[:seq_len], truncated


def _template_ids(tok: Any, msgs: list[dict], generation_prompt: bool) -> list[int]:
    out = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=generation_prompt)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def tokenize_rows(rows: list[dict], tok: Any, seq_len: int) -> tuple[dict, int]:
    """Fixed-length, right-padded tensors {input_ids, attention_mask, loss_mask} and the truncated count."""
    import torch

    n = len(rows)
    ids = torch.full((n, seq_len), tok.pad_token_id, dtype=torch.long)
    attn = torch.zeros((n, seq_len), dtype=torch.bool)
    loss = torch.zeros((n, seq_len), dtype=torch.bool)
    truncated = 0
    for r, row in enumerate(rows):
        t, m, cut = tokenize_row(row, tok, seq_len)
        ids[r, : len(t)] = torch.tensor(t)
        attn[r, : len(t)] = True
        loss[r, : len(m)] = torch.tensor(m, dtype=torch.bool)
        truncated += cut
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}, truncated


def split_heldout(rows: list[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """A seeded shuffle; the first round(n * fraction) rows (at least 1 when fraction > 0 and n > 1) are held out."""
    order = list(rows)
    random.Random(seed).shuffle(order)
    k = round(len(order) * fraction)
    if fraction > 0 and len(order) > 1:
        k = min(max(k, 1), len(order) - 1)
    return order[k:], order[:k]


def load_source(src: Any, ctx: StageContext, skips: Counter, target: Any) -> list[dict]:
    if src.kind == "hf":
        try:
            import datasets

            ds = datasets.load_dataset(src.path, split=src.split)
        except Exception as e:  # datasets raises many kinds (network, missing split, bad name)
            raise DataError(f"cannot load HF dataset '{src.path}' split '{src.split}': {e.__class__.__name__}: {str(e)[:160]}",
                            "it needs a network; or export it to JSONL and use kind: jsonl") from None
        rows = [dict(r) for r in (ds.select(range(min(src.limit, len(ds)))) if src.limit else ds)]
        return conversations_from_rows(rows, src.path, skips)
    path = ctx.cfg.resolve_path(src.path)
    if src.kind == "text":
        lines = [ln for ln in _read_lines(path) if ln.strip()][: src.limit]
        return [text_row(ln, f"{path.stem}:{i}") for i, ln in enumerate(lines)]
    if src.kind == "jsonl":
        return conversations_from_rows(read_jsonl(path, skips)[: src.limit], path.stem, skips)
    prompts = read_prompts(path, skips)[: src.limit]
    if not prompts:
        raise DataError(f"prompt file '{path}' has no usable prompt", "one JSON object per line with a 'prompt' field")
    model, tok = target()
    ctx.log(f"regenerating answers to {len(prompts)} prompts with the target ({ctx.cfg.data.max_new_tokens} new tokens max)")
    key = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    return regenerate(prompts, model, tok, ctx.work / f"answers-{key}.jsonl", ctx.cfg.data, ctx.log)


def run(ctx: StageContext) -> dict:
    import torch

    from trtspec.models import load_tokenizer, resolve_model

    path = resolve_model(ctx.cfg.model.source)
    tok = load_tokenizer(path)
    if not tok.chat_template:
        raise DataError(f"the tokenizer in '{path}' has no chat template", "use an instruct/chat model, or a text source only")
    loaded: dict[str, Any] = {}

    def target():
        if "model" not in loaded:
            loaded["model"] = load_answering_model(path, ctx.cfg)
        return loaded["model"], tok

    skips: Counter = Counter()
    rows: list[dict] = []
    for src in ctx.cfg.data.sources:
        got = load_source(src, ctx, skips, target)
        ctx.log(f"{src.kind} '{src.path}': {len(got)} conversations")
        rows += got
    if skips:
        ctx.log("skipped: " + ", ".join(f"{n} {why}" for why, n in skips.items()))
    if not rows:
        raise DataError("the data sources gave no usable conversation", "check data.sources (each row needs an assistant turn)")
    train, heldout = split_heldout(rows, ctx.cfg.data.holdout_fraction, ctx.cfg.seed)
    seq_len = ctx.cfg.data.seq_len
    metrics: dict[str, Any] = {"train_rows": len(train), "heldout_rows": len(heldout), "skipped": dict(skips)}
    for name, split in (("train", train), ("heldout", heldout)):
        (ctx.out / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in split), encoding="utf-8")
        tensors, truncated = tokenize_rows(split, tok, seq_len)
        torch.save(tensors, ctx.out / f"{name}_tokens.pt")
        metrics[f"{name}_truncated"] = truncated
        metrics[f"{name}_label_tokens"] = int(tensors["loss_mask"].sum())
        if truncated:
            ctx.log(f"{truncated} of {len(split)} {name} conversations truncated to data.seq_len={seq_len}")
    metrics["categories"] = dict(Counter(r["category"] for r in rows))
    metrics["headline"] = (
        f"{len(train)} train + {len(heldout)} held-out conversations, {metrics['train_label_tokens']} label tokens"
        + (f", {sum(skips.values())} skipped" if skips else "")
        + (f", {metrics['train_truncated'] + metrics['heldout_truncated']} truncated" if metrics["train_truncated"] + metrics["heldout_truncated"] else "")
    )
    return metrics
