"""Is the compiled decode step's per-call cost (dynamo guards, the graph's Python wrapper) what keeps plain decode from
the bandwidth limit? Times greedy decoding of RUN_DIR's target with one compiled call per token against N tokens per
compiled graph (argmax fed back inside it), interleaved in one process, and checks the tokens are identical.

    python scripts/bench_chunked_decode.py runs/demo [--chunk 4] [--tokens 128] [--repeats 4]

A design probe for issue #26: the runtime decodes one token per call; a ratio near 1 says the per-call cost is small.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from trtspec.runtime import compile_steps, load_transformer
from trtspec.runtime.decode import prefill


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[2:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--chunk", type=int, default=4, help="greedy tokens per compiled graph")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=4)
    a = ap.parse_args()

    target, _ = load_transformer(a.run_dir / "bundle" / "target")
    prompt = torch.arange(100, 140)
    target.setup_cache(prompt.numel() + a.tokens + a.chunk + 1)

    def steps(token: torch.Tensor, length: int, n: int) -> torch.Tensor:
        out = []
        for i in range(n):
            pos = (length + i) + torch.zeros(1, dtype=torch.long)
            logits, _ = target.forward(token, pos, pos, length + i + 1, None)
            token = logits[0].argmax(-1, keepdim=True)
            out.append(token)
        return torch.cat(out)

    chunked = torch.compile(steps, dynamic=True)

    def one_per_call(n: int) -> list[int]:
        out, length = [int(prefill(target, prompt)[0].argmax())], prompt.numel()
        for i in range(n):
            pos = torch.tensor([length + i])
            out.append(int(target.step(torch.tensor([out[-1]]), pos, pos, length + i + 1, None)[0][0].argmax()))
        return out

    def per_graph(n: int) -> list[int]:
        out, length = [int(prefill(target, prompt)[0].argmax())], prompt.numel()
        for i in range(0, n, a.chunk):
            out += chunked(torch.tensor([out[-1]]), length + i, a.chunk).tolist()
        return out[: n + 1]

    with torch.inference_mode():
        seconds, _ = compile_steps([target], lambda: (one_per_call(8), per_graph(8)))
        same = one_per_call(a.tokens) == per_graph(a.tokens)
        times: dict[str, list[float]] = {"one": [], "chunk": []}
        for _ in range(a.repeats):
            for name, fn in (("one", one_per_call), ("chunk", per_graph)):
                t0 = time.perf_counter()
                fn(a.tokens)
                times[name].append(time.perf_counter() - t0)
    one, chunk = (1000 * statistics.median(times[k]) / a.tokens for k in ("one", "chunk"))
    print(f"compiled in {seconds} s; tokens identical: {same}")
    print(f"one compiled call per token: {one:.2f} ms/token; {a.chunk} tokens per graph: {chunk:.2f} ms/token; "
          f"ratio {one / chunk:.2f}x")


if __name__ == "__main__":
    main()
