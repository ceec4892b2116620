"""The train stage on each source of the target's states, side by side on one run's data and draft: the HF forward
in the trainer, vLLM in the trainer, and a states server (vLLM's OpenAI server with the extraction, started here by
the launch line `trtspec states-server` prints, as a user would start it on the target's GPUs).

    python scripts/bench_states_sources.py build_configs/smollm2-135m-eagle3-ci.yaml --out runs/bench-states
    python scripts/bench_states_sources.py build_configs/smollm2-135m-eagle3.yaml --out runs/bench-states-demo

Builds data and convert once (DIR/base), then trains a copy of that run per source, one after the other, each in a
process of its own. Prints held-out AL with its interval, AL on training rows, the stage's states and training
seconds, the trainer's peak RSS (vLLM's engine included where it runs in the trainer; the server's not), and what of
the target the trainer held.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from trtspec.bench import stage_metrics
from trtspec.engines.vllm.sweep import end_group, free_port
from trtspec.errors import run_main

CLI = [sys.executable, "-m", "trtspec.cli"]
SOURCES = {  # name -> the train section's overrides
    "hf, offline": ["train.states_from=hf", "train.mode=offline"],
    "vllm, offline": ["train.states_from=vllm", "train.mode=offline"],
    "endpoint, streamed": ["train.states_from=endpoint", "train.mode=streamed"],
}


def sets(pairs: list[str]) -> list[str]:
    return [x for kv in pairs for x in ("--set", kv)]


def run(args: list[str]) -> str:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(args[:3])} failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout


def start_server(line: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    port = line.split("--port ")[1].split()[0]
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", "-c", line], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    while True:
        if proc.poll() is not None:
            sys.exit(f"the states server exited ({proc.returncode}): see {log}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
            return proc
        except OSError:
            time.sleep(2)


def train(config: str, base: Path, out: Path, name: str, extra: list[str]) -> dict:
    """A copy of the base run (data and convert, not their scratch) trained from one source -> its figures."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(base, out, ignore=shutil.ignore_patterns(".work"))
    pairs = [*SOURCES[name], *extra]
    server = None
    if name.startswith("endpoint"):
        pairs += [f"train.states_endpoint.url=http://127.0.0.1:{free_port()}", f"train.states_endpoint.folder={out / 'shared'}"]
        line = json.loads(run(["states-server", config, "--out", str(out), "--json", *sets(pairs)]))["launch"]
        server = start_server(line, out / "server.log")
    try:
        t0 = time.perf_counter()
        run(["train", config, "--out", str(out), *sets(pairs)])
        wall = time.perf_counter() - t0
    finally:
        if server is not None:
            end_group(server)
    m = stage_metrics(out, "train")
    k = max((key for key in m if key.startswith("AL@") and key[3:].isdigit()), key=lambda key: int(key[3:]))
    return {"source": name, "al": m[k], "ci": m.get(f"{k}_ci95"), "fit": m["fit"][k],
            "k": k, "states_s": m["cache_states_s"], "train_s": m["train_s"], "wall_s": round(wall, 1),
            "rss": max(m["peak_rss_gib_by_rank"]), "held": m["target_in_trainer"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", action="append", default=[], help="more config overrides, KEY=VALUE")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    base = a.out / "base"
    run(["build", a.config, "--out", str(base), "--until", "convert", *sets(a.set)])
    rows = []
    for name in SOURCES:
        rows.append(train(a.config, base, a.out / name.split(",")[0], name, a.set))
        print(f"{name}: {rows[-1]['wall_s']} s", file=sys.stderr, flush=True)
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    hf = rows[0]
    print(f"| states | held-out {hf['k']} (95% CI) | on training rows | trainer holds (layers, parameters) | states s "
          "| train s | stage wall s | trainer peak RSS GiB | RSS / hf |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ci = f" ({r['ci'][0]:.3f}-{r['ci'][1]:.3f})" if r["ci"] else ""
        held = r["held"]
        print(f"| {r['source']} | {r['al']:.3f}{ci} | {r['fit']:.3f} | {held['decoder_layers']}/{held['of_layers']}, {held['parameters'] / 1e6:.1f}M "
              f"| {r['states_s']} | {r['train_s']} | {r['wall_s']} | {r['rss']:.2f} | {r['rss'] / hf['rss']:.2f}x |")


if __name__ == "__main__":
    run_main(main)
