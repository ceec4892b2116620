"""How well a draft drafts for its target, whatever its family: acceptance of greedy drafts, simulated exactly on the
target's own greedy answers (teacher-forced, every draft position at once, by the family's DraftFamily.drafts), with a
bootstrap interval over prompts."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from trtspec.chat import at_context, encode_row, prompt_rows
from trtspec.generation import hf_greedy
from trtspec.runtime.decode import al_interval
from trtspec.training.states import base_states, row_lengths


def greedy_acceptance(drafts: Any, seq: Any, start: int, k: int) -> tuple[int, int, list[int]]:
    """Simulate greedy speculative decoding with chain drafts of length k over the target's greedy output `seq`.

    `seq[start]` is the first generated token (from the prefill). A verification step at accepted length q
    (tokens 0..q known, target states for 0..q-1) drafts seq[q+1..q+k] from position j=q-1, accepts the
    longest matching prefix a, and yields 1 + a tokens (the target's own token comes free).
    Returns (tokens, target forwards, accepted count per draft position)."""
    n = len(seq)
    q, tokens, forwards = start, 0, 0
    per_pos = [0] * k
    while q + 1 < n:
        a = 0
        while a < k and q + 1 + a < n and int(drafts[q - 1, a]) == int(seq[q + 1 + a]):
            per_pos[a] += 1
            a += 1
        tokens += min(1 + a, n - 1 - q)  # the last step's bonus token may lie past the known answer
        forwards += 1
        q += 1 + a
    return tokens, forwards, per_pos


def evaluate_acceptance(model: Any, eval_set: list[dict], k_max: int, drafts_fn: Any) -> dict:
    """AL (tokens per target forward) for chain drafts of length 1..k_max with its 95% bootstrap interval over the
    prompts, and per-position acceptance at k_max. `drafts_fn`: the family's drafts from every position
    (DraftFamily.drafts)."""
    per_prompt: dict[int, list[tuple[int, int]]] = {k: [] for k in range(1, k_max + 1)}
    per_pos = [0] * k_max
    was_training = model.training
    model.eval()
    for ex in eval_set:
        ids = ex["input_ids"][None]
        drafts = drafts_fn(model, ids, ex["aux"][None], ex["last"][None], k_max)[0]
        for k in per_prompt:
            tok, fwd, pos = greedy_acceptance(drafts, ex["input_ids"], ex["start"], k)
            per_prompt[k].append((tok, fwd))
            if k == k_max:
                per_pos = [a + b for a, b in zip(per_pos, pos, strict=True)]
    model.train(was_training)
    steps = sum(f for _, f in per_prompt[k_max])  # verification steps at k_max
    out: dict[str, Any] = {}
    for k, counts in per_prompt.items():
        out[f"AL@{k}"] = round(sum(t for t, _ in counts) / max(sum(f for _, f in counts), 1), 3)
        out[f"AL@{k}_ci95"] = al_interval(counts) if counts else None
    # per category of the prompts (their `category`), at k_max: AL and its interval over that category's prompts
    groups: dict[str, list[tuple[int, int]]] = {}
    for ex, counts in zip(eval_set, per_prompt[k_max], strict=True):
        groups.setdefault(ex.get("category", "chat"), []).append(counts)
    out["per_category"] = {c: pooled(v, k_max) for c, v in sorted(groups.items())}
    # (tokens, forwards) and category of each prompt at k_max: two drafts compared prompt by prompt
    out["per_prompt"], out["categories"] = per_prompt[k_max], [ex.get("category", "chat") for ex in eval_set]
    # acceptance of draft position i = share of verification steps whose first i+1 drafts were all accepted
    return {**out, "accept_rate_by_position": [round(a / max(steps, 1), 3) for a in per_pos]}


def pooled(per_prompt: list[tuple[int, int]], k: int) -> dict:
    """AL@k of some prompts' (tokens, forwards) pooled (sum over sum), with its 95% bootstrap interval over them."""
    return {"prompts": len(per_prompt), f"AL@{k}": round(sum(t for t, _ in per_prompt) / max(sum(f for _, f in per_prompt), 1), 3),
            f"AL@{k}_ci95": al_interval(per_prompt)}


def split_by_twins(acc: dict, twins: list[bool], k: int) -> dict:
    """An evaluate_acceptance result split by which prompts have a near-twin among the training prompts (chat.
    near_twins): AL@k with interval of each part (None where a part is empty)."""
    parts = {"with_twin": [c for c, t in zip(acc["per_prompt"], twins, strict=True) if t],
             "without_twin": [c for c, t in zip(acc["per_prompt"], twins, strict=True) if not t]}
    return {name: pooled(counts, k) if counts else None for name, counts in parts.items()}


def greedy_answers(base: Any, tok: Any, rows: list[dict], max_new_tokens: int, batch_size: int = 16) -> list[dict]:
    """The target's greedy answers to prompt rows (their messages are the turns before the answer), batched, as
    {input_ids: prompt + answer, start, category}."""
    import torch

    out = []
    for i in range(0, len(rows), batch_size):
        prompts = [encode_row(tok, r) for r in rows[i : i + batch_size]]
        answers = hf_greedy(base, prompts, max_new_tokens, {tok.eos_token_id}, tok.pad_token_id)
        out += [{"input_ids": torch.tensor(p + a), "start": len(p), "category": str(r.get("category", "chat"))}
                for p, a, r in zip(prompts, answers, rows[i : i + batch_size], strict=True)]
    return out


EVAL_BATCH = 64  # prompts answered at once by the target when an acceptance set is built (the train stage's)
EVAL_SEQS = "eval_seqs.pt"  # the unquantized target's greedy answers to the first eval.acceptance_prompts held-out prompts


def build_eval_set(base: Any, tok: Any, rows: list[dict], aux_layers: list[int], max_new_tokens: int, cache: Path, log: Any,
                   batch_size: int = 16, engine: Any = None) -> list[dict]:
    """The target's greedy answers to prompt rows {id, category, messages: the turns before the answer} (chat.
    prompt_rows), with their hidden states (the answers cached in `cache`). engine: answers and states from the
    engine that serves the target (EngineTarget), not from `base`."""
    import torch

    seqs = torch.load(cache, weights_only=True) if cache.is_file() else None
    if seqs is not None and not answers_to(seqs, tok, rows):
        log(f"'{cache.name}' holds answers to prompts that now render otherwise: answering them again")
        seqs = None
    if seqs is None:
        log(f"generating greedy target answers for {len(rows)} prompts (acceptance evaluation)")
        answer = engine.greedy_answers if engine is not None else partial(greedy_answers, base)
        seqs = answer(tok, rows, max_new_tokens, batch_size)
        torch.save(seqs, cache)
    return engine.with_states(seqs) if engine is not None else with_states(base, seqs, aux_layers)


def answers_to(seqs: list[dict], tok: Any, rows: list[dict]) -> bool:
    """Whether cached answers `seqs` answer `rows` as they render now, prompt ids and category: the cache's key holds
    the target, the data and the template, not the code that renders a row (chat.encode_row), which a newer trtspec
    may change (a tool's form)."""
    return len(seqs) == len(rows) and all(
        s["input_ids"][: int(s["start"])].tolist() == encode_row(tok, r) and s.get("category", "chat") == str(r.get("category", "chat"))
        for s, r in zip(seqs, rows, strict=True))


def context_eval_sets(base: Any, tok: Any, prompts: list[dict], fill: list, bins: list[int],
                      aux_layers: list[int], max_new_tokens: int, log: Any, batch_size: int = 16,
                      engine: Any = None) -> list[dict]:
    """Acceptance sets by context length: the prompts after earlier conversations or documents (`fill`:
    chat.at_context, as validate's context curve builds them) filling each bin, the target's greedy answers and
    states -> [{bin, context_tokens (mean), set}]. engine: as build_eval_set's."""
    answer = engine.greedy_answers if engine is not None else partial(greedy_answers, base)
    out = []
    for b in bins:
        rows = at_context(prompts, fill, tok, b)
        log(f"generating greedy target answers for {len(rows)} held-out prompts at {b} tokens of context")
        seqs = answer(tok, [r for r, _ in rows], max_new_tokens, batch_size)
        out.append({"bin": b, "context_tokens": round(sum(n for _, n in rows) / len(rows)),
                    "set": engine.with_states(seqs) if engine is not None else with_states(base, seqs, aux_layers)})
    return out


def context_acceptance(model: Any, sets: list[dict], k: int, drafts_fn: Any) -> list[dict]:
    """AL@k per context_eval_sets bin, with its interval and per-position acceptance, and its ratio to the first
    (shortest) bin's AL."""
    rows = []
    for s in sets:
        acc = evaluate_acceptance(model, s["set"], k, drafts_fn)
        rows.append({"bin": s["bin"], "context_tokens": s["context_tokens"], "prompts": len(s["set"]),
                     f"AL@{k}": acc[f"AL@{k}"], f"AL@{k}_ci95": acc[f"AL@{k}_ci95"],
                     "accept_rate_by_position": acc["accept_rate_by_position"]})
        rows[-1]["vs_shortest"] = round(rows[-1][f"AL@{k}"] / max(rows[0][f"AL@{k}"], 1e-9), 3)
    return rows


def with_states(base: Any, seqs: list[dict], aux_layers: list[int]) -> list[dict]:
    """Acceptance-set entries {input_ids, start, aux, last}: each sequence's target states from a forward of its own."""
    import torch

    out = []
    for s in seqs:
        ids = s["input_ids"].to(next(base.parameters()).device)[None]
        aux, last = base_states(base, ids, torch.ones_like(ids), aux_layers)
        out.append({"input_ids": ids[0], "start": int(s["start"]), "aux": aux[0], "last": last[0],
                    "category": s.get("category", "chat")})
    return out


def training_rows_set(tokens: dict, states: Any, base: Any, aux_layers: list[int], n: int) -> list[dict]:
    """The first n training rows as an acceptance set, with the states the head trained on (the offline cache, else
    a target forward): how well the head fits what it learned from. Against the held-out AL this tells a head
    short of data (fits, does not generalise) from one short of capacity or training (does not even fit).
    A row is a greedy answer of the target only when the data stage regenerated it; other rows measure the head
    against the data's own tokens."""
    import torch

    picked = []  # (row, its length, its first label)
    for i, length in enumerate(row_lengths(tokens)):
        labels = tokens["loss_mask"][i, :length].nonzero()
        if len(labels):
            picked.append((i, length, int(labels[0])))
        if len(picked) == n:
            break
    seqs = [{"input_ids": tokens["input_ids"][i, :length], "start": start} for i, length, start in picked]
    if states is None:
        return with_states(base, seqs, aux_layers)
    device = next(base.parameters()).device
    got = states.rows([(i, length) for i, length, _ in picked])
    return [{"input_ids": s["input_ids"].to(device), "start": s["start"],
             **{k: torch.from_numpy(v.astype("float32")).to(device) for k, v in zip(("aux", "last"), row, strict=True)}}
            for s, row in zip(seqs, got, strict=True)]


def acceptance_by_target(draft_model: Any, targets: dict[str, tuple[Any, Path | None]], tok: Any, rows: list[dict],
                         max_new_tokens: int, scratch: Path, k: int, log: Any, aux_layers: list[int],
                         drafts_fn: Any) -> dict[str, float]:
    """AL@k of a trained draft with each target: targets[name] = (load, answers), where load() loads the target
    and `answers` is a file of its greedy answers written before (None, or missing: generated here, into scratch).
    aux_layers, drafts_fn: the target layers the draft reads and its drafts (DraftFamily.state_layers, .drafts).

    Each target writes its own greedy answers to the same held-out prompts `rows` (the train stage's evaluation),
    and the head drafts from that target's hidden states (the train stage's exact greedy simulation): AL = tokens
    per target forward (1 = the draft never helps).
    """
    out = {}
    for name, (load, answers) in targets.items():
        base = load()  # one target in memory at a time
        log(f"acceptance with the {name} target ({len(rows)} held-out prompts)")
        cache = answers if answers and answers.is_file() else scratch / f"eval_{name}.pt"
        eval_set = build_eval_set(base, tok, prompt_rows(rows), aux_layers, max_new_tokens, cache, log)
        out[name] = evaluate_acceptance(draft_model, eval_set, k, drafts_fn)[f"AL@{k}"]
        del base, eval_set
    return out
