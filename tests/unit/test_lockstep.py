"""vllm_engine.lockstep: engines stepped in turn, each step timed alone, a fixed number of requests in flight."""

import sys
from types import SimpleNamespace

import pytest

from trtspec.deploy import vllm_engine


class FakeEngine:
    """A scheduler that finishes each request `steps_per_answer` steps after it arrived, with `tokens` tokens; each
    step advances a shared clock by `step_s` and logs which engine stepped with how many requests in flight."""

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
            if self.running[rid] == self.steps_per_answer:
                del self.running[rid]
                out.append(SimpleNamespace(finished=True, outputs=[SimpleNamespace(token_ids=[0] * self.tokens)]))
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
