"""vllm_engine.lockstep: engines stepped in turn, each step timed alone, a fixed number of requests in flight."""

import sys
from types import SimpleNamespace

import pytest

from trtspec.engines import vllm as vllm_engine


class FakeEngine:
    """A scheduler that gives each request its first token at its first step and finishes it `steps_per_answer` steps
    after it arrived, with `tokens` tokens, reporting every running request each step (vLLM's cumulative output kind);
    each step advances a shared clock by `step_s` and logs which engine stepped with how many requests in flight."""

    def __init__(self, name, clock, log, steps_per_answer, step_s, tokens=4):
        self.name, self.clock, self.log = name, clock, log
        self.steps_per_answer, self.step_s, self.tokens = steps_per_answer, step_s, tokens
        self.running, self.prompts = {}, []

    def add_request(self, request_id, prompt, params):
        self.running[request_id] = 0
        self.prompts.append(prompt["prompt_token_ids"])

    def step(self):
        self.log.append((self.name, len(self.running)))
        self.clock[0] += self.step_s
        out = []
        for rid in list(self.running):
            self.running[rid] += 1
            done = self.running[rid] == self.steps_per_answer
            n = self.tokens if done else max(1, self.tokens * self.running[rid] // self.steps_per_answer)
            out.append(SimpleNamespace(request_id=rid, finished=done, outputs=[SimpleNamespace(token_ids=[0] * n)]))
            if done:
                del self.running[rid]
        return out


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr("time.perf_counter", lambda: now[0])
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=lambda **kw: kw))
    return now


def test_engines_step_in_turn_with_the_concurrency_in_flight_and_the_same_prompts(clock):
    log = []
    fast = FakeEngine("fast", clock, log, steps_per_answer=2, step_s=0.01)
    slow = FakeEngine("slow", clock, log, steps_per_answer=4, step_s=0.01)
    prompts = [[1], [2], [3]]
    got = vllm_engine.lockstep({"fast": SimpleNamespace(llm_engine=fast), "slow": SimpleNamespace(llm_engine=slow)},
                               prompts, max_new=4, concurrency=2, requests=6)
    names = [n for n, _ in log]
    assert names[:8] == ["fast", "slow"] * 4  # one step each, in turn, while both have requests left
    assert all(n <= 2 for _, n in log) and ("slow", 2) in log  # never more than the concurrency in flight
    assert fast.prompts == slow.prompts == [[1], [2], [3], [1], [2], [3]]  # the same prompts, in the same order
    assert got["fast"]["tokens"] == got["slow"]["tokens"] == 24
    assert got["fast"]["steps"] == 6 and got["slow"]["steps"] == 12
    # tokens over each engine's own steps: the other engine's steps in between are not counted
    assert got["fast"]["tokens_per_s"] == pytest.approx(24 / 0.06)
    assert got["slow"]["tokens_per_s"] == pytest.approx(24 / 0.12)


def test_a_slower_step_shows_in_its_engine_alone(clock):
    log = []
    a = FakeEngine("a", clock, log, steps_per_answer=3, step_s=0.01)
    b = FakeEngine("b", clock, log, steps_per_answer=3, step_s=0.03)
    got = vllm_engine.lockstep({"a": SimpleNamespace(llm_engine=a), "b": SimpleNamespace(llm_engine=b)},
                               [[1]], max_new=4, concurrency=1, requests=2)
    assert got["a"]["tokens_per_s"] / got["b"]["tokens_per_s"] == pytest.approx(3.0)


def test_latencies_are_read_on_each_engines_own_clock(clock):
    """A request's time to first token and inter-token latency count its engine's steps only: the other engine's
    steps in between (here 3x as long) do not show in them."""
    log = []
    a = FakeEngine("a", clock, log, steps_per_answer=4, step_s=0.01, tokens=4)
    b = FakeEngine("b", clock, log, steps_per_answer=4, step_s=0.03, tokens=4)
    got = vllm_engine.lockstep({"a": SimpleNamespace(llm_engine=a), "b": SimpleNamespace(llm_engine=b)},
                               [[1]], max_new=4, concurrency=1, requests=2)
    # first token after one step; the last three tokens over the three steps after it
    assert got["a"]["ttft_ms"] == pytest.approx(10.0) and got["a"]["itl_ms"] == pytest.approx(10.0)
    assert got["b"]["ttft_ms"] == pytest.approx(30.0) and got["b"]["itl_ms"] == pytest.approx(30.0)
