#!/usr/bin/env python
"""Why a draft accepts less on prompts of yours than on its run's held-out prompts: is your traffic harder for the
target, or does the draft not generalise to it?

Each prompt of both sets is decoded greedily with the draft (k = the bundle's draft length); at every speculative step
the target's own probability of the token the first draft guess had to hit is read from an HF forward over the answer.
Steps are binned by that probability (how predictable the token was for the target itself), and per bin both sets
report their share of steps, how often the first guess was accepted, AL, and how many of those tokens the draft's
vocabulary holds. Weighting the held-out AL of each bin by the suite's shares predicts the suite's AL had the draft
done there what it does held out at the same confidence; so

    suite AL / held-out AL = (predicted / held-out: the traffic's difficulty) x (suite AL / predicted: generalisation)

    python scripts/bench_generalisation.py runs/demo --suite build_configs/prompts/unseen_prompts.jsonl
    python scripts/bench_generalisation.py runs/demo --suite my_traffic.jsonl --prompts 32 --max-new-tokens 64 --json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtspec.bench import add_runtime_flags, arg_parser, count
from trtspec.errors import run_main

BINS = (0.0, 0.5, 0.8, 0.95, 0.99)  # lower edges of the target-probability bins; the last runs to 1


def step_records(accepted: list[int], answer: list[int], token_p: list[float], in_vocab: list[bool]) -> list[tuple]:
    """One (target p, first guess accepted, tokens accepted, in draft vocab) per speculative step of a greedy answer.

    answer[0] comes from the prefill; the step that accepts a_i of its guesses yields 1 + a_i tokens, so step i's
    first guess aims at answer position 1 + sum_{j<i} (1 + a_j). token_p[t]: the target's probability of answer[t]."""
    out, pos = [], 1
    for a in accepted:
        if pos >= len(answer):
            break
        out.append((token_p[pos], a >= 1, a, in_vocab[pos]))
        pos += 1 + a
    return out


def bin_of(p: float) -> int:
    return max(i for i, edge in enumerate(BINS) if p >= edge)


def means(records: list[tuple]) -> dict:
    """First-guess acceptance, AL (1 + accepted per step) and the share in the draft vocab over records."""
    n = max(len(records), 1)
    return {"first_accepted": round(sum(r[1] for r in records) / n, 3), "AL": round(1 + sum(r[2] for r in records) / n, 3),
            "in_draft_vocab": round(sum(r[3] for r in records) / n, 3)}


def by_confidence(records: list[tuple]) -> list[dict]:
    """Per BINS bin: the share of the steps, and their means."""
    rows = []
    for i, edge in enumerate(BINS):
        b = [r for r in records if bin_of(r[0]) == i]
        rows.append({"from": edge, "to": BINS[i + 1] if i + 1 < len(BINS) else 1.0, "steps": len(b),
                     "share": round(len(b) / max(len(records), 1), 3), **means(b)})
    return rows


def predicted_al(held: dict, suite: list[dict]) -> float:
    """The suite's AL had each of its steps been accepted as held-out steps of the same target confidence are:
    sum over bins of suite share x held-out AL (a bin with no held-out step counts at the held-out AL overall).
    held: a summary; suite: its by_confidence bins."""
    bins = held["by_confidence"]
    return round(sum(s["share"] * (h["AL"] if h["steps"] else held["AL"]) for h, s in zip(bins, suite, strict=True)), 3)


def summary(records: list[tuple]) -> dict:
    return {"steps": len(records), **means(records), "mean_target_p": round(sum(r[0] for r in records) / max(len(records), 1), 3),
            "by_confidence": by_confidence(records)}


def decompose(held: dict, suite: dict) -> dict:
    """suite AL / held-out AL split into the traffic's difficulty and the draft's generalisation (their product)."""
    pred = predicted_al(held, suite["by_confidence"])
    return {"ratio": round(suite["AL"] / held["AL"], 3), "predicted_AL": pred, "difficulty": round(pred / held["AL"], 3),
            "generalisation": round(suite["AL"] / pred, 3)}


def per_category(held: dict, records: list[tuple]) -> dict[str, dict]:
    """decompose for each category of the suite (records tagged with their prompt's category, the fifth field)
    against the whole held-out set."""
    out = {}
    for c in sorted({r[4] for r in records}):
        mine = summary([r for r in records if r[4] == c])
        out[c] = {"steps": mine["steps"], "AL": mine["AL"], "in_draft_vocab": mine["in_draft_vocab"], **decompose(held, mine)}
    return out


def measure(bundle: Any, target: Any, head: Any, scorer: Any, rows: list[dict], new: int) -> tuple[list[tuple], dict]:
    """Step records over rows' greedy answers with the draft, with how many answers equal the runtime's without it
    and the share of answer tokens that are the scorer's own argmax (the HF forward read at the right positions)."""
    import torch

    from trtspec.chat import encode_row
    from trtspec.runtime import DraftSpec, generate, speculative_decode

    spec, records, identical, argmax, tokens = DraftSpec(shape="chain", k=bundle.draft_length), [], 0, 0, 0
    in_vocab = getattr(head, "drafts_token", lambda t: True)  # DFlash drafts from the target's whole vocabulary
    for r in rows:
        p = torch.tensor(encode_row(bundle.tok, r))
        g = speculative_decode(target, head, p, new, spec, bundle.eos)
        identical += g.tokens == generate(target, p, new, bundle.eos).tokens
        with torch.no_grad():
            logits = scorer(torch.tensor([p.tolist() + g.tokens])).logits[0, len(p) - 1 : len(p) - 1 + len(g.tokens)]
        answer = torch.tensor(g.tokens)
        token_p = logits.float().softmax(-1).gather(-1, answer[:, None])[:, 0].tolist()
        argmax, tokens = argmax + int((logits.argmax(-1) == answer).sum()), tokens + len(answer)
        records += [(*x, r.get("category", "chat")) for x in step_records(g.stats.accepted, g.tokens, token_p, [in_vocab(t) for t in g.tokens])]
    return records, {"identical": identical, "scorer_argmax_agrees": round(argmax / max(tokens, 1), 3)}


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--suite", type=Path, required=True, help="a JSONL suite (prompt or messages, category): your traffic")
    ap.add_argument("--prompts", type=count, default=64,
                    help="prompts of each set at most (the suite's spread over its categories)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    add_runtime_flags(ap)
    a = ap.parse_args()

    from trtspec.bench import load_prompt_rows, open_bundle, runtime_settings, suite_rows
    from trtspec.runtime.hf_target import load_hf_target

    bundle = open_bundle(a.run_dir)
    target, head = bundle.runtime(settings=runtime_settings(a))
    scorer = load_hf_target(bundle.path / "target")[0].model  # float32 HF, a quantized target's weights dequantized
    sets = {"heldout": load_prompt_rows(a.run_dir, a.prompts), "suite": suite_rows(a.suite, a.prompts)}
    result: dict[str, Any] = {"run": str(a.run_dir), "suite_file": str(a.suite), "k": bundle.draft_length, "max_new_tokens": a.max_new_tokens}
    records = {}
    for name, rows in sets.items():
        records[name], checks = measure(bundle, target, head, scorer, rows, a.max_new_tokens)
        result[name] = {"prompts": len(rows), **checks, **summary(records[name])}
    result.update(decompose(result["heldout"], result["suite"]))
    result["suite"]["per_category"] = per_category(result["heldout"], records["suite"])
    if a.json:
        print(json.dumps(result))
        return
    h, s = result["heldout"], result["suite"]
    print(f"k={result['k']}, {a.max_new_tokens} new tokens; greedy identical without the draft: held-out {h['identical']}/"
          f"{h['prompts']}, suite {s['identical']}/{s['prompts']}; answer tokens the HF forward's argmax: "
          f"{h['scorer_argmax_agrees']:.3f} / {s['scorer_argmax_agrees']:.3f}")
    print(f"AL held-out {h['AL']:.2f} ({h['steps']} steps), suite {s['AL']:.2f} ({s['steps']} steps): {result['ratio']:.2f}x")
    print(f"  the target's probability of the first guess's token: mean {h['mean_target_p']:.3f} held-out, "
          f"{s['mean_target_p']:.3f} suite; in the draft's vocabulary {h['in_draft_vocab']:.3f} / {s['in_draft_vocab']:.3f}")
    print(f"  drafting on the suite as held out at each confidence would give AL {result['predicted_AL']:.2f}: the traffic's "
          f"difficulty {result['difficulty']:.2f}x, the draft's generalisation {result['generalisation']:.2f}x")
    print(f"{'target p':>10} | {'held-out: share':>15} {'1st acc':>7} {'AL':>5} {'in vocab':>8} | "
          f"{'suite: share':>12} {'1st acc':>7} {'AL':>5} {'in vocab':>8}")
    for hb, sb in zip(h["by_confidence"], s["by_confidence"], strict=True):
        print(f"{hb['from']:.2f}-{hb['to']:.2f} | {hb['share']:15.3f} {hb['first_accepted']:7.3f} {hb['AL']:5.2f} "
              f"{hb['in_draft_vocab']:8.3f} | {sb['share']:12.3f} {sb['first_accepted']:7.3f} {sb['AL']:5.2f} {sb['in_draft_vocab']:8.3f}")
    print(f"{'suite category':<16} {'steps':>5} {'AL':>5} {'ratio':>5} {'difficulty':>10} {'generalisation':>14} {'in vocab':>8}")
    for c, v in s["per_category"].items():
        print(f"{c:<16} {v['steps']:>5} {v['AL']:5.2f} {v['ratio']:5.2f} {v['difficulty']:10.2f} {v['generalisation']:14.2f} "
              f"{v['in_draft_vocab']:8.3f}")


if __name__ == "__main__":
    run_main(main)
