#!/usr/bin/env python
"""A bundle served by vLLM's OpenAI server at each draft length (0 = no draft), loaded by NVIDIA's load generator
aiperf at each concurrency: output tokens/s, time to first token, inter-token latency and the acceptance length vLLM
counted, side by side; the draft length per batch size the sweep implies, measured against the best fixed length and
against no draft at each level, and saved for `trtspec deploy triton RUN --drafting auto` (RUN/bench/sweep.json).

    bash scripts/setup.sh --engines vllm --bench     # aiperf in .venv-bench: its pins clash with vLLM's
    python scripts/bench_serving.py runs/demo --concurrency 1 4 16 32 --draft-lengths 0 1 2 3

The prompts are the run's held-out conversations (data/heldout.jsonl, their user turn, chat endpoint, greedy, up to
--max-tokens): text the head was not trained on, as a user's would be. Each level sends max(2 x concurrency,
--min-requests) requests after a warm-up of min(concurrency, 4). Greedy answers are the same at every draft length
(lossless), so the servers generate the same tokens and tokens/s compare directly. Servers bind 127.0.0.1.
Default --draft-lengths: 0 and the bundle's draft length (with and without the draft).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from trtspec.bench import arg_parser
from trtspec.draft_schedule import best_lengths, schedule_from_sweep, with_schedule_vllm

ROOT = Path(__file__).resolve().parents[1]
SPEC_COUNTERS = {"drafts": "vllm:spec_decode_num_drafts", "accepted": "vllm:spec_decode_num_accepted_tokens"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_aiperf(given: str | None) -> str:
    for candidate in (given, shutil.which("aiperf"), str(ROOT / ".venv-bench" / "bin" / "aiperf")):
        if candidate and Path(candidate).is_file():
            return candidate
    sys.exit("Error: aiperf not found (bash scripts/setup.sh --bench installs it in .venv-bench; or pass --aiperf)")


def write_prompts(run: Path, out: Path) -> int:
    """aiperf single_turn JSONL from the run's held-out conversations (the user turn of one-turn prompts)."""
    rows = [json.loads(line) for line in (run / "data" / "heldout.jsonl").read_text().splitlines() if line.strip()]
    texts = [r["messages"][-2]["content"] for r in rows if len(r["messages"]) >= 2 and r["messages"][-2]["role"] == "user"]
    if not texts:
        sys.exit(f"Error: {run}/data/heldout.jsonl holds no user prompt")
    out.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return len(texts)


def vllm_command(bundle: Path, port: int, spec: dict | None, max_seqs: int) -> list[str]:
    """vLLM's OpenAI server over bundle/target; spec: its speculative_config (None: no draft)."""
    from trtspec.deploy.vllm_engine import target_dtype

    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(bundle / "target"),
           "--served-model-name", "bundle", "--dtype", target_dtype(bundle / "target"), "--max-model-len", "1024",
           "--max-num-seqs", str(max_seqs), "--host", "127.0.0.1", "--port", str(port)]
    return cmd + (["--speculative-config", json.dumps(spec)] if spec else [])


def speculative_configs(bundle: Path, lengths: list[int]) -> dict[int, dict | None]:
    """{k: vLLM's speculative_config drafting k tokens with the bundle's draft} (k = 0: None, no draft)."""
    from trtspec.deploy.serving import read_options, vllm_speculative_config

    spec = vllm_speculative_config(read_options(bundle), str(bundle / "draft"))
    spec.pop("num_speculative_tokens_per_batch_size", None)  # a fixed length per server here
    return {k: {**spec, "num_speculative_tokens": k} if k else None for k in lengths}


def start_vllm(bundle: Path, spec: dict | None, max_seqs: int, log: Path, timeout_s: float,
               preload_iomp: bool = True) -> tuple[subprocess.Popen, int]:
    """vLLM's OpenAI server on a free loopback port; returns once /v1/models answers. preload_iomp: the CPU build
    with Intel OpenMP preloaded, as vLLM's CPU docs ask (it warns of slow speculative decoding without)."""
    import torch

    from trtspec.deploy.vllm_engine import cpu_environment

    port = free_port()
    env = dict(os.environ)
    if not torch.cuda.is_available():  # the CPU build's KV cache and thread binding; the server keeps its engine process
        cpu = {k: v for k, v in cpu_environment(kv_cache_gib=2).items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
        env = {**cpu, **env}
        iomp = Path(sys.prefix) / "lib" / "libiomp5.so"  # vLLM's CPU docs: Intel OpenMP preloaded (installed with it)
        if preload_iomp and iomp.is_file() and "libiomp" not in env.get("LD_PRELOAD", ""):
            env["LD_PRELOAD"] = ":".join(filter(None, [env.get("LD_PRELOAD"), str(iomp)]))
    extra = [] if torch.cuda.is_available() else ["--enforce-eager"]
    with log.open("w") as out:
        proc = subprocess.Popen(vllm_command(bundle, port, spec, max_seqs) + extra, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + timeout_s
    while True:
        if proc.poll() is not None:
            sys.exit(f"Error: vLLM exited ({proc.returncode}); see {log}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
            return proc, port
        except OSError:
            if time.time() > deadline:
                stop(proc)
                sys.exit(f"Error: vLLM not ready within {timeout_s:.0f} s; see {log}")
            time.sleep(2)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def spec_counters(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return {key: sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:_total)?{{[^}}]*}} (\S+)$", text, re.M))
            for key, name in SPEC_COUNTERS.items()}


def run_aiperf(aiperf: str, port: int, tokenizer: Path, prompts: Path, concurrency: int, requests: int,
               max_tokens: int, out: Path, timeout_s: float) -> dict:
    """One aiperf profile at a fixed concurrency -> its summary metrics (profile_export_aiperf.json)."""
    cmd = [aiperf, "profile", "--model", "bundle", "--url", f"http://127.0.0.1:{port}", "--endpoint-type", "chat",
           "--streaming", "--tokenizer", str(tokenizer), "--input-file", str(prompts),
           "--custom-dataset-type", "single_turn", "--concurrency", str(concurrency), "--request-count", str(requests),
           "--warmup-request-count", str(min(concurrency, 4)), "--extra-inputs",
           json.dumps({"temperature": 0, "max_tokens": max_tokens}), "--output-artifact-dir", str(out),
           "--ui-type", "none", "--random-seed", "0"]
    log = out.with_suffix(".log")
    with log.open("w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s)
    exports = sorted(out.rglob("profile_export_aiperf.json"))
    if done.returncode != 0 or not exports:
        sys.exit(f"Error: aiperf failed at concurrency {concurrency} (exit {done.returncode}); see {log}")
    return json.loads(exports[-1].read_text())


def stat(summary: dict, name: str, field: str = "avg") -> float | None:
    """A metric from aiperf's JSON export: {"name": {"avg": ..., "p50": ..., "unit": ...}} (top level or under
    "records", depending on the release)."""
    entry = summary.get(name) or summary.get("records", {}).get(name) or {}
    return entry.get(field) if isinstance(entry, dict) else None


def measure(bundle: Path, spec: dict | None, label: str, args, aiperf: str, prompts: Path, work: Path) -> dict[int, dict]:
    """One server (spec: its speculative_config, None = no draft) under aiperf at each concurrency."""
    proc, port = start_vllm(bundle, spec, max(args.concurrency), work / f"vllm-{label}.log", args.server_timeout,
                             not args.no_iomp)
    rows = {}
    try:
        for c in args.concurrency:
            before = spec_counters(port) if spec else {}
            summary = run_aiperf(aiperf, port, bundle / "target", prompts, c, max(2 * c, args.min_requests),
                                 args.max_tokens, work / f"aiperf-{label}-c{c}", args.level_timeout)
            after = spec_counters(port) if spec else {}
            drafts = after.get("drafts", 0) - before.get("drafts", 0)
            rows[c] = {
                "tokens_per_s": stat(summary, "output_token_throughput"),
                "ttft_ms": stat(summary, "time_to_first_token"),
                "itl_ms": stat(summary, "inter_token_latency"),
                "requests_per_s": stat(summary, "request_throughput"),
                "acceptance_length": round(1 + (after["accepted"] - before["accepted"]) / drafts, 3) if drafts else None,
            }
            print(f"{label} c={c}: {rows[c]}", file=sys.stderr)
    finally:
        stop(proc)
    return rows


def fmt(v, f="{:.1f}") -> str:
    return "n/a" if v is None else f.format(v)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def sweep_table(rows: dict[int, dict[int, dict]], scheduled: dict[int, dict] | None) -> tuple[str, str]:
    """The side-by-side table (markdown: tokens/s at each draft length, the fastest, the schedule against it and
    against no draft, AL at the longest draft) and where speculation stops paying at the longest draft."""
    lengths = sorted(rows)
    levels = sorted({c for r in rows.values() for c in r})
    tps = {k: {c: rows[k][c]["tokens_per_s"] for c in rows[k]} for k in lengths}
    best = best_lengths(tps)
    head = "| concurrency | " + " | ".join(f"k={k} tok/s" for k in lengths) + " | fastest k |"
    if scheduled:
        head += " schedule tok/s | vs fastest k | vs no draft |"
    head += f" AL k={lengths[-1]} |"
    lines = [head, "|" + "---:|" * (head.count("|") - 1)]
    pays, costs = [], []
    for c in levels:
        r = ratio(tps[lengths[-1]].get(c), tps.get(0, {}).get(c))
        if 0 in tps and r is not None:
            (pays if r >= 1 else costs).append(f"{c}" + ("" if r >= 1 else f" ({r:.2f}x)"))
        line = f"| {c} | " + " | ".join(fmt(tps[k].get(c)) for k in lengths) + f" | {best.get(c, 'n/a')} |"
        if scheduled:
            s = scheduled.get(c, {}).get("tokens_per_s")
            line += (f" {fmt(s)} | {fmt(ratio(s, tps[best[c]][c]) if c in best else None, '{:.2f}x')} |"
                     f" {fmt(ratio(s, tps.get(0, {}).get(c)), '{:.2f}x')} |")
        lines.append(line + f" {fmt(rows[lengths[-1]].get(c, {}).get('acceptance_length'), '{:.2f}')} |")
    where = "; ".join(([f"k={lengths[-1]} pays at concurrency {', '.join(pays)}"] if pays else [])
                      + ([f"costs at {', '.join(costs)}"] if costs else []))
    return "\n".join(lines), where


def main() -> int:
    from trtspec.artifacts import RunDir, output_fingerprint
    from trtspec.deploy.serving import SWEEP_FILE, read_options

    ap = arg_parser(__doc__)
    ap.add_argument("run", type=Path, help="a trtspec run directory with a finished export (its bundle/)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--draft-lengths", type=int, nargs="+", default=None,
                    help="draft lengths to serve, 0 = no draft (default: 0 and the bundle's)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--min-requests", type=int, default=8, help="requests per level at least (else 2 x concurrency)")
    ap.add_argument("--aiperf", default=None, help="the aiperf executable (default: PATH, then .venv-bench)")
    ap.add_argument("--work", type=Path, default=None, help="folder for logs and aiperf artifacts (default: RUN/bench)")
    ap.add_argument("--server-timeout", type=float, default=600, help="seconds for vLLM to come up")
    ap.add_argument("--level-timeout", type=float, default=900, help="seconds for one concurrency level")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here too")
    ap.add_argument("--no-iomp", action="store_true", help="vLLM's CPU build without Intel OpenMP preloaded")
    args = ap.parse_args()
    bundle = args.run / "bundle"
    if not (bundle / "target" / "config.json").is_file() or not (bundle / "draft" / "config.json").is_file():
        sys.exit(f"Error: '{args.run}' has no exported bundle (target/ and draft/)")
    k_max = read_options(bundle)["speculative_config"]["max_draft_len"]
    lengths = sorted(set(args.draft_lengths if args.draft_lengths is not None else [0, k_max]))
    if bad := [k for k in lengths if not 0 <= k <= k_max]:
        sys.exit(f"Error: --draft-lengths {bad[0]}: the bundle drafts 0..{k_max} tokens")
    if bad := [c for c in args.concurrency if c < 1]:
        sys.exit(f"Error: --concurrency {bad[0]}: at least 1")
    aiperf = find_aiperf(args.aiperf)
    work = args.work or args.run / "bench"
    work.mkdir(parents=True, exist_ok=True)
    prompts = work / "prompts.jsonl"
    n = write_prompts(args.run, prompts)
    print(f"{n} held-out prompts, concurrency {args.concurrency}, draft lengths {lengths}, up to {args.max_tokens} "
          f"tokens, aiperf {aiperf}", file=sys.stderr)
    specs = speculative_configs(bundle, lengths)
    rows = {k: measure(bundle, specs[k], f"k{k}", args, aiperf, prompts, work) for k in lengths}
    schedule, decided = schedule_from_sweep({k: {c: r["tokens_per_s"] for c, r in rows[k].items()} for k in lengths})
    scheduled = None
    if schedule and len(set(schedule.values())) > 1:  # a schedule that is one fixed k was measured above
        spec = with_schedule_vllm({**specs[max(lengths)], "num_speculative_tokens": schedule[1]}, schedule)
        scheduled = measure(bundle, spec, "schedule", args, aiperf, prompts, work)
    text, where = sweep_table(rows, scheduled)
    print(text + "\n\n" + (where + "\n" if where else "") + f"schedule: {schedule} ({decided})")
    export = RunDir(args.run).manifest("export")
    result = {"kind": "trtspec/serving-sweep", "engine": "vllm", "bundle": output_fingerprint(export) if export else None,
              "concurrency": args.concurrency, "draft_lengths": lengths, "max_tokens": args.max_tokens,
              "rows": rows, "schedule": schedule, "decided": decided, "scheduled": scheduled, "crossover": where}
    (work / SWEEP_FILE).write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
