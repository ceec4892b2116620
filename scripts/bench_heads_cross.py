"""Each run's trained draft on each run's held-out rows, the states of every row from the target's HF forward, in one
process: whether two runs' held-out AL differ by their drafts or by their rows; with --suite, every draft on prompts
no run trained on too, per category, beside its own held-out AL.

    python scripts/bench_heads_cross.py runs/demo runs/demo-streamed
    python scripts/bench_heads_cross.py runs/demo runs/two-layers --suite build_configs/prompts/unseen_prompts.jsonl

A run whose train stage answered its held-out prompts with an engine (train.states_from: vllm) measures on the
engine's greedy answers, which in bf16 leave HF's after a few dozen tokens on most prompts: the two runs' own figures
are then on different rows. Here every draft is measured on every run's rows (RUN/train/eval_seqs.pt) and on the
target's greedy answers to the suite's prompts (data.max_new_tokens of the first run), teacher-forced as the train
stage measures (training.acceptance), so a draft no engine loads (a head of two layers) is measured too; and each
draft's own held-out AL split between the prompts with a near-twin among those it trained on and the rest
(chat.near_twins). The runs share one target, draft method and length; each draft keeps its own shape (its convert
stage's config).
"""

from __future__ import annotations

import json
from pathlib import Path

from trtspec.bench import arg_parser
from trtspec.errors import DataError, run_main


def shared(trained: dict, key: str) -> object:
    """A config key every run's train stage agrees on, or one line naming the runs that differ."""
    values = {run: manifest["config"][key] for run, (_, manifest) in trained.items()}
    if len(set(map(str, values.values()))) > 1:
        raise DataError(f"the runs differ in {key} ({', '.join(f'{r}: {v}' for r, v in values.items())})",
                        "compare drafts of one method and length")
    return next(iter(values.values()))


def main() -> None:
    import torch

    from trtspec.bench import model_source, suite_rows, verified
    from trtspec.chat import held_out_twins
    from trtspec.draft_families import family
    from trtspec.models import load_model, load_tokenizer, matmul_attention_on_cpu
    from trtspec.training.acceptance import (
        EVAL_BATCH,  # the suite answered in batches as the train stage answers it
        evaluate_acceptance,
        greedy_answers,
        split_by_twins,
        with_states,
    )

    ap = arg_parser(__doc__)
    ap.add_argument("runs", type=Path, nargs="+", help="run directories whose train stage is done, of one target")
    ap.add_argument("--suite", type=Path, help="a JSONL file of {prompt or messages, category} rows no run trained on")
    ap.add_argument("--json", action="store_true", help="print the measurements as one JSON object instead")
    a = ap.parse_args()
    trained = {run: verified(run, "train") for run in a.runs}
    fam, k = family(shared(trained, "draft.method")), shared(trained, "draft.length")
    sources = {str(model_source(run)) for run in a.runs}
    if len(sources) > 1:
        raise DataError(f"the runs' targets differ ({', '.join(sorted(sources))})", "compare drafts of one target")
    data = verified(a.runs[0], "data")[1]["config"]
    dtype = data["model"].get("dtype", "auto")  # as the train stage loaded it

    def fresh_base():
        base = load_model(model_source(a.runs[0]), dtype)
        base.config.num_orig_hidden_layers = base.config.num_hidden_layers
        return base

    shapes = {}
    for run in a.runs:
        shapes[run] = fam.read_config(verified(run, "convert")[0])
        fam.set_length(shapes[run], k)
    base = fresh_base()  # the target as it is: answers and states (a converted copy holds each draft)
    answers = {str(run): torch.load(folder / "eval_seqs.pt", weights_only=True) for run, (folder, _) in trained.items()}
    if a.suite:
        with matmul_attention_on_cpu(base):
            answers[str(a.suite)] = greedy_answers(base, load_tokenizer(model_source(a.runs[0])), suite_rows(a.suite),
                                                   data["data"]["max_new_tokens"], EVAL_BATCH)
    layers = {run: tuple(fam.state_layers(shape)) for run, shape in shapes.items()}
    with matmul_attention_on_cpu(base):  # every set's states before any draft is attached to a target
        states = {(rows_of, read): with_states(base, seqs, list(read))
                  for rows_of, seqs in answers.items() for read in set(layers.values())}
    del base
    results = []
    if not a.json:
        print(f"{'draft of':28} {'rows of':28} AL@{k} (95% CI)")
    for run, (folder, manifest) in trained.items():
        model = fam.build(fresh_base(), shapes[run])
        fam.load_head(model, folder / fam.head_file)
        for rows_of in answers:
            acc = evaluate_acceptance(model, states[rows_of, layers[run]], k, fam.drafts)
            results.append({"draft_of": str(run), "rows_of": rows_of, f"AL@{k}": acc[f"AL@{k}"],
                            f"AL@{k}_ci95": acc[f"AL@{k}_ci95"], "per_category": acc["per_category"],
                            "trained_held_out": manifest["metrics"][f"AL@{k}"]})
            if rows_of == str(run):  # its own held-out rows, by near-twins among the prompts it trained on
                results[-1]["held_out_twins"] = split_by_twins(acc, held_out_twins(
                    verified(run, "data")[0], manifest["config"]["eval.acceptance_prompts"], manifest["config"]["train"].get("max_rows")), k)
            if not a.json:
                lo, hi = acc[f"AL@{k}_ci95"]
                print(f"{str(run):28} {rows_of:28} {acc[f'AL@{k}']:.3f} ({lo:.3f}-{hi:.3f})", flush=True)
        del model
    if a.suite and not a.json:
        print_suite_table(results, str(a.suite), k)
    if a.json:
        print(json.dumps({"draft_length": k, "results": results}, indent=1))


def print_suite_table(results: list[dict], suite: str, k: int) -> None:
    """Per suite category, each draft's AL@k; then its whole-suite AL against its own held-out AL."""
    rows = [r for r in results if r["rows_of"] == suite]
    cats = sorted({c for r in rows for c in r["per_category"]})
    print(f"\n{suite}, AL@{k} per category:")
    print(f"{'category':16}" + "".join(f" {r['draft_of']:>22}" for r in rows))
    for c in cats:
        print(f"{c:16}" + "".join(f" {r['per_category'][c][f'AL@{k}']:>22.3f}" for r in rows))
    print(f"{'all':16}" + "".join(f" {r[f'AL@{k}']:>22.3f}" for r in rows))
    own = {r["draft_of"]: r[f"AL@{k}"] for r in results if r["rows_of"] == r["draft_of"]}
    print(f"{'own held-out':16}" + "".join(f" {own[r['draft_of']]:>22.3f}" for r in rows))
    print(f"{'suite / own':16}" + "".join(f" {r[f'AL@{k}'] / own[r['draft_of']]:>22.3f}" for r in rows))
    twins = {r["draft_of"]: r["held_out_twins"] for r in results if "held_out_twins" in r}
    for part, name in (("with_twin", "own, twin"), ("without_twin", "own, no twin")):
        print(f"{name:16}" + "".join(f" {cell(twins[r['draft_of']][part], k):>22}" for r in rows))


def cell(part: dict | None, k: int) -> str:
    """AL@k on n prompts, or '-' for no prompt."""
    return f"{part[f'AL@{k}']:.3f} on {part['prompts']}" if part else "-"


if __name__ == "__main__":
    run_main(main)
