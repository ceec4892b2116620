"""A compiled decode step with the runtime's one-token attention (products and sums inductor fuses) against the same
step with torch's scaled_dot_product_attention (the CPU flash kernel), in one process, interleaved, at several cache
lengths; greedy tokens must be identical.

    python scripts/bench_attention.py runs/demo [--contexts 100,300,600,1000,2000] [--tokens 64] [--repeats 6]

RUN_DIR's bundle/target is decoded greedily (a synthetic prompt of the given length, then --tokens new tokens).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import trtspec.runtime.model as runtime_model
from trtspec.bench import arg_parser
from trtspec.runtime import compile_steps, generate, load_transformer

FUSED = runtime_model.one_token_attention


def flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def decode(target, prompt: torch.Tensor, n: int) -> tuple[list[int], float]:
    """Greedy tokens and seconds per decode step (the runtime's `generate`, prefill excluded)."""
    t0 = time.perf_counter()
    g = generate(target, prompt, n + 1)  # the first token comes from the prefill, the other n from decode steps
    return g.tokens, (time.perf_counter() - t0 - g.prefill_s) / n


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--contexts", default="100,300,600,1000,2000", help="cached tokens before decoding")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=6)
    a = ap.parse_args()
    contexts = [int(x) for x in a.contexts.split(",")]
    target, _ = load_transformer(a.run_dir / "bundle" / "target")
    target.setup_cache(max(contexts) + a.tokens + 8)
    variants = {"flash (sdpa)": flash, "fused sums": FUSED}

    def each(prompt: torch.Tensor, n: int) -> dict[str, tuple[list[int], float]]:
        out = {}
        for name, fn in variants.items():
            runtime_model.one_token_attention = fn  # a guarded global: each variant gets its own compiled graph
            out[name] = decode(target, prompt, n)
        return out

    with torch.inference_mode():
        seconds, how = compile_steps([target], lambda: each(torch.arange(100, 140), 4))
        print(f"{how} ({seconds} s)")
        print(f"{'cached':>7} {'flash ms/token':>15} {'fused ms/token':>15} {'ratio':>6}  tokens identical")
        for c in contexts:
            prompt = torch.arange(100, 100 + c) % 40000
            times: dict[str, list[float]] = {k: [] for k in variants}
            same = True
            for _ in range(a.repeats):
                res = each(prompt, a.tokens)
                same &= res["flash (sdpa)"][0] == res["fused sums"][0]
                for k, (_, s) in res.items():
                    times[k].append(1000 * s)
            f, u = (statistics.median(times[k]) for k in variants)
            print(f"{c:>7} {f:>15.2f} {u:>15.2f} {f / u:>6.3f}  {same}")


if __name__ == "__main__":
    main()
