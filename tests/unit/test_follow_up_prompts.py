"""scripts/make_follow_up_prompts.py and trtspec.demo_prompts.follow_up_prompts: second turns over answered
conversations, for trtspec adapt or a data stage."""

from __future__ import annotations

import json
import sys

import pytest
from stagekit import load_script

from trtspec.chat import to_messages
from trtspec.demo_prompts import FOLLOW_UPS, clean, first_sentences, follow_up_prompts
from trtspec.errors import DataError


def conversation(i: int) -> list[dict]:
    answer = " ".join(f"Answer {i} sentence {s} has exactly seven words." for s in range(10))
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Question {i}?"},
            {"role": "assistant", "content": answer}]


def test_first_sentences_keeps_whole_sentences_and_line_breaks():
    text = "One two three. Four five six.\nSeven eight nine ten."
    assert first_sentences(text, 6) == "One two three. Four five six."
    assert first_sentences(text, 99) == text  # line breaks kept
    assert first_sentences(text, 2) == "One two three."  # at least the first sentence...
    assert first_sentences("One two three four five.", 2) == ""  # ...unless it is over twice the limit
    listed = "Steps:\n1. Pack a bag.\n2. Go."
    assert first_sentences(listed, 5) == "Steps:\n1. Pack a bag."  # never cut after a list item's number


def test_follow_ups_hold_the_first_turn_its_cut_answer_and_a_follow_up():
    convs = [conversation(i) for i in range(40)] + [[{"role": "user", "content": "unanswered"}]]
    rows = follow_up_prompts(convs, 30, seed=2, words=20)
    assert rows == follow_up_prompts(convs, 30, seed=2, words=20) != follow_up_prompts(convs, 30, seed=3, words=20)
    assert len(rows) == 30 and {r["category"] for r in rows} == {"multiturn"}
    for r in rows:
        system, user, answer, follow = r["messages"]
        i = int(user["content"].split()[1].rstrip("?"))
        assert system == conversation(i)[0] and user == conversation(i)[1]
        assert answer == {"role": "assistant", "content": " ".join(
            f"Answer {i} sentence {s} has exactly seven words." for s in range(2))}  # 16 words fit in 20, 24 do not
        assert follow["role"] == "user" and follow["content"] in clean(FOLLOW_UPS)
        assert to_messages({"messages": r["messages"][:3]})[0] == r["messages"][:3]  # a chat row adapt reads


def test_the_script_writes_the_file_and_refuses_bad_input_in_one_line(tmp_path, monkeypatch, capsys):
    script = load_script("make_follow_up_prompts")
    src, out = tmp_path / "train.jsonl", tmp_path / "f.jsonl"
    src.write_text("".join(json.dumps({"messages": conversation(i)}) + "\n" for i in range(12)) + "not json\n")
    monkeypatch.setattr(sys, "argv", ["x", str(src), "--n", "5", "--out", str(out)])
    script.main()
    assert len(out.read_text().splitlines()) == 5 and "wrote 5 follow-up prompts" in capsys.readouterr().out
    prompts_only = tmp_path / "prompts.jsonl"
    prompts_only.write_text(json.dumps({"prompt": "hi"}) + "\n")
    for argv, match in (([str(src), "--words", "0"], "must be at least 1"),
                        ([str(tmp_path / "none.jsonl")], r"'.*none.jsonl' does not exist"),
                        ([str(prompts_only)], "no conversation with a user turn and its answer")):
        monkeypatch.setattr(sys, "argv", ["x", *argv, "--out", str(tmp_path / "bad.jsonl")])
        with pytest.raises(DataError, match=match):
            script.main()
    assert not (tmp_path / "bad.jsonl").exists()
