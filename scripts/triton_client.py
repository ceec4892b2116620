#!/usr/bin/env python
"""Send one prompt to the Triton `tensorrt_llm` model (LLM-API backend) and print the text and draft acceptance.

    pip install "tritonclient[http]"        # or: pip install trtspec[triton]
    trtspec deploy triton runs/demo --out deploy && deploy/launch.sh
    python scripts/triton_client.py --url localhost:8000 --prompt "Name three colors."

acceptance_rate = total_accepted_draft_tokens / total_draft_tokens (TensorRT-LLM's counters for the request);
with max_draft_len k and a linear draft, acceptance length = 1 + accepted / (drafted / k).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def tensor(name: str, value, dtype):
    import tritonclient.http as httpclient

    arr = np.array([value], dtype=dtype)
    t = httpclient.InferInput(name, list(arr.shape), {np.object_: "BYTES", np.int32: "INT32", np.float32: "FP32",
                                                      np.bool_: "BOOL"}[dtype])
    t.set_data_from_numpy(arr)
    return t


def scalar(result, name: str) -> float | None:
    """An output as a number; TensorRT-LLM's model.py may send the metrics as strings."""
    arr = result.as_numpy(name)
    if arr is None or arr.size == 0:
        return None
    v = arr.reshape(-1)[0]
    return float(v.decode() if isinstance(v, bytes) else v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="localhost:8000", help="Triton HTTP endpoint")
    ap.add_argument("--model", default="tensorrt_llm")
    ap.add_argument("--prompt", default="Name three colors.")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-draft-len", type=int, default=None, help="to print the acceptance length as well")
    args = ap.parse_args()
    try:
        import tritonclient.http as httpclient
    except ImportError:
        print("Error: tritonclient is not installed (pip install 'tritonclient[http]')", file=sys.stderr)
        return 3

    client = httpclient.InferenceServerClient(url=args.url)
    inputs = [
        tensor("text_input", args.prompt.encode(), np.object_),
        tensor("sampling_param_max_tokens", args.max_tokens, np.int32),
        tensor("sampling_param_temperature", 0.0, np.float32),  # greedy, as the validation
        tensor("sampling_param_return_perf_metrics", True, np.bool_),
    ]
    result = client.infer(args.model, inputs)
    text = result.as_numpy("text_output").reshape(-1)[0]
    print(text.decode() if isinstance(text, bytes) else text)
    accepted, drafted = scalar(result, "total_accepted_draft_tokens"), scalar(result, "total_draft_tokens")
    print(f"acceptance_rate={scalar(result, 'acceptance_rate')} total_accepted_draft_tokens={accepted} "
          f"total_draft_tokens={drafted}", file=sys.stderr)
    if args.max_draft_len and drafted:
        print(f"acceptance_length={1 + accepted / (drafted / args.max_draft_len):.2f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
