#!/usr/bin/env python
"""Send prompts to the Triton `tensorrt_llm` model (LLM-API backend) and print the text and draft acceptance.

    pip install "tritonclient[http,grpc]"   # or: pip install trtspec[triton]
    trtspec deploy triton runs/demo --out deploy && deploy/launch.sh
    python scripts/triton_client.py --prompt "Name three colors."                       # HTTP /infer
    python scripts/triton_client.py --protocol grpc --prompt "Name three colors."       # gRPC (port 8001)
    python scripts/triton_client.py --protocol grpc --stream --prompt "..."             # gRPC stream, step by step
    python scripts/triton_client.py --stream --prompt "..."                             # HTTP generate_stream

--stream needs a repository written with `trtspec deploy triton --streaming` (a decoupled model); plain /infer and
gRPC infer need one without. The model takes text as is: send the chat-formatted prompt (the llmapi model applies no
chat template).

acceptance_rate = total_accepted_draft_tokens / total_draft_tokens (TensorRT-LLM's counters for the request);
with max_draft_len k and a linear draft, acceptance length = 1 + accepted / (drafted / k).
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import numpy as np

from trtspec.errors import run_main

DEFAULT_PORTS = {"http": 8000, "grpc": 8001}
DATATYPES = {np.object_: "BYTES", np.int32: "INT32", np.float32: "FP32", np.bool_: "BOOL"}
COUNTERS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")


class ClientError(Exception):
    """The server's (or the connection's) error, in one line."""


@dataclass
class Answer:
    text: str
    responses: int  # 1, or one per decoding step when streaming
    first_response_s: float  # time to the first response (to the first token when streaming)
    seconds: float
    counters: dict[str, float] = field(default_factory=dict)  # COUNTERS the server sent
    finish_reason: str | None = None

    def acceptance_length(self, k: int) -> float | None:
        drafted = self.counters.get("total_draft_tokens")
        if not drafted:
            return None
        return 1 + self.counters["total_accepted_draft_tokens"] / (drafted / k)


def request_fields(prompt: str, max_tokens: int, stream: bool) -> dict[str, tuple[object, type]]:
    """The llmapi model's inputs for one greedy request, with its draft counters and finish reason asked for."""
    return {
        "text_input": (prompt.encode(), np.object_),
        "streaming": (stream, np.bool_),
        "sampling_param_max_tokens": (max_tokens, np.int32),
        "sampling_param_temperature": (0.0, np.float32),  # greedy, as the validation
        "sampling_param_return_perf_metrics": (True, np.bool_),
        "return_finish_reason": (True, np.bool_),
    }


def infer_inputs(module, fields: dict[str, tuple[object, type]]) -> list:
    inputs = []
    for name, (value, dtype) in fields.items():
        arr = np.array([value], dtype=dtype)
        t = module.InferInput(name, list(arr.shape), DATATYPES[dtype])
        t.set_data_from_numpy(arr)
        inputs.append(t)
    return inputs


def value(v) -> str | float:
    """An output element as text or a number; TensorRT-LLM's model.py may send the metrics as strings."""
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    return float(v)


def read_outputs(get) -> tuple[str, dict[str, float], str | None]:
    """(text_output, counters, finish_reason) from a response; `get(name)` gives an output's first element or None."""
    text = get("text_output")
    counters = {name: value(v) for name in COUNTERS if (v := get(name)) is not None}
    reason = get("finish_reason")
    return (text.decode() if isinstance(text, bytes) else str(text or "")), counters, (
        reason.decode() if isinstance(reason, bytes) else reason)


def first_element(result, name: str):
    arr = result.as_numpy(name)
    return None if arr is None or arr.size == 0 else arr.reshape(-1)[0]


def infer_client(protocol: str, url: str, timeout_s: float):
    try:
        if protocol == "grpc":
            import tritonclient.grpc as module
        else:
            import tritonclient.http as module
    except ImportError:
        raise ClientError(f"tritonclient is not installed (pip install 'tritonclient[{protocol}]')") from None
    if protocol == "grpc":
        return module, module.InferenceServerClient(url=url)
    return module, module.InferenceServerClient(url=url, connection_timeout=timeout_s, network_timeout=timeout_s)


def ask_infer(protocol: str, url: str, model: str, fields: dict, timeout_s: float) -> Answer:
    """One request, one response: HTTP /infer or gRPC ModelInfer."""
    from tritonclient.utils import InferenceServerException

    module, client = infer_client(protocol, url, timeout_s)
    t0 = time.perf_counter()
    try:
        kwargs = {"client_timeout": timeout_s} if protocol == "grpc" else {}
        result = client.infer(model, infer_inputs(module, fields), **kwargs)
    except InferenceServerException as e:
        raise ClientError(one_line(e.message() or str(e))) from None
    except (OSError, *connection_errors()) as e:  # the server went away (or never was there)
        raise ClientError(f"lost the connection to {url}: {one_line(str(e)) or type(e).__name__}") from None
    finally:
        client.close()
    seconds = time.perf_counter() - t0
    text, counters, reason = read_outputs(lambda name, r=result: first_element(r, name))
    return Answer(text, 1, seconds, seconds, counters, reason)


def connection_errors() -> tuple[type[Exception], ...]:
    """What tritonclient.http's transport (geventhttpclient) raises when the server closes the connection."""
    try:
        from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError
    except ImportError:
        return ()
    return HTTPConnectionClosed, HTTPParseError


def ask_grpc_stream(url: str, model: str, fields: dict, timeout_s: float) -> Answer:
    """A gRPC bidirectional stream: responses until the one Triton flags final."""
    from tritonclient.utils import InferenceServerException

    module, client = infer_client("grpc", url, timeout_s)
    responses: queue.Queue = queue.Queue()
    t0 = time.perf_counter()
    first = None
    text, counters, reason, count = "", {}, None, 0
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(model, infer_inputs(module, fields), enable_empty_final_response=True)
        while True:
            try:
                result, error = responses.get(timeout=max(0.0, t0 + timeout_s - time.perf_counter()))
            except queue.Empty:
                raise ClientError(f"no final response within {timeout_s:.0f} s") from None
            if error is not None:
                raise ClientError(one_line(error.message() if isinstance(error, InferenceServerException) else str(error)))
            first = first if first is not None else time.perf_counter() - t0
            if result.as_numpy("text_output") is not None:
                count += 1
                text, got, reason = read_outputs(lambda name, r=result: first_element(r, name))
                counters.update(got)
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    return Answer(text, count, first or 0.0, time.perf_counter() - t0, counters, reason)


def ask_http_stream(url: str, model: str, fields: dict, timeout_s: float) -> Answer:
    """HTTP generate_stream (server-sent events): the inputs as JSON fields, one event per response."""
    body = {name: (v.decode() if isinstance(v, bytes) else v) for name, (v, _) in fields.items()}
    req = urllib.request.Request(f"http://{url}/v2/models/{model}/generate_stream", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first = None
    text, counters, reason, count = "", {}, None, 0
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            for line in r:
                if not line.startswith(b"data:"):
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    raise ClientError(one_line(event["error"]))
                first = first if first is not None else time.perf_counter() - t0
                count += 1
                text, got, reason = read_outputs(lambda name, e=event: unlist(e.get(name)))
                counters.update(got)
    except urllib.error.HTTPError as e:
        raise ClientError(one_line(http_error(e))) from None
    except (urllib.error.URLError, TimeoutError) as e:
        raise ClientError(f"cannot reach {url}: {getattr(e, 'reason', e)}") from None
    return Answer(text, count, first or 0.0, time.perf_counter() - t0, counters, reason)


def unlist(v):
    return v[0] if isinstance(v, list) and v else v


def http_error(e: urllib.error.HTTPError) -> str:
    try:
        return json.loads(e.read())["error"]
    except (ValueError, KeyError):
        return f"HTTP {e.code} {e.reason}"


def one_line(message: str) -> str:
    return " ".join(str(message).split())


def ask(url: str, prompt: str, protocol: str = "http", model: str = "tensorrt_llm", max_tokens: int = 128,
        stream: bool = False, timeout_s: float = 300.0) -> Answer:
    """One greedy request to the llmapi model; raises ClientError with the server's message on failure."""
    fields = request_fields(prompt, max_tokens, stream)
    try:
        if stream:
            if protocol == "grpc":
                return ask_grpc_stream(url, model, fields, timeout_s)
            return ask_http_stream(url, model, fields, timeout_s)
        return ask_infer(protocol, url, model, fields, timeout_s)
    except ConnectionError as e:
        raise ClientError(f"cannot reach {url}: {e}") from None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="host:port of Triton's HTTP (8000) or gRPC (8001) endpoint")
    ap.add_argument("--protocol", choices=("http", "grpc"), default="http")
    ap.add_argument("--stream", action="store_true", help="stream the answer (needs deploy triton --streaming)")
    ap.add_argument("--model", default="tensorrt_llm")
    ap.add_argument("--prompt", action="append", help="repeatable; default: one demo prompt")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-draft-len", type=int, default=None, help="to print the acceptance length as well")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    ap.add_argument("--json", action="store_true", help="one JSON line per answer")
    args = ap.parse_args()
    url = args.url or f"localhost:{DEFAULT_PORTS[args.protocol]}"
    for prompt in args.prompt or ["Name three colors."]:
        try:
            a = ask(url, prompt, args.protocol, args.model, args.max_tokens, args.stream, args.timeout)
        except ClientError as e:
            print(f"Error: {e}", file=sys.stderr)
            return 1
        al = a.acceptance_length(args.max_draft_len) if args.max_draft_len else None
        if args.json:
            print(json.dumps({**a.__dict__, "acceptance_length": al}))
            continue
        print(a.text)
        print(f"responses={a.responses} first_response_s={a.first_response_s:.3f} seconds={a.seconds:.3f} "
              f"finish_reason={a.finish_reason} " + " ".join(f"{k}={v:g}" for k, v in a.counters.items())
              + (f" acceptance_length={al:.2f}" if al else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main)
