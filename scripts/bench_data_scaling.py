"""Held-out acceptance against the volume of training data (side by side in one run), and what a target AL would cost.

The trend through the sizes measured, priced at this machine's own speed.

    python scripts/bench_data_scaling.py build_configs/smollm2-135m-eagle3.yaml --out runs/scaling --target-al 3.0 --plot

Trains the head on all of the run's training rows and on the first 1/2, 1/4 and 1/8 of them (`train.max_rows`:
the same recipe, data order and held-out prompts otherwise). It trains as scripts/bench_recipe.py does (trtspec.bench.train_recipe): the data and convert
stages and the target's hidden states are computed once, a finished size is read back, and the run's own train
stage serves as the full-size point when it matches. Each size is measured twice: held-out AL@3 (what serving sees)
and AL@3 on training rows (how well the head fits what it saw: see the train stage's `fit` metric).

It fits AL@3 = a + b * log2(rows) to the held-out points and extrapolates the rows that would reach --target-al,
then prices them at this run's own per-row costs: regenerating an answer (data stage), the target's hidden states,
and training (per epoch, at the recipe's epochs). It also turns it around: the rows that --budget-min minutes of
this machine can answer, cache and train on, and the gain per doubling of the data that reaching --target-al within
that budget would take, to hold against the gains measured (which need no trend to be read).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from trtspec.bench import arg_parser, print_table, save_figure, train_recipe, verified
from trtspec.errors import run_main

K = 3  # chain drafts of 3, the and the engine's default


def fit_log2(rows: list[int], al: list[float]) -> tuple[float, float]:
    """Least squares of al = a + b * log2(rows) -> (a, b)."""
    xs = [math.log2(r) for r in rows]
    mx, my = sum(xs) / len(xs), sum(al) / len(al)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, al, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def per_row_costs(out: Path, m: dict, epochs: float) -> dict:
    """Seconds per training row on this machine, from the run's manifests and the full-size train metrics `m`:
    answering a prompt (the data stage's wall time over every row it wrote, held-out ones included), the target's
    states (0 when an earlier train stage had cached them: then the costs read low) and one epoch of training."""
    data = verified(out, "data")[1]
    rows = data["metrics"]["train_rows"] + data["metrics"]["heldout_rows"]
    return {"answer_s": data["wall_s"] / rows, "states_s": m["cache_states_s"] / m["train_rows"],
            "train_epoch_s": m["train_s"] / m["train_rows"] / epochs, "epochs": epochs}


def scaling(config: str, out: Path, sets: list[str], fractions: list[float], target: float, budget_min: float = 30.0) -> dict:
    from trtspec.config import load_config

    full = train_recipe(config, sets, out, "rows-all", [])
    n = full["metrics"]["train_rows"]
    runs = [full] + [train_recipe(config, sets, out, f"rows-{round(n * f)}", [f"train.max_rows={round(n * f)}"])
                     for f in sorted(fractions, reverse=True)]
    runs.sort(key=lambda r: r["metrics"]["train_rows"])
    rows = [r["metrics"]["train_rows"] for r in runs]
    held = [r["metrics"][f"AL@{K}"] for r in runs]
    a, b = fit_log2(rows, held)
    costs = per_row_costs(out, full["metrics"], load_config(config, sets).train.epochs)
    need = 2 ** ((target - a) / b) if b > 0 else math.inf
    data_s = need * (costs["answer_s"] + costs["states_s"])  # the data alone: no recipe trains without it
    row_s = costs["answer_s"] + costs["states_s"] + costs["epochs"] * costs["train_epoch_s"]
    budget_rows = budget_min * 60 / row_s  # generous: the stages' fixed costs (loading, evaluation) left out
    doublings = math.log2(budget_rows / n)
    return {
        "rows": rows, "heldout_AL": held,
        "fit_AL": [r["metrics"].get("fit", {}).get(f"AL@{K}") for r in runs],
        "gain_per_doubling": [round((held[i + 1] - held[i]) / math.log2(rows[i + 1] / rows[i]), 3) for i in range(len(rows) - 1)],
        "fit": {"a": round(a, 4), "b_per_doubling": round(b, 4)},
        "target_AL": target, "rows_needed": None if math.isinf(need) else round(need),
        "times_the_data": None if math.isinf(need) else round(need / n, 1),
        "per_row_s": {k: round(v, 4) for k, v in costs.items()},
        "projected_min": {"data": round(data_s / 60, 1),
                          "data_and_training": round(need * row_s / 60, 1),
                          "data_and_one_epoch": round((data_s + need * costs["train_epoch_s"]) / 60, 1)},
        "budget": {"minutes": budget_min, "rows": round(budget_rows), "doublings_over_these": round(doublings, 2),
                   "AL_on_trend": round(a + b * math.log2(budget_rows), 3),
                   "gain_per_doubling_needed": round((target - held[-1]) / doublings, 3) if doublings > 0 else None},
        "recipes": runs,
    }


def report(s: dict) -> None:
    print_table(s["recipes"])
    print()
    print(f"{'rows':>6s} {'held-out AL@3':>14s} {'training-rows AL@3':>19s}")
    for r, h, f in zip(s["rows"], s["heldout_AL"], s["fit_AL"], strict=True):
        print(f"{r:6d} {h:14.2f} {f if f is None else round(f, 2)!s:>19s}")
    print(f"gain per doubling of the rows, smallest to largest: {s['gain_per_doubling']}")
    print(f"trend: AL@3 = {s['fit']['a']:.3f} + {s['fit']['b_per_doubling']:.3f} * log2(rows)")
    g = s["budget"]
    print(f"{g['minutes']:g} min of this machine answer, cache and train ~{g['rows']} rows ({g['doublings_over_these']:+.2f} "
          f"doublings over these): AL@3 {g['AL_on_trend']:.2f} on the trend; reaching {s['target_AL']} within it would "
          f"take {g['gain_per_doubling_needed']} per doubling, against {s['gain_per_doubling']} measured")
    if s["rows_needed"] is None:
        print("the trend does not rise: no extrapolation")
        return
    c, p = s["per_row_s"], s["projected_min"]
    print(f"AL@3 {s['target_AL']} on that trend needs ~{s['rows_needed']} rows ({s['times_the_data']}x these); at this "
          f"run's costs ({c['answer_s']:.3f} s/row answering, {c['states_s']:.3f} s/row states, {c['train_epoch_s']:.3f} "
          f"s/row/epoch training) that is {p['data']:.0f} min for the data alone, {p['data_and_one_epoch']:.0f} min with "
          f"one epoch, {p['data_and_training']:.0f} min with {c['epochs']:g} epochs")


def plot(s: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(s["rows"], s["heldout_AL"], "o", label="held-out prompts")
    if all(f is not None for f in s["fit_AL"]):
        ax.plot(s["rows"], s["fit_AL"], "s", label="training rows (fit)")
    hi = max(s["rows"][-1], s["rows_needed"] or 0) * 1.2
    xs = [s["rows"][0] * 2 ** (i / 4) for i in range(int(4 * math.log2(hi / s["rows"][0])) + 1)]
    ax.plot(xs, [s["fit"]["a"] + s["fit"]["b_per_doubling"] * math.log2(x) for x in xs], "--", color="gray",
            label=f"trend: +{s['fit']['b_per_doubling']:.2f} per doubling")
    ax.axhline(s["target_AL"], color="red", lw=0.8, label=f"target AL@3 {s['target_AL']}")
    ax.axvline(s["budget"]["rows"], color="green", lw=0.8, label=f"rows {s['budget']['minutes']:g} min can make and train")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("training rows")
    ax.set_ylabel("AL@3 (chain drafts of 3)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("config")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--fractions", default="0.125,0.25,0.5", help="shares of the training rows besides all of them")
    ap.add_argument("--target-al", type=float, default=3.0)
    ap.add_argument("--budget-min", type=float, default=30.0, help="minutes for data + states + training (default 30)")
    ap.add_argument("--set", action="append", default=[], dest="overrides", help="applied to every size")
    ap.add_argument("--plot", action="store_true", help="write OUT/recipes/data_scaling.png")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    try:
        fractions = [float(f) for f in args.fractions.split(",") if f]
    except ValueError:
        sys.exit(f"Error: --fractions '{args.fractions}' is not a comma-separated list of numbers")
    if not fractions or not all(0 < f < 1 for f in fractions):
        sys.exit("Error: --fractions needs at least one share between 0 and 1 (exclusive)")
    s = scaling(args.config, args.out, args.overrides, fractions, args.target_al, args.budget_min)
    if args.json:
        print(json.dumps(s, indent=1))
    else:
        report(s)
    if args.plot:
        plot(s, args.out / "recipes" / "data_scaling.png")


if __name__ == "__main__":
    run_main(main)
