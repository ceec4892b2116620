"""The target's hidden states for draft training from HF and from vLLM, side by side in one run (train.states_from).

    python scripts/bench_states.py                                   # the demo target, then a tiny qwen3_moe
    python scripts/bench_states.py --models demo:smollm2-135m-instruct,tiny:qwen3_moe,tiny:gemma3 --rows 64

For each target: tokens/s of trtspec's HF forward (HFStates, batches of 16 padded rows) and of vLLM's
extract_hidden_states (VllmStates), on the rows shortest first as the offline cache hands them over (`cache_states`:
little padding in HF's batches; --unsorted: in the given order, as streamed training reads them), rounds alternated
(HF, vLLM, HF, ...) so that a drift of the host's speed falls on both; the ratio is the median of the rounds' ratios.
Each round reads rows of its own (another seed): rows a round before had left in vLLM's prefix cache would be read
back, not computed (the offline cache extracts each row once). Both in the precision the train stage would use here
(bf16 where the CPU has it natively). Also what the states take on disk: the offline cache for these rows at
data.seq_len against the streamed buffer (train.states_buffer_mib) and vLLM's largest window of files. A family vLLM
cannot extract from prints why and its HF figure alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from trtspec.errors import run_main
from trtspec.measure import timed


def rows_of(n: int, seq_len: int, vocab: int, seed: int = 0) -> list:
    """n rows of random token ids, lengths spread over [seq_len / 3, seq_len] as real chat rows are."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(seq_len // 3, seq_len + 1, (n,), generator=g).tolist()
    return [torch.randint(10, min(vocab, 30000), (t,), generator=g) for t in lengths]


def bench_model(source: str, rounds: list[list], seq_len: int, buffer_mib: float) -> dict:
    """rounds: each round's rows (HF and vLLM read the same ones in a round; no round repeats another's)."""
    from trtspec.models import load_model, resolve_model, use_bf16
    from trtspec.targets import read_family
    from trtspec.training.engine_states import VllmStates, final_norm, refusal, target_dtype_for_states
    from trtspec.training.states import HFStates, states_bytes, window_rows

    model_dir = resolve_model(source)
    base = load_model(model_dir, "auto")
    layers, hidden = base.config.num_hidden_layers, base.config.hidden_size
    aux = [1, layers // 2 - 1, layers - 4] if layers >= 8 else [0, 1, layers - 2]
    bf16 = use_bf16("auto")
    tokens = sum(len(r) for batch in rounds for r in batch)  # each engine's, over all rounds
    hf = HFStates(base, aux, bf16)
    why = refusal(json_config(model_dir))
    out = {"model": source, "family": read_family(model_dir).name, "tokens": tokens, "precision": "bf16" if bf16 else "fp32"}
    folder = Path(tempfile.mkdtemp(prefix="bench-states-"))
    vllm = None if why else VllmStates(model_dir, aux, layers, final_norm(base), folder, target_dtype_for_states(bf16, model_dir),
                                       seq_len + 8)
    warm = rows_of(2, seq_len, 1000, seed=10**6)  # load and warm up outside the timed rounds, on rows no round reads
    if vllm is not None:
        vllm.extract(warm)
    hf.extract(warm)
    hf_s, vllm_s = [], []
    for batch in rounds:
        hf_s.append(timed(lambda batch=batch: hf.extract(batch))[1])
        if vllm is not None:
            vllm_s.append(timed(lambda batch=batch: vllm.extract(batch))[1])
    out["hf_tokens_per_s"] = round(tokens / sum(hf_s), 1)
    offline = states_bytes({"input_ids": _Shape(len(rounds[0]), seq_len)}, hidden, len(aux))
    window = window_rows(buffer_mib, seq_len, hidden, len(aux))
    out["offline_cache_mib"] = round(offline / 2**20, 1)
    out["streamed_buffer_mib"] = round(window * 2 * seq_len * hidden * (len(aux) + 1) / 2**20, 1)
    if vllm is None:
        out["vllm"] = f"refused: {why}"
        return out
    out["vllm_tokens_per_s"] = round(tokens / sum(vllm_s), 1)
    out["vllm_over_hf"] = round(statistics.median(h / v for h, v in zip(hf_s, vllm_s, strict=True)), 2)
    out["vllm_files_peak_mib"] = round(vllm.peak_disk / 2**20, 1)
    out["rounds"] = {"hf_s": [round(x, 2) for x in hf_s], "vllm_s": [round(x, 2) for x in vllm_s]}
    vllm.close()
    return out


class _Shape:
    """states_bytes reads only .shape of the token ids."""

    def __init__(self, n: int, t: int):
        self.shape = (n, t)


def json_config(model_dir: Path):
    from types import SimpleNamespace

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return SimpleNamespace(**{**cfg, **cfg.get("text_config", {})})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="demo:smollm2-135m-instruct,tiny:qwen3_moe,tiny:gemma3")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=192, help="the longest row (the demo's data.seq_len)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--buffer-mib", type=float, default=64)
    ap.add_argument("--unsorted", action="store_true", help="rows in their random order (streamed training's), not "
                    "shortest first (the offline cache's)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    results = []
    for source in a.models.split(","):
        from trtspec.models import load_model, resolve_model

        vocab = load_model(resolve_model(source), "auto").config.vocab_size
        rounds = [rows_of(a.rows, a.seq_len, vocab, seed=i) for i in range(a.rounds)]
        rounds = rounds if a.unsorted else [sorted(rows, key=len) for rows in rounds]
        r = bench_model(source, rounds, a.seq_len, a.buffer_mib)
        r["order"] = "as given" if a.unsorted else "shortest first"
        results.append(r)
        if not a.json:
            v = (f"vLLM {r['vllm_tokens_per_s']} tok/s = {r['vllm_over_hf']}x" if "vllm_over_hf" in r else r["vllm"])
            print(f"{r['model']} ({r['family']}, {r['precision']}, {r['tokens']} tokens, {r['order']}): HF {r['hf_tokens_per_s']} tok/s, "
                  f"{v}; disk: offline cache {r['offline_cache_mib']} MiB, streamed buffer {r['streamed_buffer_mib']} MiB"
                  + (f", vLLM's files at most {r['vllm_files_peak_mib']} MiB" if "vllm_files_peak_mib" in r else ""),
                  flush=True)
    if a.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    run_main(main)
