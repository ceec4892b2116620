"""Each run's trained draft on each run's held-out rows, the states of every row from the target's HF forward, in one
process: whether two runs' held-out AL differ by their drafts or by their rows.

    python scripts/bench_heads_cross.py runs/demo runs/demo-streamed

A run whose train stage answered its held-out prompts with an engine (train.states_from: vllm) measures on the
engine's greedy answers, which in bf16 leave HF's after a few dozen tokens on most prompts: the two runs' own figures
are then on different rows. Here every draft is measured on every run's rows (RUN/train/eval_seqs.pt). The runs share
one target and draft method (EAGLE-3 family, its draft length from the first run's train stage).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trtspec.errors import run_main


def main() -> None:
    import torch

    from trtspec.bench import model_source, verified
    from trtspec.draft_families import family
    from trtspec.models import load_model, matmul_attention_on_cpu
    from trtspec.training.acceptance import evaluate_acceptance, with_states

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+", help="run directories whose train stage is done, of one target")
    a = ap.parse_args()
    trained = {run: verified(run, "train") for run in a.runs}
    first = trained[a.runs[0]][1]["config"]
    fam, k = family(first["draft.method"]), first["draft.length"]
    cfg = fam.read_config(verified(a.runs[0], "convert")[0])
    fam.set_length(cfg, k)
    dtype = verified(a.runs[0], "data")[1]["config"]["model"].get("dtype", "auto")  # as the train stage loaded it
    base = load_model(model_source(a.runs[0]), dtype)
    base.config.num_orig_hidden_layers = base.config.num_hidden_layers
    with matmul_attention_on_cpu(base):
        rows = {run: with_states(base, torch.load(folder / "eval_seqs.pt", weights_only=True), fam.state_layers(cfg))
                for run, (folder, _) in trained.items()}
    model = fam.build(base, cfg)
    print(f"{'draft of':28} {'rows of':28} AL@{k} (95% CI)")
    for run, (folder, _) in trained.items():
        fam.load_head(model, folder / fam.head_file)
        for rows_of, rows_set in rows.items():
            acc = evaluate_acceptance(model, rows_set, k, fam.drafts)
            lo, hi = acc[f"AL@{k}_ci95"]
            print(f"{str(run):28} {str(rows_of):28} {acc[f'AL@{k}']:.3f} ({lo:.3f}-{hi:.3f})", flush=True)


if __name__ == "__main__":
    run_main(main)
