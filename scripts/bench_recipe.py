"""Compare head-training recipes on one data stage, side by side in one run: held-out AL, per-position acceptance,
training time. This is how to measure which knob matters (lr, epochs, batch size, TTT steps, data volume).

    python scripts/bench_recipe.py build_configs/smollm2-135m-eagle3.yaml --out runs/abl \\
        --recipe base: --recipe lr3e-3:train.lr=3e-3 --recipe half-data:train.max_rows=700

A recipe is NAME:KEY=VALUE[,KEY=VALUE...] (config overrides, as `trtspec build --set`). Every recipe reuses the run's
data and convert stages and the target's hidden states (computed once, by the first recipe that needs them), so
each one costs its training alone. The run's train/ folder ends as the last recipe's; each recipe's metrics and
training log are kept in OUT/recipes/NAME.json, a finished recipe is not trained again, and --plot draws the
held-out AL@3 of every recipe over its training (with train.eval_steps set).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trtspec.bench import arg_parser, print_table, save_figure, train_recipe
from trtspec.errors import run_main


def parse_recipe(text: str) -> tuple[str, list[str]]:
    name, _, sets = text.partition(":")
    if not name or "/" in name:
        sys.exit(f"Error: recipe '{text}' needs a name: NAME:KEY=VALUE[,KEY=VALUE...]")
    return name, [s for s in sets.split(",") if s]


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        if r["evals"]:
            ax.plot([e["epoch"] for e in r["evals"]], [e["AL@3"] for e in r["evals"]], marker="o", label=r["name"])
    ax.set_xlabel("epoch")
    ax.set_ylabel("held-out AL@3")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("config")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--recipe", action="append", required=True, help="NAME:KEY=VALUE[,KEY=VALUE...]")
    ap.add_argument("--set", action="append", default=[], dest="overrides", help="applied to every recipe")
    ap.add_argument("--plot", action="store_true", help="write OUT/recipes/al_curve.png")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args()
    rows = [train_recipe(args.config, args.overrides, args.out, *parse_recipe(r)) for r in args.recipe]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print_table(rows)
    if args.plot:
        plot(rows, args.out / "recipes" / "al_curve.png")


if __name__ == "__main__":
    run_main(main)
