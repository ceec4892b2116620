"""The runtime's compiled steps with inductor's Python wrapper (trtspec's default) against its C++ wrapper
(`cpp_wrapper`: the graph's calls made from C++, no Python per kernel): compile seconds, then plain decode steps and
speculative decoding on two copies of the demo's target and draft, interleaved round by round, with the machine's
bandwidth sampled before each round.

    python scripts/bench_cpp_wrapper.py runs/demo [--rounds 8] [--k 3] [--context 300] [--tokens 64]

Prints per round: bandwidth (GB/s), decode steps tok/s and speculative tok/s for each wrapper and whether their
greedy tokens are identical; then the median ratio C++ / Python. Compile seconds depend on what inductor's cache
already holds (the first wrapper compiled warms parts of it for the second).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from trtspec.runtime import DraftSpec, generate, load_eagle3_drafter, load_transformer, speculative_decode
from trtspec.runtime.kernels import memory_bandwidth
from trtspec.runtime.model import compile_cache_dir

WRAPPERS = {"python": {}, "cpp": {"cpp_wrapper": True}}


def load_compiled(run: Path, options: dict, context: int, spec: DraftSpec) -> tuple[object, object, torch.Tensor, float]:
    """(target, drafter, a `context`-token prompt, compile seconds) with both networks' steps compiled under
    inductor `options`."""
    target, _ = load_transformer(run / "bundle" / "target")
    drafter = load_eagle3_drafter(run / "bundle" / "draft", target)
    prompt = torch.arange(100, 100 + context) % target.args.vocab_size
    t0 = time.perf_counter()
    for net in (target, drafter.net):
        net.compiled_step = torch.compile(net.forward, dynamic=True, options=options)
    generate(target, prompt[:40], 5)
    speculative_decode(target, drafter, prompt[:40], 20, spec, set())
    return target, drafter, prompt, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[2:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--k", type=int, default=3, help="draft length of the speculative runs")
    ap.add_argument("--context", type=int, default=300, help="prompt tokens before decoding")
    ap.add_argument("--tokens", type=int, default=64, help="decode steps a run")
    a = ap.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(compile_cache_dir()))
    spec = DraftSpec(shape="chain", k=a.k)
    with torch.inference_mode():
        nets = {}
        for name, options in WRAPPERS.items():
            target, drafter, prompt, seconds = load_compiled(a.run_dir, options, a.context, spec)
            nets[name] = (target, drafter)
            print(f"{name} wrapper: compiled in {seconds:.0f} s", flush=True)
        speeds = {f"{w}/{kind}": [] for w in WRAPPERS for kind in ("decode", "spec")}
        print(f"{'round':>5} {'GB/s':>6} " + " ".join(f"{k:>12}" for k in speeds) + "  identical")
        for r in range(a.rounds):
            bw = memory_bandwidth(nets["python"][0].kernel_choice["one_row"], repeats=3)["gb_per_s"]
            tokens = {}
            for w in (list(WRAPPERS) if r % 2 == 0 else list(WRAPPERS)[::-1]):  # alternate who runs first
                target, drafter = nets[w]
                t0 = time.perf_counter()
                g = generate(target, prompt, a.tokens + 1)
                speeds[f"{w}/decode"].append(a.tokens / (time.perf_counter() - t0 - g.prefill_s))
                t0 = time.perf_counter()
                s = speculative_decode(target, drafter, prompt, a.tokens + 1, spec, set())
                speeds[f"{w}/spec"].append(len(s.tokens) / (time.perf_counter() - t0))
                tokens[w] = (g.tokens, s.tokens)
            print(f"{r:>5} {bw:>6.1f} " + " ".join(f"{v[-1]:>12.1f}" for v in speeds.values())
                  + f"  {tokens['cpp'] == tokens['python']}", flush=True)
        for kind in ("decode", "spec"):
            ratios = [c / p for c, p in zip(speeds[f"cpp/{kind}"], speeds[f"python/{kind}"], strict=True)]
            print(f"{kind}: C++ / Python wrapper tok/s, median of rounds {statistics.median(ratios):.3f} "
                  f"(rounds {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
