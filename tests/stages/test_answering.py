"""Regeneration through an OpenAI-compatible endpoint: the client's checks before any prompt is sent, bounded
concurrency, retries, and a run cut short by the server resumed without asking anything twice.

The server here is a small stdlib HTTP server whose answers are the tiny target's own greedy ids (HF generate); it
speaks the fields vLLM's server does (`return_token_ids`) or trtllm-serve's (`detokenize: false`, unknown fields
refused). tests/interop/test_vllm.py runs the same client against vLLM's real server."""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from trtspec import answering, chat
from trtspec.errors import DataError
from trtspec.generation import hf_greedy

MAX_NEW = 6


class FakeServer:
    """An OpenAI-compatible server answering with `model`. flavor: vllm | trtllm | text (no token ids)."""

    def __init__(self, model, tok, name="target", flavor="vllm", fail_first=0, fail_after=None, tokenize=True, vocab_shift=0,
                 stop=None):
        self.model, self.tok, self.name, self.flavor = model, tok, name, flavor
        self.stop = stop or {tok.eos_token_id}  # the ids that end an answer (the model's eos)
        self.fail_first, self.fail_after, self.tokenize, self.vocab_shift = fail_first, fail_after, tokenize, vocab_shift
        self.completions: list[list[int]] = []  # prompts answered (probes included)
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    return self.send(200, {"data": [{"id": server.name, "max_model_len": 2048}]})
                self.send(404, {"error": "not found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize" and server.tokenize:
                    ids = server.tok.encode(body["prompt"], add_special_tokens=False)
                    return self.send(200, {"tokens": [t + server.vocab_shift for t in ids]})
                if self.path != "/v1/completions":
                    return self.send(404, {"error": "not found"})
                if server.flavor == "trtllm" and "return_token_ids" in body:
                    return self.send(400, {"error": "extra fields not permitted: return_token_ids"})
                with server.lock:
                    if server.fail_first > 0:
                        server.fail_first -= 1
                        return self.send(503, {"error": "busy"})
                    if server.fail_after is not None and len(server.completions) >= server.fail_after:
                        return self.send(500, {"error": "engine died"})
                    server.in_flight += 1
                    server.most_in_flight = max(server.most_in_flight, server.in_flight)
                    server.completions.append(body["prompt"])
                try:
                    with server.lock:  # one generate at a time: the model is shared
                        ids = hf_greedy(server.model, [body["prompt"]], body["max_tokens"], server.stop)[0]
                finally:
                    with server.lock:
                        server.in_flight -= 1
                choice = {"text": server.tok.decode(ids), "finish_reason": "stop" if ids and ids[-1] in server.stop else "length"}
                if server.flavor == "vllm" and body.get("return_token_ids"):
                    choice["token_ids"] = ids
                if server.flavor == "trtllm" and body.get("detokenize") is False:
                    choice["token_ids"] = [t for t in ids if t not in server.stop]  # strips the stop token
                self.send(200, {"choices": [choice]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


def endpoint_cfg(url, **kw):
    return SimpleNamespace(url=url, model=kw.pop("model", None), concurrency=kw.pop("concurrency", 3), timeout_s=30.0,
                           retries=kw.pop("retries", 2), **kw)


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    from stages.test_data import _talkative

    from trtspec.models import load_model, load_tokenizer

    return _talkative(load_model(tiny_model_dir)), load_tokenizer(tiny_model_dir)


@pytest.fixture
def prompts(target, tiny_prompts_file):
    _, tok = target
    return [chat.encode_prompt(tok, p["messages"]) for p in chat.read_prompt_file(tiny_prompts_file, Counter())]


@pytest.fixture
def serve(target):
    servers = []

    def start(**kw):
        servers.append(FakeServer(*target, **kw))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


@pytest.mark.parametrize("flavor", ["vllm", "trtllm"])
def test_endpoint_answers_are_the_targets_own_ids(serve, target, prompts, flavor):
    model, tok = target
    # a token the tiny target writes third in its first answer ends answers here: some stop, some run to the length
    stop = {hf_greedy(model, prompts[:1], MAX_NEW, set())[0][2]}
    want = hf_greedy(model, prompts, MAX_NEW, stop, tok.pad_token_id)
    assert 0 < sum(a[-1] in stop for a in want) < len(want)
    server = serve(flavor=flavor, stop=stop)
    ep = answering.Endpoint(endpoint_cfg(server.url))
    ep.check(tok, 100)
    assert ep.model == "target" and ep.ids_field == ({"return_token_ids": True} if flavor == "vllm" else {"detokenize": False})
    got = dict(ep.answers(prompts, MAX_NEW, stop, 0.0))
    assert [got[i] for i in range(len(prompts))] == want  # trtllm's stripped stop token is put back
    assert server.most_in_flight <= 3


def test_endpoint_retries_a_busy_server(serve, target, prompts):
    _, tok = target
    server = serve(fail_first=3)  # the probe completion meets three 503s before its answer
    ep = answering.Endpoint(endpoint_cfg(server.url, concurrency=1, retries=3))
    ep.check(tok, 100)
    got = dict(ep.answers(prompts, MAX_NEW, {tok.eos_token_id}, 0.0))
    assert len(got) == len(prompts)


@pytest.mark.parametrize(("server_kw", "cfg_kw", "message"), [
    ({"name": "other-model"}, {"model": "target"}, "serves other-model, not 'target'"),
    ({"vocab_shift": 1}, {}, "tokenizer is not the target's"),
    ({"flavor": "text"}, {}, "returns text without token ids"),
])
def test_a_server_that_cannot_answer_for_the_target_is_refused_before_any_prompt(serve, target, server_kw, cfg_kw, message):
    _, tok = target
    server = serve(**server_kw)
    with pytest.raises(DataError, match=message):
        answering.Endpoint(endpoint_cfg(server.url, **cfg_kw)).check(tok, 100)
    assert all(len(p) <= 8 for p in server.completions)  # probes only


def test_an_unreachable_endpoint_is_one_line(target):
    _, tok = target
    with pytest.raises(DataError, match=r"cannot reach data.endpoint \(http"):
        answering.Endpoint(endpoint_cfg("http://127.0.0.1:9", retries=0)).check(tok, 100)


def test_a_server_dying_mid_run_keeps_the_answers_so_far_and_the_next_run_asks_only_the_rest(serve, target, tmp_path, tiny_prompts_file):
    from trtspec.stages import data

    _, tok = target
    rows = chat.read_prompt_file(tiny_prompts_file, Counter())
    answers = tmp_path / "answers.jsonl"
    dying = serve(fail_after=1 + 3)  # the probe, then 3 prompts
    ep = answering.Endpoint(endpoint_cfg(dying.url, concurrency=1, retries=1))
    ep.check(tok, 100)
    with pytest.raises(DataError, match="failed after 2 tries.*HTTP 500"):
        data.regenerate(rows, tok, answers, lambda p: ep.answers(p, MAX_NEW, {tok.eos_token_id}, 0.0), print)
    assert len(answers.read_text().splitlines()) == 3
    healthy = serve()
    ep = answering.Endpoint(endpoint_cfg(healthy.url))
    ep.check(tok, 100)
    probes = len(healthy.completions)
    out = data.regenerate(rows, tok, answers, lambda p: ep.answers(p, MAX_NEW, {tok.eos_token_id}, 0.0), print)
    assert len(out) == len(rows) and len(healthy.completions) - probes == len(rows) - 3
