"""trtspec's head recipe against NVIDIA Model Optimizer's example EAGLE-3 recipe as it ships
(build_configs/smollm2-135m-eagle3-modelopt.yaml, each setting cited there), on the same rows and held-out prompts,
with the same CPU minutes, side by side in one run. Prints accepted draft tokens per step (AL-1) at k = 1..3 with
95% intervals over the held-out prompts, steps, minutes and tokens/s.

    python scripts/bench_anchor.py --out runs/anchor [--data-from runs/demo]

Equal minutes: the anchor trains online (as it ships), trtspec's recipe offline; trtspec's budget is its training plus
caching the target's states, and the anchor gets as many optimizer steps as fit in that many seconds (its marginal
cost per step, timed on two short runs so start-up is not counted; its learning-rate schedule spans those steps). --as-shipped also trains the anchor for its full epoch.
Each recipe runs in OUT/NAME (the data stage is shared: built once, or copied from --data-from); results in
OUT/anchor.json.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from trtspec.artifacts import MARKER
from trtspec.bench import arg_parser, stage_metrics
from trtspec.errors import run_main
from trtspec.measure import timed

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {"trtspec": ROOT / "build_configs" / "smollm2-135m-eagle3.yaml",
           "modelopt": ROOT / "build_configs" / "smollm2-135m-eagle3-modelopt.yaml"}


def build_train(config: Path, out: Path, sets: list[str]) -> dict:
    """`trtspec train` (upstream stages as needed) -> the train manifest's metrics."""
    cmd = [sys.executable, "-m", "trtspec.cli", "train", str(config), "--out", str(out), *[a for s in sets for a in ("--set", s)]]
    r, seconds = timed(lambda: subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    if r.returncode:
        sys.exit(f"Error: {' '.join(cmd[3:])} failed:\n{r.stderr[-2000:]}")
    metrics = stage_metrics(out, "train")
    metrics["wall_s"] = round(seconds, 1)
    return metrics


def share_data(src: Path, dst: Path) -> None:
    """A finished data stage copied into another run directory (same data config: the runner reuses it)."""
    if not (dst / "data").is_dir():
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src / "data", dst / "data")
        shutil.copy2(src / MARKER, dst / MARKER)


def al_row(name: str, m: dict, k: int = 3) -> dict:
    row = {"recipe": name, "steps": m["steps"], "train_s": m["train_s"], "states_s": m["cache_states_s"],
           "minutes": round((m["train_s"] + m["cache_states_s"]) / 60, 1), "train_tokens_per_s": m["train_tokens_per_s"]}
    for j in range(1, k + 1):
        lo, hi = m.get(f"AL@{j}_ci95") or (None, None)
        row[f"AL-1@{j}"] = round(m[f"AL@{j}"] - 1, 3)
        row[f"AL-1@{j}_ci95"] = [round(lo - 1, 3), round(hi - 1, 3)] if lo is not None else None
    return row


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--data-from", type=Path, help="a run directory of the demo recipe whose data stage to reuse")
    ap.add_argument("--probe-steps", type=int, default=40,
                    help="the anchor is timed at N and 2N steps; the difference sizes its budget")
    ap.add_argument("--as-shipped", action="store_true", help="also train the anchor for its full epoch")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = args.out
    if args.data_from:
        share_data(args.data_from, out / "trtspec")

    results = {"trtspec": build_train(RECIPES["trtspec"], out / "trtspec", [])}
    budget_s = results["trtspec"]["train_s"] + results["trtspec"]["cache_states_s"]
    share_data(out / "trtspec", out / "modelopt")
    short, probe = (build_train(RECIPES["modelopt"], out / "modelopt", [f"train.max_steps={n}"])
                    for n in (args.probe_steps, 2 * args.probe_steps))
    per_step = (probe["train_s"] - short["train_s"]) / (probe["steps"] - short["steps"])
    start_s = max(0.0, short["train_s"] - short["steps"] * per_step)
    steps = max(1, round((budget_s - start_s) / per_step))
    epoch_steps = probe["train_rows"]  # batch 1: one step per row
    results["modelopt"] = build_train(RECIPES["modelopt"], out / "modelopt", [f"train.max_steps={min(steps, epoch_steps)}"])
    if args.as_shipped and steps < epoch_steps:
        results["modelopt-1-epoch"] = build_train(RECIPES["modelopt"], out / "modelopt", [])

    rows = [al_row(name, m) for name, m in results.items()]
    ratio = {f"AL-1@{j}": round(rows[0][f"AL-1@{j}"] / max(rows[1][f"AL-1@{j}"], 1e-9), 2) for j in (1, 2, 3)}
    summary = {"budget_s": round(budget_s, 1), "anchor_s_per_step": round(per_step, 3), "anchor_steps_in_budget": steps,
               "anchor_epoch_steps": epoch_steps, "rows": rows, "trtspec_over_modelopt": ratio}
    (out / "anchor.json").write_text(json.dumps(summary, indent=1) + "\n")
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    print(f"budget {budget_s:.0f} s (trtspec: train + target states); the anchor at {per_step:.3f} s/step gets {steps} "
          f"steps (its epoch: {epoch_steps})")
    print(f"{'recipe':18s} {'steps':>6s} {'minutes':>7s} {'tok/s':>6s}  " + "  ".join(f"{'AL-1@' + str(j):>20s}" for j in (1, 2, 3)))
    for r in rows:
        cells = "  ".join(f"{r[f'AL-1@{j}']:6.3f} [{r[f'AL-1@{j}_ci95'][0]:.3f}, {r[f'AL-1@{j}_ci95'][1]:.3f}]"
                          if r[f"AL-1@{j}_ci95"] else f"{r[f'AL-1@{j}']:20.3f}" for j in (1, 2, 3))
        print(f"{r['recipe']:18s} {r['steps']:6d} {r['minutes']:7.1f} {r['train_tokens_per_s']:6.0f}  {cells}")
    print("trtspec / modelopt: " + ", ".join(f"{k} {v}x" for k, v in ratio.items()))


if __name__ == "__main__":
    run_main(main)
