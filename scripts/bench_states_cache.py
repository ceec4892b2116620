"""The offline cache of the target's states (the train stage's `cache_states`) filled from HF and from vLLM, side by
side in one process, on a run's own training rows.

    python scripts/bench_states_cache.py runs/demo --rows 384

HF with its 16 rows a call, vLLM with 16 and with 128 rows a call (`VllmStates.batch_rows`), HF and vLLM-128 twice,
alternated, so that a drift of the host's speed falls on both; vLLM's prefix cache emptied before each of its passes
(else the rows of a pass before are read back, not computed). The precision the train stage would use here (bf16
where the CPU has it natively). Prints tokens/s of real (unpadded) tokens and the ratios.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from trtspec.bench import verified
from trtspec.errors import run_main
from trtspec.measure import timed


def reset_prefix_cache(llm) -> None:
    llm.reset_prefix_cache()


def main() -> None:
    import torch

    from trtspec.models import load_model, resolve_model, use_bf16
    from trtspec.training.engine_states import VllmStates, final_norm, target_dtype_for_states
    from trtspec.training.states import HFStates, cache_states

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a run directory whose data stage is done (the demo's)")
    ap.add_argument("--rows", type=int, default=384)
    ap.add_argument("--model", default="demo:smollm2-135m-instruct")
    a = ap.parse_args()
    tokens = torch.load(verified(a.run, "data")[0] / "train_tokens.pt", weights_only=True)
    tokens = {k: v[: a.rows] for k, v in tokens.items()}
    model_dir = resolve_model(a.model)
    base = load_model(model_dir, "auto")
    layers, hidden = base.config.num_hidden_layers, base.config.hidden_size
    aux = [1, layers // 2 - 1, layers - 4]
    scratch = Path(tempfile.mkdtemp(prefix="bench-states-cache-"))
    bf16 = use_bf16("auto")
    vllm = VllmStates(model_dir, aux, layers, final_norm(base), scratch / "vllm", target_dtype_for_states(bf16, model_dir),
                      tokens["input_ids"].shape[1] + 8)
    vllm.extract([tokens["input_ids"][0, :16]])  # vLLM's load and warm-up outside the timing
    hf = HFStates(base, aux, bf16=bf16)
    real = int(tokens["attention_mask"].sum())
    seconds = {}
    for name, source, rows in (("hf", hf, 16), ("vllm-16", vllm, 16), ("vllm-128", vllm, 128), ("hf", hf, 16),
                               ("vllm-128", vllm, 128)):
        if source is vllm:
            vllm.call(reset_prefix_cache)
        _, s = timed(lambda source=source, rows=rows: cache_states(source, tokens, hidden, aux,
                                                                   Path(tempfile.mkdtemp(dir=scratch)), lambda *_: None, rows))
        seconds.setdefault(name, []).append(s)
        print(f"{name:9s} {s:6.1f} s  {real / s:7.0f} tok/s", flush=True)
    hf_s = sum(seconds["hf"]) / 2
    print(f"vLLM / HF tokens/s: {hf_s / seconds['vllm-16'][0]:.2f}x with 16 rows a call, "
          f"{hf_s / (sum(seconds['vllm-128']) / 2):.2f}x with 128")
    vllm.close()


if __name__ == "__main__":
    run_main(main)
