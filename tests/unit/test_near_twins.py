"""Near-twin prompts (chat.near_twins): a template filled in again is a twin, another prompt is not; the demo
recipe's generated prompts are mostly twins of one another, the hand-written unseen suite's are twins of none of
them; and the held-out AL split by them (acceptance.split_by_twins) pools each part as the whole is pooled."""

from __future__ import annotations

import json
from pathlib import Path

from trtspec.chat import near_twins
from trtspec.training.acceptance import split_by_twins

PROMPTS = Path(__file__).parents[2] / "build_configs" / "prompts"


def row(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}]}


def rows_of(name: str) -> list[dict]:
    out = []
    for line in (PROMPTS / name).read_text().splitlines():
        r = json.loads(line)
        out.append({"messages": r["messages"]} if "messages" in r else row(r["prompt"]))
    return out


def test_a_template_filled_in_again_is_a_twin_and_another_prompt_is_not():
    trained = [row("Write a short poem about a spring forest."), row("What is DNA? Give a short explanation.")]
    assert near_twins([row("Write a short poem about a quiet forest."), row("What is RNA? Give a short explanation."),
                       row("Summarise the passage below about trains."), row("")], trained) == [True, True, False, False]
    assert near_twins([row("Write a short poem about a quiet forest.")], trained, overlap=0.9) == [False]


def test_generated_prompts_are_mostly_twins_and_the_unseen_suite_twins_of_none():
    demo = rows_of("broad_prompts.jsonl")  # the demo recipe's
    held, trained = demo[::40], [r for i, r in enumerate(demo) if i % 40]
    assert sum(near_twins(held, trained)) > len(held) / 2
    assert not any(near_twins(rows_of("unseen_prompts.jsonl"), trained))


def test_split_by_twins_pools_each_part():
    acc = {"per_prompt": [(8, 4), (6, 4), (3, 3)]}
    parts = split_by_twins(acc, [True, False, True], 3)
    assert parts["with_twin"]["prompts"] == 2 and parts["with_twin"]["AL@3"] == round(11 / 7, 3)
    assert parts["without_twin"]["AL@3"] == 1.5 and parts["without_twin"]["AL@3_ci95"] == [1.5, 1.5]
    assert split_by_twins(acc, [True] * 3, 3)["without_twin"] is None
