"""Head training in 1 process against N processes (torchrun; DDP and FSDP, train.sharding; gloo on a CPU), side by
side in one run on the same data stage: loss per step, training tokens/s, peak memory and head parameters per process.
One process takes batch B; N processes take B/N each, so every optimizer step sees the same rows.

    python scripts/bench_ranks.py build_configs/smollm2-135m-eagle3.yaml --out runs/ranks --batch 8 --steps 60 --procs 2
    python scripts/bench_ranks.py ... --sharding ddp,fsdp --plot

The run's data and convert stages are built first (one process), and the target's hidden states are cached once
(offline mode), so each variant costs its training alone. Each variant's metrics and log are kept in
OUT/ranks/N-SHARDING.json; --plot draws the loss curves (OUT/ranks/loss.png).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from trtspec.bench import arg_parser, stage_metrics
from trtspec.errors import run_main


def train_with(config: str, out: Path, procs: int, batch: int, steps: int, sets: list[str], sharding: str = "ddp") -> dict:
    """`trtspec train` with `procs` processes -> {procs, sharding, metrics, log}; the train stage is redone each time."""
    overrides = [f"train.batch_size={batch // procs}", f"train.max_steps={steps}", "train.eval_steps=0",
                 f"train.sharding={sharding}", *sets]
    cmd = ["-m", "trtspec.cli", "train", config, "--out", str(out), "--force", *[a for s in overrides for a in ("--set", s)]]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"] if procs > 1 else [sys.executable]
    r = subprocess.run(launcher + cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"Error: training with {procs} process(es) failed:\n{r.stderr[-2000:]}")
    metrics = stage_metrics(out, "train")
    log = [json.loads(x) for x in (out / "train" / "train_log.jsonl").read_text().splitlines() if x.strip()]
    result = {"procs": procs, "sharding": sharding if procs > 1 else "-", "batch_per_process": batch // procs,
              "metrics": metrics, "log": log}
    (out / "ranks").mkdir(exist_ok=True)
    (out / "ranks" / f"{procs}-{result['sharding']}.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("config")
    ap.add_argument("--out", required=True, help="run directory (its data and convert stages are reused)")
    ap.add_argument("--procs", type=int, default=2, help="processes of the multi-process variant")
    ap.add_argument("--batch", type=int, default=8, help="rows per optimizer step (split over the processes)")
    ap.add_argument("--steps", type=int, default=60, help="optimizer steps of each variant")
    ap.add_argument("--sharding", default="ddp", help="comma-separated: how the N processes hold the head (ddp, fsdp)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--plot", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.batch % args.procs:
        sys.exit(f"Error: --batch {args.batch} does not split over {args.procs} processes")
    out = Path(args.out)
    r = subprocess.run([sys.executable, "-m", "trtspec.cli", "convert", args.config, "--out", str(out),
                        *[a for s in args.sets for a in ("--set", s)]], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"Error: the data/convert stages failed:\n{r.stderr[-2000:]}")
    # states are cached by the first variant; run it once untimed so neither timed variant pays for them
    train_with(args.config, out, 1, args.batch, 1, args.sets)
    results = [train_with(args.config, out, 1, args.batch, args.steps, args.sets)]
    results += [train_with(args.config, out, args.procs, args.batch, args.steps, args.sets, s) for s in args.sharding.split(",")]

    rows = []
    one = results[0]
    for res in results:
        m = res["metrics"]
        gaps = [abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(one["log"], res["log"], strict=False)]
        rows.append({"processes": res["procs"], "sharding": res["sharding"], "batch_per_process": res["batch_per_process"],
                     "train_s": m["train_s"], "train_tokens_per_s": m["train_tokens_per_s"],
                     "speed_vs_one": round(m["train_tokens_per_s"] / one["metrics"]["train_tokens_per_s"], 2),
                     "peak_rss_gib_by_rank": m.get("peak_rss_gib_by_rank"),
                     "head_parameters_by_rank": m.get("head_parameters_by_rank"), "final_loss": res["log"][-1]["loss"],
                     "AL@3": m.get("AL@3"), "mean_loss_gap_vs_one": round(sum(gaps) / len(gaps), 5),
                     "max_loss_gap_vs_one": round(max(gaps), 5)})
    summary = {"rows": rows}
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for res in results:
            ax.plot([x["step"] for x in res["log"]], [x["loss"] for x in res["log"]],
                    label=f"{res['procs']} process(es) x batch {res['batch_per_process']}"
                    + (f" ({res['sharding']})" if res["procs"] > 1 else ""))
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("training loss")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "ranks" / "loss.png", dpi=120)
        summary["plot"] = str(out / "ranks" / "loss.png")
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    print(f"{'processes':>9} {'sharding':>8} {'batch/proc':>10} {'train s':>8} {'tokens/s':>9} {'vs 1':>5} {'final loss':>10} "
          f"{'AL@3':>5} {'loss gap mean/max':>17}  peak RSS GiB / head parameters by rank")
    for r in rows:
        print(f"{r['processes']:>9} {r['sharding']:>8} {r['batch_per_process']:>10} {r['train_s']:>8} {r['train_tokens_per_s']:>9} "
              f"{r['speed_vs_one']:>5} {r['final_loss']:>10} {r['AL@3'] or '':>5} "
              f"{r['mean_loss_gap_vs_one']:>8}/{r['max_loss_gap_vs_one']:<8}  {r['peak_rss_gib_by_rank']} / {r['head_parameters_by_rank']}")
    print("loss per step, side by side (" + ", ".join(f"{r['processes']} {r['sharding']}" for r in rows) + "):")
    for i in range(0, len(one["log"]), max(1, len(one["log"]) // 10)):
        print(f"  step {one['log'][i]['step']:>4}: " + "  ".join(f"{res['log'][i]['loss']:.4f}" for res in results))
    if args.plot:
        print(f"plot: {summary['plot']}")


if __name__ == "__main__":
    run_main(main)
