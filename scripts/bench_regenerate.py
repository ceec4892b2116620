"""Regeneration throughput (the data stage's batched greedy answers), attention implementations and batch sizes side
by side in one run, interleaved: transformers' SDPA against trtspec's matmul attention (what the data stage uses on
a CPU). Prints tokens/s of each variant and its ratio to the first.

    python scripts/bench_regenerate.py build_configs/smollm2-135m-eagle3.yaml --prompts 256 \\
        --variant sdpa:64 --variant sdpa:128 --variant matmul:128
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("config")
    ap.add_argument("--prompts", type=int, default=256, help="the first N prompts of the config's regenerate source")
    ap.add_argument("--variant", action="append", default=[], help="ATTENTION:BATCH, ATTENTION = sdpa | matmul")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    variants = [(a, int(b)) for a, _, b in (v.partition(":") for v in args.variant or ["sdpa:64", "matmul:128"])]

    from trtspec.chat import encode_prompt, read_prompt_file
    from trtspec.config import load_config
    from trtspec.generation import hf_greedy
    from trtspec.models import load_answering_model, load_tokenizer, resolve_model, use_matmul_attention

    cfg = load_config(args.config)
    src = next((s for s in cfg.data.sources if s.kind == "regenerate"), None)
    if src is None:
        raise SystemExit("Error: the config has no 'regenerate' data source")
    path = resolve_model(cfg.model.source)
    tok = load_tokenizer(path)
    model = load_answering_model(path, cfg)
    dtype = str(model.dtype).removeprefix("torch.")
    prompts = read_prompt_file(cfg.resolve_path(src.path), Counter())[: args.prompts]
    ids = sorted((encode_prompt(tok, p["messages"]) for p in prompts), key=len)

    totals = {v: [0, 0.0] for v in variants}
    for rep in range(args.repeats):
        for attention, batch in variants:
            model.set_attn_implementation("sdpa") if attention == "sdpa" else use_matmul_attention(model)
            t0 = time.perf_counter()
            tokens = sum(len(a) for i in range(0, len(ids), batch)
                         for a in hf_greedy(model, ids[i : i + batch], cfg.data.max_new_tokens, {tok.eos_token_id}, tok.pad_token_id))
            seconds = time.perf_counter() - t0
            totals[(attention, batch)][0] += tokens
            totals[(attention, batch)][1] += seconds
            if not args.json:
                print(f"repeat {rep}: {attention:6s} batch {batch:4d}: {tokens} tokens in {seconds:.1f} s", flush=True)
    rows = [{"attention": a, "batch": b, "tokens_per_s": round(n / s, 1)} for (a, b), (n, s) in totals.items()]
    for r in rows:
        r["ratio"] = round(r["tokens_per_s"] / rows[0]["tokens_per_s"], 2)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"\n{len(ids)} prompts, {cfg.data.max_new_tokens} new tokens max, {dtype}, {args.repeats} interleaved repeats")
    for r in rows:
        print(f"{r['attention']:6s} batch {r['batch']:4d}: {r['tokens_per_s']:7.1f} tokens/s  {r['ratio']:.2f}x")


if __name__ == "__main__":
    main()
