#!/usr/bin/env python
"""The runtime's attention over its KV cache two ways, in one process, interleaved, at several cache lengths: the
native kernel (runtime/native.py: one task per query head and row, vector loops) against torch's (inductor's fused
sums for one row, the CPU flash kernel for several); in compiled decode steps (1 row) and in compiled verification
passes of a chain (--rows new rows with their causal mask, as after a draft of rows - 1). Greedy tokens must be
identical.

    python scripts/bench_attention.py runs/demo [--contexts 100,300,600,1000] [--tokens 64] [--rows 4] [--repeats 6]

RUN_DIR's bundle/target is decoded greedily (a synthetic prompt of the given length, then --tokens new tokens); the
verification pass is timed on the same cache. Prints ms per decode step and per verification pass for each, and
torch's time over the native kernel's.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from trtspec.bench import arg_parser, verified
from trtspec.errors import run_main
from trtspec.measure import ms_per_call, step_ms, timed
from trtspec.runtime import compile_steps, generate, load_transformer
from trtspec.runtime.settings import RuntimeSettings

VARIANTS = {"native": True, "torch": False}


def use_native(target, on: bool) -> None:
    """Every layer's attention through the native kernel or torch's (a guarded attribute: each gets its own graph)."""
    for layer in target.layers:
        layer.self_attn.native = on


def decode(target, prompt: torch.Tensor, n: int) -> tuple[list[int], float]:
    """Greedy tokens and milliseconds per decode step (the runtime's `generate`, prefill excluded)."""
    # n + 1 tokens: the first comes from the prefill, the other n from decode steps
    g, seconds = timed(lambda: generate(target, prompt, n + 1))
    return g.tokens, step_ms(g, seconds, n)


def verify(target, length: int, rows: int, n: int) -> float:
    """Milliseconds per compiled verification pass of `rows` new rows after `length` cached ones (a chain's mask)."""
    tokens, slots = torch.arange(7, 7 + rows), torch.arange(length, length + rows)
    mask = torch.ones(rows, length + rows, dtype=torch.bool).tril(length)
    return ms_per_call(lambda: target.step(tokens, slots, slots, length + rows, mask), n)


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--contexts", default="100,300,600,1000", help="cached tokens before decoding")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rows", type=int, default=4, help="new rows of the verification pass")
    ap.add_argument("--repeats", type=int, default=6)
    a = ap.parse_args()
    contexts = [int(x) for x in a.contexts.split(",")]
    # the target's native pass (native attention inside one call) off: both kinds run inside its compiled forward
    target, _ = load_transformer(verified(a.run_dir, "export")[0] / "target", settings=RuntimeSettings(native_pass=False))
    target.setup_cache(max(contexts) + a.tokens + a.rows + 8)
    if not target.layers[0].self_attn.native:
        raise SystemExit("the native attention kernel is not usable here (no vector build, or not float32 on a CPU)")

    def each(prompt: torch.Tensor, n: int) -> dict[str, tuple[list[int], float, float]]:
        out = {}
        for name, on in VARIANTS.items():
            use_native(target, on)
            tokens, s = decode(target, prompt, n)
            out[name] = (tokens, s, verify(target, len(prompt) + n, a.rows, max(4, n // 4)))
        return out

    with torch.inference_mode():
        seconds, how = compile_steps([target], lambda: each(torch.arange(100, 140), 4))
        print(f"{how} ({seconds} s)")
        print(f"{'cached':>7} {'decode ms: native':>18} {'torch':>7} {'ratio':>6}   {f'verify {a.rows} rows ms: native':>24} "
              f"{'torch':>7} {'ratio':>6}  tokens identical")
        for c in contexts:
            prompt = torch.arange(100, 100 + c) % 40000
            times: dict[str, list[tuple[float, float]]] = {k: [] for k in VARIANTS}
            same = True
            for _ in range(a.repeats):
                res = each(prompt, a.tokens)
                same &= res["native"][0] == res["torch"][0]
                for k, (_, s, v) in res.items():
                    times[k].append((s, v))
            (nd, nv), (td, tv) = ((statistics.median(t[0] for t in times[k]), statistics.median(t[1] for t in times[k]))
                                  for k in VARIANTS)
            print(f"{c:>7} {nd:>18.2f} {td:>7.2f} {td / nd:>6.3f}   {nv:>24.2f} {tv:>7.2f} {tv / nv:>6.3f}  {same}")


if __name__ == "__main__":
    run_main(main)
