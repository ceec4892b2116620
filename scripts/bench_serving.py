#!/usr/bin/env python
"""A bundle served by vLLM's OpenAI server with and without its EAGLE-3 draft, loaded by NVIDIA's load generator
aiperf at each concurrency: output tokens/s, time to first token and inter-token latency side by side, the
acceptance length vLLM counted at each level, and where speculation stops paying.

    bash scripts/setup.sh --engines vllm --bench     # aiperf in .venv-bench: its pins clash with vLLM's
    python scripts/bench_serving.py runs/demo --concurrency 1 4 16 32 --json bench.json

The prompts are the run's held-out conversations (data/heldout.jsonl, their user turn, chat endpoint, greedy, up to
--max-tokens): text the head was not trained on, as a user's would be. Each level sends max(2 x concurrency,
--min-requests) requests after a warm-up of min(concurrency, 4). Greedy answers are the same with and without the
draft (lossless), so both servers generate the same tokens and tokens/s compare directly. Servers bind 127.0.0.1.
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


def vllm_command(bundle: Path, port: int, draft: bool, max_seqs: int) -> list[str]:
    from trtspec.deploy.vllm_engine import target_dtype

    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(bundle / "target"),
           "--served-model-name", "bundle", "--dtype", target_dtype(bundle / "target"), "--max-model-len", "1024",
           "--max-num-seqs", str(max_seqs), "--host", "127.0.0.1", "--port", str(port)]
    if draft:
        from trtspec.deploy.serving import read_options

        k = read_options(bundle)["speculative_config"]["max_draft_len"]
        cmd += ["--speculative-config", json.dumps({"method": "eagle3", "model": str(bundle / "draft"),
                                                    "num_speculative_tokens": k})]
    return cmd


def start_vllm(bundle: Path, draft: bool, max_seqs: int, log: Path, timeout_s: float) -> tuple[subprocess.Popen, int]:
    """vLLM's OpenAI server on a free loopback port; returns once /v1/models answers."""
    import torch

    from trtspec.deploy.vllm_engine import cpu_environment

    port = free_port()
    env = dict(os.environ)
    if not torch.cuda.is_available():  # the CPU build's KV cache and thread binding; the server keeps its engine process
        cpu = {k: v for k, v in cpu_environment(kv_cache_gib=2).items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
        env = {**cpu, **env}
    extra = [] if torch.cuda.is_available() else ["--enforce-eager"]
    with log.open("w") as out:
        proc = subprocess.Popen(vllm_command(bundle, port, draft, max_seqs) + extra, env=env, stdout=out,
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


def measure(bundle: Path, draft: bool, args, aiperf: str, prompts: Path, work: Path) -> dict[int, dict]:
    label = "draft" if draft else "base"
    proc, port = start_vllm(bundle, draft, max(args.concurrency), work / f"vllm-{label}.log", args.server_timeout)
    rows = {}
    try:
        for c in args.concurrency:
            before = spec_counters(port) if draft else {}
            summary = run_aiperf(aiperf, port, bundle / "target", prompts, c, max(2 * c, args.min_requests),
                                 args.max_tokens, work / f"aiperf-{label}-c{c}", args.level_timeout)
            after = spec_counters(port) if draft else {}
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


def table(spec: dict[int, dict], base: dict[int, dict]) -> tuple[str, str]:
    """The side-by-side table (markdown) and where speculation stops paying."""
    def f(v, fmt="{:.1f}"):
        return "n/a" if v is None else fmt.format(v)

    lines = ["| concurrency | tok/s draft | tok/s base | speedup | TTFT ms draft / base | ITL ms draft / base | AL |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    pays, costs = [], []
    for c in spec:
        s, b = spec[c], base[c]
        ratio = s["tokens_per_s"] / b["tokens_per_s"] if s["tokens_per_s"] and b["tokens_per_s"] else None
        (pays if ratio and ratio >= 1 else costs).append(f"{c}" + ("" if ratio is None or ratio >= 1 else f" ({ratio:.2f}x)"))
        lines.append(f"| {c} | {f(s['tokens_per_s'])} | {f(b['tokens_per_s'])} | {f(ratio, '{:.2f}x')} | "
                     f"{f(s['ttft_ms'], '{:.0f}')} / {f(b['ttft_ms'], '{:.0f}')} | {f(s['itl_ms'])} / {f(b['itl_ms'])} | "
                     f"{f(s['acceptance_length'], '{:.2f}')} |")
    where = "; ".join(([f"speculation pays at concurrency {', '.join(pays)}"] if pays else [])
                      + ([f"costs at {', '.join(costs)}"] if costs else []))
    return "\n".join(lines), where


def main() -> int:
    ap = arg_parser(__doc__)
    ap.add_argument("run", type=Path, help="a trtspec run directory with a finished export (its bundle/)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--min-requests", type=int, default=8, help="requests per level at least (else 2 x concurrency)")
    ap.add_argument("--aiperf", default=None, help="the aiperf executable (default: PATH, then .venv-bench)")
    ap.add_argument("--work", type=Path, default=None, help="folder for logs and aiperf artifacts (default: RUN/bench)")
    ap.add_argument("--server-timeout", type=float, default=600, help="seconds for vLLM to come up")
    ap.add_argument("--level-timeout", type=float, default=900, help="seconds for one concurrency level")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here too")
    args = ap.parse_args()
    bundle = args.run / "bundle"
    if not (bundle / "target" / "config.json").is_file() or not (bundle / "draft" / "config.json").is_file():
        sys.exit(f"Error: '{args.run}' has no exported bundle (target/ and draft/)")
    aiperf = find_aiperf(args.aiperf)
    work = args.work or args.run / "bench"
    work.mkdir(parents=True, exist_ok=True)
    prompts = work / "prompts.jsonl"
    n = write_prompts(args.run, prompts)
    print(f"{n} held-out prompts, concurrency {args.concurrency}, up to {args.max_tokens} tokens, aiperf {aiperf}",
          file=sys.stderr)
    spec = measure(bundle, True, args, aiperf, prompts, work)
    base = measure(bundle, False, args, aiperf, prompts, work)
    text, where = table(spec, base)
    print(text + "\n\n" + where)
    if args.json:
        args.json.write_text(json.dumps({"draft": spec, "base": base, "crossover": where}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
