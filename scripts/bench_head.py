"""Measure the head-training recipe: wall time of data+convert+train, held-out acceptance, offline vs online
training throughput (same batch, one run, their steps interleaved), peak RSS.

    python scripts/bench_head.py build_configs/smollm2-135m-eagle3.yaml --out runs/bench [--set train.epochs=4]

Timings on a shared CPU are noisy: read the ratio, not the absolute figures.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path

from trtspec.bench import arg_parser, stage_metrics, verified
from trtspec.errors import run_main
from trtspec.measure import timed


def training_step(cfg, run_dir: Path, mode: str):
    """(one optimizer step in `mode` on the first batch of the data stage's rows, its real token count), the batch
    cut and padded as the train stage does, with the train stage's precision (bf16 autocast or fp32)."""
    import torch

    from trtspec.eagle import head as eagle
    from trtspec.eagle.train_step import head_forward
    from trtspec.models import load_model, resolve_model, use_bf16
    from trtspec.training.states import base_states
    from trtspec.training.trainer import HeadDataset

    tokens = torch.load(verified(run_dir, "data")[0] / "train_tokens.pt", weights_only=True)
    eagle_cfg = json.loads((run_dir / "convert" / "eagle_config.json").read_text())
    aux_layers = eagle_cfg["eagle_architecture_config"]["eagle_aux_hidden_state_layer_ids"]
    ds = HeadDataset(tokens)
    batch = HeadDataset.collate([ds[i] for i in range(cfg.train.batch_size)])
    bf16 = use_bf16(cfg.model.build_dtype)
    base = load_model(resolve_model(cfg.model.source), cfg.model.dtype)
    if mode == "offline":
        aux, last = base_states(base, batch["input_ids"], batch["attention_mask"], aux_layers, bf16)
        batch["aux_hidden_states"], batch["base_model_hidden_states"] = aux.half(), last.half()  # as cached
        eagle_cfg["eagle_offline"] = True
    model = eagle.build_eagle_model(base, eagle_cfg)
    eagle.load_head(model, run_dir / "convert" / "head_init.safetensors")
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = head_forward(model, batch)  # what the train stage's compute_loss runs
        out.loss.backward()
        opt.step()
        opt.zero_grad()

    return step, int(batch["attention_mask"].sum())


def throughputs(cfg, run_dir: Path, steps: int) -> dict[str, float]:
    """Training tokens/s (real, unpadded) offline and online, their steps interleaved (offline, online, offline,
    ...) so that a drift in the machine's speed hits both alike; the first step of each warms up."""
    runs = {mode: training_step(cfg, run_dir, mode) for mode in ("offline", "online")}
    seconds = dict.fromkeys(runs, 0.0)
    for i in range(steps + 1):
        for mode, (step, _) in runs.items():
            seconds[mode] += timed(step)[1] if i else 0.0
    return {mode: steps * tokens / seconds[mode] for mode, (_, tokens) in runs.items()}


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("config")
    ap.add_argument("--out", default="runs/bench")
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--throughput-steps", type=int, default=10)
    args = ap.parse_args()

    from trtspec.config import load_config
    from trtspec.models import use_bf16
    from trtspec.pipeline.runner import run_build

    cfg = load_config(args.config, args.overrides)
    results, wall = timed(lambda: run_build(cfg, args.out, until="train"))
    for r in results:
        print(f"{r.stage:8s} {r.status:7s} {r.seconds:7.1f}s  {r.headline}")
    metrics = stage_metrics(Path(args.out), "train")
    print(f"data+convert+train wall: {wall / 60:.1f} min (this run; cached stages count 0)")
    print("held-out acceptance: " + ", ".join(f"{k} {v}" for k, v in metrics.items() if k.startswith("AL@"))
          + f"; by draft position {metrics['accept_rate_by_position']}")
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    speed = throughputs(cfg, Path(args.out), args.throughput_steps)
    off, on = speed["offline"], speed["online"]
    print(f"train throughput, batch {cfg.train.batch_size}, {'bf16' if use_bf16(cfg.model.build_dtype) else 'fp32'}: offline {off:.0f} tok/s | "
          f"online {on:.0f} tok/s | offline/online {off / on:.2f}x  steps interleaved")


if __name__ == "__main__":
    run_main(main)
