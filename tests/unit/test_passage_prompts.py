"""scripts/make_passage_prompts.py and trtspec.demo_prompts.passage_prompts: prompts over passages of a user's own
documents, for trtspec adapt or a data stage."""

from __future__ import annotations

import json
import random
import sys
from collections import Counter

import pytest
from stagekit import load_script

from trtspec.demo_prompts import PASSAGE_FORMS, document_windows, passage_prompts
from trtspec.errors import DataError

DOCS = [" ".join(f"Doc {d} sentence {s} has five words and a number {d * 10 + s}." for s in range(12)) for d in range(30)]


def test_windows_are_whole_sentences_of_one_document_within_the_word_range():
    windows = document_windows(DOCS, random.Random(0), (20, 60))
    assert windows and all(20 <= len(w.split()) <= 60 for w in windows)
    for w in windows:
        sentences = w.split(". ")
        assert 2 <= len(sentences) <= 4 and w.endswith(".")
        assert len({s.split()[1] for s in sentences}) == 1  # never across two documents
    # a document too short for any window gives none; quotes and brackets after a full stop still end a sentence
    assert document_windows(["One. Two."], random.Random(0), (5, 9)) == []
    text = 'He said "Stop." (Then 2 left.) [Done.] Next one went home.'
    got = document_windows([text], random.Random(1), (1, 99))
    assert len(got) == 2 and " ".join(got) == text  # the sentences whole, their closing quotes and brackets kept


def test_prompts_take_the_kinds_in_turn_each_passage_once_and_are_deterministic():
    rows = passage_prompts(DOCS, 60, seed=3, words=(20, 60))
    assert rows == passage_prompts(DOCS, 60, seed=3, words=(20, 60)) != passage_prompts(DOCS, 60, seed=4, words=(20, 60))
    counts = Counter(r["category"] for r in rows)
    assert set(counts) == set(PASSAGE_FORMS) and max(counts.values()) - min(counts.values()) <= 1 and len(rows) == 60
    passages = [r["prompt"] for r in rows]
    assert len(set(passages)) == len(passages)
    for r in rows:  # one of its kind's instructions around a passage of the documents
        assert any(r["prompt"].startswith(f.split("{}")[0]) and r["prompt"].endswith(f.split("{}")[1])
                   for f in PASSAGE_FORMS[r["category"]])
        assert "Doc " in r["prompt"]
    every = passage_prompts(DOCS, 10_000, seed=0, words=(20, 60))
    assert len(every) == len(document_windows(DOCS, random.Random(0), (20, 60)))
    # a document given three times (two sentences: every window is all of it) gives its passage once
    assert len(passage_prompts(["Alpha beta gamma delta. Epsilon zeta eta theta."] * 3, 10, seed=0, words=(1, 99))) == 1


def test_the_script_writes_the_file_and_refuses_bad_input_in_one_line(tmp_path, monkeypatch, capsys):
    script = load_script("make_passage_prompts")
    docs, out = tmp_path / "docs.txt", tmp_path / "p.jsonl"
    docs.write_text("\n".join(DOCS) + "\n\n", encoding="utf-8")
    monkeypatch.setattr(sys, "argv", ["x", str(docs), "--n", "9", "--words", "20-60", "--out", str(out)])
    script.main()
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 9 and "wrote 9 prompts" in capsys.readouterr().out
    for argv, match in (([str(docs), "--words", "60-20"], "--words '60-20': expected a range"),
                        ([str(tmp_path / "none.txt")], r"documents file '.*none.txt' does not exist"),
                        ([str(docs), "--words", "500-900"], "no run of 2-4 sentences of 500-900 words in its 30 documents")):
        monkeypatch.setattr(sys, "argv", ["x", *argv, "--out", str(tmp_path / "bad.jsonl")])
        with pytest.raises(DataError, match=match):
            script.main()
    assert not (tmp_path / "bad.jsonl").exists()


def test_builtin_prose_is_paragraphs_of_the_language_reference_the_script_reads(tmp_path, monkeypatch, capsys):
    """`builtin`: the Python language reference's paragraphs, prose of 50 words and more (no code), as documents."""
    from trtspec.suites import builtin_prose

    prose = builtin_prose()
    assert len(prose) >= 50 and all(len(p.split()) >= 50 and "\n" not in p and "def " not in p for p in prose)
    out = tmp_path / "prose.jsonl"
    monkeypatch.setattr(sys, "argv", ["x", "builtin", "--n", "30", "--out", str(out)])
    load_script("make_passage_prompts").main()
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 30 and {r["category"] for r in rows} == {"extraction", "summarization", "rewriting"}
    assert f"from {len(prose)} documents" in capsys.readouterr().out


def test_min_words_reads_the_shorter_paragraphs_too(tmp_path, monkeypatch, capsys):
    """`--min-words 30`: every paragraph of 30 words and more, so more documents than the default 50 reads."""
    from trtspec.suites import builtin_prose

    short = builtin_prose(30)
    assert len(short) > len(builtin_prose()) and min(len(p.split()) for p in short) >= 30
    monkeypatch.setattr(sys, "argv", ["x", "builtin", "--min-words", "30", "--n", "10", "--out", str(tmp_path / "p.jsonl")])
    load_script("make_passage_prompts").main()
    assert f"from {len(short)} documents" in capsys.readouterr().out


@pytest.mark.parametrize(("min_words", "why"), [("0", "expected a word count of 1 or more"),
                                                  ("100000", "no paragraph of the language reference is that long")])
def test_a_min_words_below_one_or_no_paragraph_reaches_is_one_error_and_no_file(tmp_path, monkeypatch, min_words, why):
    out = tmp_path / "p.jsonl"
    monkeypatch.setattr(sys, "argv", ["x", "builtin", "--min-words", min_words, "--out", str(out)])
    with pytest.raises(DataError, match=f"--min-words {min_words}: {why}"):
        load_script("make_passage_prompts").main()
    assert not out.exists()
