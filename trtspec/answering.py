"""Who answers the data stage's `regenerate` prompts (data.answer_with): transformers in this process, vLLM's offline
engine (in this process, or a spawned one where it would rewrite transformers' classes), or an OpenAI-compatible
server (vllm serve, trtllm-serve, SGLang).

Each takes prompts as the target's token ids and yields (prompt index, answer token ids up to and with the first eos)
as answers finish, so the caller saves each at once and a killed run asks nothing twice. Answers are always the
target's own token ids, never its text tokenized again (which splits differently in places, e.g. "\\n\\n1.").
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.errors import DataError
from trtspec.generation import cut_after_eos, hf_greedy

if TYPE_CHECKING:
    from trtspec.config import EndpointSection

Answers = Iterator[tuple[int, list[int]]]  # (index of the prompt, its answer's token ids)

VLLM_WINDOW = 256  # requests vLLM holds in flight while answering (its max_num_seqs), each finished one replaced at once

# text whose tokens show a tokenizer apart (spaces, digits, newlines, code, non-ASCII)
PROBE_TEXT = "Hello world! 12 + 30 = 42.\n\n1. def f(x):\n    return x  # café, naïve 東京"


def answer_hf(model: Any, prompts: list[list[int]], max_new: int, eos: set[int], pad_id: int | None,
              temperature: float, batch_size: int) -> Answers:
    """transformers `generate`, `batch_size` prompts at once (left-padded), in this process."""
    for start in range(0, len(prompts), batch_size):
        answers = hf_greedy(model, prompts[start : start + batch_size], max_new, eos, pad_id, temperature)
        yield from enumerate(answers, start)


def answer_vllm(model_dir: Path, dtype: str, prompts: list[list[int]], max_new: int, eos: set[int],
                temperature: float, window: int = VLLM_WINDOW) -> Answers:
    """vLLM's offline engine with `window` requests in flight, a finished one replaced by the next prompt at once
    (vllm_engine.feed), each answer yielded as it finishes; in this process, or in a spawned one for a family vLLM
    serves through its Transformers backend (which would leave this process unable to load the target with
    transformers: trtspec.engines.worker)."""
    from trtspec.engines import vllm as vllm_engine
    from trtspec.engines.worker import EngineWorker

    if not vllm_engine.installed():
        raise DataError("data.answer_with: vllm, but vllm is not installed", vllm_engine.INSTALL_HINT)
    window = max(1, min(window, len(prompts)))
    engine = EngineWorker(vllm_engine.load, (model_dir, None, 0, max(map(len, prompts)) + max_new + 8, window, dtype),
                          vllm_engine.shutdown, vllm_engine.own_process(model_dir))
    try:
        yield from fed_answers(engine.call, prompts, max_new, eos, temperature, window)
    finally:
        engine.close()


def fed_answers(call: Callable[..., Any], prompts: list[list[int]], max_new: int, eos: set[int], temperature: float,
                window: int) -> Answers:
    """`prompts` through vllm_engine.feed with `window` requests in flight; `call(fn, *args)` runs fn(llm, *args)
    where the engine lives (EngineWorker.call)."""
    from trtspec.engines import vllm as vllm_engine

    sent = in_flight = 0
    stop_ids = sorted(eos)
    while sent < len(prompts) or in_flight:
        new = [(i, prompts[i]) for i in range(sent, min(len(prompts), sent + window - in_flight))]
        sent, in_flight = sent + len(new), in_flight + len(new)
        finished = call(vllm_engine.feed, new, max_new, temperature, stop_ids)
        if not finished:
            raise DataError(f"vLLM holds no request but {in_flight} were not answered", "re-run: answers so far are kept")
        in_flight -= len(finished)
        yield from ((i, cut_after_eos(ids, eos)) for i, ids in finished)


class EndpointError(Exception):
    def __init__(self, status: int | None, message: str):
        super().__init__(message)
        self.status = status

    @property
    def retryable(self) -> bool:  # the connection, a timeout, rate limiting, the server's own failure
        return self.status is None or self.status == 429 or self.status >= 500


class Endpoint:
    """An OpenAI-compatible completions server answering prompts given as token ids.

    `check` runs before any prompt is sent: the server answers, serves the model, holds prompt + answer in its
    context, tokenizes like the target, and returns token ids (vLLM/SGLang `return_token_ids`; trtllm-serve
    `detokenize: false`, which rejects unknown fields)."""

    def __init__(self, cfg: EndpointSection, log: Any = print, key: str = "data.endpoint",
                 start_hint: str = "start the server (e.g. vllm serve MODEL) or fix data.endpoint.url"):
        self.cfg = cfg
        self.url = cfg.url.rstrip("/")
        self.log = log
        self.key, self.start_hint = key, start_hint  # the config section it comes from; how to start it
        self.on_answer: Any = lambda out: None  # what a completion leaves on the server's side, dealt with
        self.model: str | None = cfg.model
        self.ids_field: dict[str, Any] = {}

    def request(self, path: str, body: dict | None = None, timeout: float | None = None) -> dict:
        """One HTTP call -> the JSON it returns; EndpointError(status or None) when it fails."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method="POST" if body is not None else "GET",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.cfg.timeout_s) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise EndpointError(e.code, f"HTTP {e.code} from {self.url}{path}: {e.read()[:200].decode(errors='replace')}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise EndpointError(None, f"{self.url}{path}: {reason}") from None
        except json.JSONDecodeError:
            raise EndpointError(200, f"{self.url}{path} answered something that is not JSON") from None

    def with_retries(self, path: str, body: dict | None = None) -> dict:
        for attempt in range(self.cfg.retries + 1):
            try:
                return self.request(path, body)
            except EndpointError as e:
                if not e.retryable or attempt == self.cfg.retries:
                    raise
                time.sleep(min(2**attempt, 60))
        raise AssertionError("unreachable")

    def check(self, tok: Any, longest: int) -> None:
        """Refuse, with one line, a server that cannot answer for the target (see the class)."""
        try:
            listed = self.with_retries("/v1/models").get("data", [])
        except EndpointError as e:
            raise DataError(f"cannot reach {self.key} ({self.url}): {e}", self.start_hint) from None
        names = [m.get("id") for m in listed]
        if self.model is None:
            if len(names) != 1:
                raise DataError(f"the endpoint serves {len(names)} models ({', '.join(map(str, names)) or 'none'})",
                                f"name one in {self.key}.model")
            self.model = names[0]
        elif self.model not in names:
            raise DataError(f"the endpoint serves {', '.join(map(str, names)) or 'no model'}, not '{self.model}'",
                            f"set {self.key}.model to the served name of the target")
        card = listed[names.index(self.model)]
        if card.get("max_model_len") and card["max_model_len"] < longest:
            raise DataError(f"the endpoint's model holds {card['max_model_len']} tokens; prompt + answer need {longest}",
                            "serve it with a longer --max-model-len, or lower data.max_new_tokens")
        self.check_tokenizer(tok)
        self.find_ids_field(tok.encode(PROBE_TEXT, add_special_tokens=False)[:8])

    def check_tokenizer(self, tok: Any) -> None:
        mine = tok.encode(PROBE_TEXT, add_special_tokens=False)
        for path, body in (("/tokenize", {"model": self.model, "prompt": PROBE_TEXT, "add_special_tokens": False}),
                           ("/v1/tokenize", {"model": self.model, "prompt": PROBE_TEXT, "add_special_tokens": False}),
                           ("/_internal/tokenize", {"prompt": PROBE_TEXT})):
            try:
                theirs = self.request(path, body, timeout=30).get("tokens")
            except EndpointError as e:
                if e.status in (404, 405, 400, 422):
                    continue
                raise DataError(f"the endpoint failed to tokenize: {e}") from None
            if isinstance(theirs, list) and theirs and theirs[0] == tok.bos_token_id and theirs[1:] == mine:
                theirs = theirs[1:]  # a server that adds the BOS anyway
            if theirs != mine:
                raise DataError(f"the endpoint's tokenizer is not the target's ('{self.model}' splits a probe text into "
                                f"{len(theirs or [])} tokens, the target {len(mine)})",
                                "serve the target model.source names, with its tokenizer")
            return
        self.log("the endpoint has no tokenize route: its tokenizer is not checked (its model name is)")

    def find_ids_field(self, probe: list[int]) -> None:
        """Which request field makes this server return the answer's token ids."""
        for field in ({"return_token_ids": True}, {"detokenize": False}):
            try:
                out = self.with_retries("/v1/completions", {"model": self.model, "prompt": probe, "max_tokens": 2,
                                                            "temperature": 0.0, **field})
            except EndpointError as e:
                if e.status is not None and 400 <= e.status < 500:
                    continue  # a field this server does not know (trtllm-serve rejects unknown fields)
                raise DataError(f"the endpoint failed a probe completion: {e}") from None
            self.on_answer(out)
            if isinstance(out.get("choices", [{}])[0].get("token_ids"), list):
                self.ids_field = field
                return
        raise DataError(f"the endpoint at {self.url} returns text without token ids",
                        "vLLM >= 0.10.2 and SGLang return them (return_token_ids), trtllm-serve with detokenize: false")

    def complete(self, prompt: list[int], max_new: int, eos: set[int], temperature: float) -> list[int]:
        out = self.with_retries("/v1/completions", {"model": self.model, "prompt": prompt, "max_tokens": max_new,
                                                    "temperature": temperature, **self.ids_field})
        self.on_answer(out)
        choice = out["choices"][0]
        ids = choice.get("token_ids")
        if not isinstance(ids, list):
            raise EndpointError(200, "a completion came back without token ids")
        ids = cut_after_eos(ids, eos)
        if choice.get("finish_reason") == "stop" and (not ids or ids[-1] not in eos) and eos:
            ids.append(min(eos))  # a server that strips the stop token from the ids (trtllm-serve)
        return ids

    def answers(self, prompts: list[list[int]], max_new: int, eos: set[int], temperature: float) -> Answers:
        """At most `concurrency` requests in flight; when one fails for good, those in flight finish
        (and are yielded) before the error is raised."""
        pending: dict[Future, int] = {}
        failure: EndpointError | None = None
        todo = iter(range(len(prompts)))
        with ThreadPoolExecutor(self.cfg.concurrency) as pool:
            while True:
                while failure is None and len(pending) < self.cfg.concurrency and (i := next(todo, None)) is not None:
                    pending[pool.submit(self.complete, prompts[i], max_new, eos, temperature)] = i
                if not pending:
                    break
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    i = pending.pop(f)
                    try:
                        yield i, f.result()
                    except EndpointError as e:
                        failure = failure or e
        if failure:
            raise DataError(f"{self.key} failed after {self.cfg.retries + 1} tries: {failure}",
                            "the answers so far are kept; re-run to resume")
