#!/usr/bin/env python
"""What the runtime's torch.compile warm-up costs the first time on a machine and every time after, in one run.

    python scripts/bench_compile.py runs/demo
    python scripts/bench_compile.py runs/demo --runs 3 --json

Each run is a new process (as a new `trtspec validate` is) that loads the bundle and compiles the decode, verify
and draft passes the way validate does (warm-up: one plain and one speculative generation of the first held-out
prompt). The first run starts from an empty inductor cache folder, the later ones reuse it.
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
import json, torch
from pathlib import Path
from trtspec.bench import load_prompts, open_bundle
from trtspec.runtime import DraftSpec, compile_steps, generate, speculative_decode
run = Path({run!r})
bundle = open_bundle(run)
target, drafter = bundle.runtime()
p = torch.tensor(load_prompts(run, bundle.tok, 1)[0])
spec = DraftSpec(shape="chain", k={k})
seconds, note = compile_steps([target, drafter.net], lambda: (generate(target, p, 32), speculative_decode(target, drafter, p, 32, spec)))
print(json.dumps({{"seconds": seconds, "note": note}}))
"""


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--runs", type=int, default=2, help="processes in a row: the first with an empty cache")
    ap.add_argument("--k", type=int, default=1, help="draft length of the speculative warm-up")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    code = ONE_RUN.format(run=str(a.run_dir), k=a.k)
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
                print(f"run {i + 1} ({rows[-1]['cache']} cache): {r['seconds']:.1f} s — {r['note']}", flush=True)
    if a.json:
        print(json.dumps({"run_dir": str(a.run_dir), "rows": rows}, indent=2))


if __name__ == "__main__":
    run_main(main)
