#!/usr/bin/env python
"""What the runtime's torch.compile warm-up costs the first time on a machine and every time after, in one run.

    python scripts/bench_compile.py runs/demo
    python scripts/bench_compile.py runs/demo --runs 3 --json
    python scripts/bench_compile.py runs/demo --draft-kernels linear,linear,linear,native16,native16,linear,linear,linear,linear

Each run is a new process (as a new `trtspec validate` is) that loads the bundle and compiles the decode, verify
and draft passes the way validate does (measure.warm_up: the verify pass and the draft's passes on every row count
the bundle's draft config verifies, then one plain and one speculative generation of the first held-out prompt).
The first run starts from an empty inductor cache folder, the later ones reuse it. Each row says how many graphs
dynamo compiled and, for the empty cache, how many C++ libraries inductor built (about a second of g++ each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from trtspec.bench import arg_parser
from trtspec.errors import run_main

ONE_RUN = """
import json, os, torch
from pathlib import Path
from torch._dynamo.utils import counters
from trtspec.bench import load_prompts, open_bundle
from trtspec.measure import warm_up
from trtspec.runtime import DraftSpec, generate, speculative_decode
from trtspec.runtime.kernels import Linear
run = Path({run!r})
bundle = open_bundle(run)
target, drafter = bundle.runtime()
if {kernels!r}:  # the same products in every run, so that runs differ only in the code compiled
    for m in drafter.net.modules():
        if isinstance(m, Linear):
            m.kernels = tuple({kernels!r}.split(","))
p = torch.tensor(load_prompts(run, bundle.tok, 1)[0])
d = json.loads((bundle.path / "manifest.json").read_text())["config"]["draft"]
spec = DraftSpec(shape="chain", k={k} or d["length"], suffix_len={suffix_len!r} if {suffix_len!r} is not None else d.get("suffix_len") or 0)
seconds, note = warm_up(target, [(drafter, spec)], lambda: (generate(target, p, 32), speculative_decode(target, drafter, p, 32, spec)))
libraries = sum(1 for _ in Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).rglob("*.so"))
print(json.dumps({{"seconds": seconds, "note": note, "graphs": counters["stats"]["unique_graphs"], "max_rows": spec.max_nodes(),
                  "cpp_libraries": libraries,
                  "draft_kernels": next(m.kernels for m in drafter.net.modules() if isinstance(m, Linear))}}))
"""


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--runs", type=int, default=2, help="processes in a row: the first with an empty cache")
    ap.add_argument("--k", type=int, default=0, help="draft length of the warm-up (default: the bundle's draft.length)")
    ap.add_argument("--suffix-len", type=int,
                    help="suffix drafts of up to this many tokens, verified by the same passes (default: the bundle's "
                    "draft.suffix_len): the warm-up covers row counts 1..max(k + 1, suffix_len + 1)")
    ap.add_argument("--draft-kernels", default="", metavar="K1,...,K9",
                    help="the draft's product kernel for 1, 2, ..., 8 rows and for 9-64 (default: this machine's "
                    "load-time choice, which can differ between runs)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.draft_kernels:
        from trtspec.runtime.kernels import CANDIDATES, TIMED_ROWS

        names = a.draft_kernels.split(",")
        if len(names) != len(TIMED_ROWS) or not set(names) <= set(CANDIDATES):
            sys.exit(f"error: --draft-kernels takes {len(TIMED_ROWS)} comma-separated kernels of {', '.join(CANDIDATES)}; "
                     f"got '{a.draft_kernels}'")
    code = ONE_RUN.format(run=str(a.run_dir), k=a.k, suffix_len=a.suffix_len, kernels=a.draft_kernels)
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        for i in range(a.runs):
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"error: run {i + 1} failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({"run": i + 1, "cache": "empty" if i == 0 else "warm", **r})
            if not a.json:
                print(f"run {i + 1} ({rows[-1]['cache']} cache): {r['seconds']:.1f} s, {r['graphs']} graphs (row counts "
                      f"1..{r['max_rows']}), {r['cpp_libraries']} C++ libraries in the cache — {r['note']}", flush=True)
    if a.json:
        print(json.dumps({"run_dir": str(a.run_dir), "rows": rows}, indent=2))


if __name__ == "__main__":
    run_main(main)
