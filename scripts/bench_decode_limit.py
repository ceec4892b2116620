"""Where a compiled decode step's time goes, against the memory-bandwidth limit, in paired samples: each round measures
the machine's bandwidth (streaming read and a large matrix-vector product, measure.memory_bandwidth), the
target's weight products called alone (every Linear once, with the kernels chosen at load), and greedy decode steps,
back to back, so each round's fraction of the limit uses the bandwidth of that moment (a shared host's moves by tens
of percent within minutes).

    python scripts/bench_decode_limit.py runs/demo [--rounds 5] [--context 300] [--tokens 64] [--json]

Prints per round: bandwidth (GB/s), products alone (ms, GB/s), decode step (ms), the rest of the step (ms), and the
step's fraction of the limit (weights / bandwidth); then the medians, and how fast each kind of product streams when
called alone (every layer's qkv_proj in turn, then o_proj, ...).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from trtspec.bench import arg_parser, verified
from trtspec.errors import run_main
from trtspec.measure import memory_bandwidth, ms_per_call, step_ms, timed
from trtspec.runtime import compile_steps, generate, load_transformer
from trtspec.runtime.kernels import Linear, few_rows_linear


def decode_ms(target, prompt: torch.Tensor, n: int) -> float:
    """Milliseconds per greedy decode step after a prefill of `prompt` (the runtime's `generate`, prefill excluded)."""
    # n + 1 tokens: the first comes from the prefill, the other n from decode steps
    g, seconds = timed(lambda: generate(target, prompt, n + 1))
    return step_ms(g, seconds, n)


def products_ms(linears: list[Linear], n: int) -> float:
    """Milliseconds per pass over every weight product of a decode step (one row each), nothing else."""
    xs = {m.in_features: torch.randn(1, 1, m.in_features) for m in linears}

    def one_pass() -> None:
        for m in linears:
            few_rows_linear(xs[m.in_features], m.weight, m.bias, m.kernels)

    return ms_per_call(one_pass, n)


def megabytes(linears: list[Linear]) -> float:
    """Megabytes of weights the products read."""
    return sum(m.weight.numel() * m.weight.element_size() for m in linears) / 1e6


def kinds_gb_per_s(target, n: int = 5) -> dict[str, float]:
    """Each kind of weight product (qkv_proj, o_proj, ..., lm_head) called alone over every layer in turn, best of
    `n` passes, in GB/s: how fast the chosen kernel streams each shape outside a decode step."""
    by_kind: dict[str, list[Linear]] = {}
    for name, m in target.named_modules():
        if isinstance(m, Linear):
            by_kind.setdefault(name.rsplit(".", 1)[-1], []).append(m)
    return {kind: round(megabytes(ms) / min(products_ms(ms, 1) for _ in range(n)), 1) for kind, ms in by_kind.items()}


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--context", type=int, default=300, help="cached tokens before decoding")
    ap.add_argument("--tokens", type=int, default=64, help="decode steps (and product passes) per round")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    target, _ = load_transformer(verified(a.run_dir, "export")[0] / "target")
    target.setup_cache(a.context + a.tokens + 8)
    prompt = torch.arange(100, 100 + a.context) % target.args.vocab_size
    linears = [m for m in target.modules() if isinstance(m, Linear)]
    weight_mb = megabytes(linears)
    rows = []
    with torch.inference_mode():
        _, how = compile_steps([target], lambda: decode_ms(target, prompt[:40], 4))
        for _ in range(a.rounds):
            bw = memory_bandwidth(target.kernel_choice["one_row"], repeats=3)["gb_per_s"]
            step = decode_ms(target, prompt, a.tokens)
            prods = products_ms(linears, a.tokens)
            limit_ms = weight_mb / bw
            rows.append({"bandwidth_gb_per_s": bw, "products_ms": round(prods, 2),
                         "products_gb_per_s": round(weight_mb / prods, 1), "step_ms": round(step, 2),
                         "rest_ms": round(step - prods, 2), "fraction_of_limit": round(limit_ms / step, 3),
                         "kinds_gb_per_s": kinds_gb_per_s(target)})
    median = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0] if k != "kinds_gb_per_s"}
    median["kinds_gb_per_s"] = {k: round(statistics.median(r["kinds_gb_per_s"][k] for r in rows), 1) for k in rows[0]["kinds_gb_per_s"]}
    summary = {"weight_mb": round(weight_mb, 1), "context": a.context, "compiled": how, "rounds": rows, "median": median}
    if a.json:
        print(json.dumps(summary, indent=1))
        return
    print(f"{how}; weights {weight_mb:.0f} MB per token, {a.context} cached tokens, {a.tokens} steps a round")
    print(f"{'bandwidth GB/s':>15} {'products ms':>12} {'products GB/s':>14} {'step ms':>8} {'rest ms':>8} {'step / limit':>13}")
    for r in [*rows, median]:
        print(f"{r['bandwidth_gb_per_s']:>15} {r['products_ms']:>12} {r['products_gb_per_s']:>14} {r['step_ms']:>8} "
              f"{r['rest_ms']:>8} {r['fraction_of_limit']:>13}" + ("   (median)" if r is median else ""))
    print("each kind of product alone, over all layers in turn (GB/s, median of rounds): "
          + ", ".join(f"{k} {v}" for k, v in median["kinds_gb_per_s"].items()))


if __name__ == "__main__":
    run_main(main)
