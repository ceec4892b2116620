"""Evaluation suites (eval.suites, trtspec.suites): a JSONL file through its column mapping, a `datasets` dataset
made here (saved to disk, a local data file) through the real datasets code, the builtin suite from the project's
prompt generator, the offline error, and what validate takes from them (its preflight and load_prompt_rows)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from trtspec.config import config_from_dict
from trtspec.errors import ConfigError, DataError
from trtspec.suites import BUILTIN_PER_CATEGORY, builtin_rows, hf_suite_rows, interleave, read_suite_file

ROWS = [
    {"question": "What is 2 + 2?", "topic": "math"},
    {"question": "Write a haiku about snow.", "topic": "writing"},
    {"question": ["Name a prime.", "And another?"], "topic": "math"},  # MT-Bench writes turns as a list
    {"turns": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}], "topic": "chat"},
]


def cfg_with(tmp_path: Path, *suites: dict, **evaluation):
    raw = {"data": {"sources": [{"kind": "jsonl", "path": "d.jsonl"}]},
           "eval": {"suites": list(suites), **evaluation}, "seed": 7}
    return config_from_dict(raw, base_dir=tmp_path)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def mapped(tmp_path, **keys):
    return cfg_with(tmp_path, {"kind": "jsonl", "path": "s.jsonl", "prompt_field": "question",
                               "messages_field": "turns", **keys}).eval.suites[0]


def test_jsonl_suite_with_a_column_mapping(tmp_path):
    write_jsonl(tmp_path / "s.jsonl", ROWS)
    rows = read_suite_file(tmp_path / "s.jsonl", Counter(), mapped(tmp_path, category_field="topic"))
    assert [r["category"] for r in rows] == ["math", "writing", "math", "chat"]
    assert [r["messages"] for r in rows[:3]] == [[{"role": "user", "content": c}] for c in
                                                 ("What is 2 + 2?", "Write a haiku about snow.", "Name a prime.")]
    assert rows[3]["messages"] == [{"role": "user", "content": "Say hi."}]  # the answer dropped: a prompt
    assert rows[0]["id"] == "s:1"
    only = read_suite_file(tmp_path / "s.jsonl", Counter(), mapped(tmp_path, category_field="topic", categories=["math"]))
    assert [r["category"] for r in only] == ["math", "math"]


def test_a_suite_without_a_mapping_reads_rows_as_the_data_stage_does(tmp_path):
    """No prompt_field or messages_field set and no 'prompt' or 'messages' column: the rows' turns in the forms the
    data stage reads (SpecForge conversations, Alpaca, a `question` column); a mapping that is set is followed."""
    import datasets

    rows = [{"id": "s1", "conversations": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi"}]},
            {"instruction": "Sum up.", "input": "A text.", "output": "Short.", "category": "summary"}]
    write_jsonl(tmp_path / "s.jsonl", rows)
    s = cfg_with(tmp_path, {"kind": "jsonl", "path": "s.jsonl"}).eval.suites[0]
    got = read_suite_file(tmp_path / "s.jsonl", Counter(), s)
    assert [(r["id"], r["category"], r["messages"]) for r in got] == [
        ("s1", "chat", [{"role": "user", "content": "Say hi."}]),
        ("s:2", "summary", [{"role": "user", "content": "Sum up.\n\nA text."}])]
    with pytest.raises(DataError, match="line 1 has no 'question' \\(text\\)"):
        read_suite_file(tmp_path / "s.jsonl", Counter(), mapped(tmp_path))
    datasets.Dataset.from_dict({"question": ["What is 2 + 2?"], "answer": ["4"]}).save_to_disk(str(tmp_path / "gsm"))
    s = cfg_with(tmp_path, {"kind": "hf", "path": "gsm"}).eval.suites[0]
    assert hf_suite_rows(s, lambda p: tmp_path / p, "suite")[0]["messages"] == [{"role": "user", "content": "What is 2 + 2?"}]


def test_a_suite_of_sharegpt_turns(tmp_path):
    """ShareGPT's {from, value} turns under the suite's messages_field, as the data stage reads them."""
    write_jsonl(tmp_path / "s.jsonl", [{"conversations": [{"from": "human", "value": "Say hi."}, {"from": "gpt", "value": "Hi!"}]}])
    s = cfg_with(tmp_path, {"kind": "jsonl", "path": "s.jsonl", "messages_field": "conversations"}).eval.suites[0]
    assert read_suite_file(tmp_path / "s.jsonl", Counter(), s)[0]["messages"] == [{"role": "user", "content": "Say hi."}]


def test_a_suite_written_as_one_json_array_is_read_as_its_rows(tmp_path):
    """`json.dump(rows, f, indent=2)` writes one array over many lines: its rows, not a refusal of line 1."""
    (tmp_path / "s.jsonl").write_text(json.dumps(ROWS, indent=2))
    rows = read_suite_file(tmp_path / "s.jsonl", Counter(), mapped(tmp_path, category_field="topic"))
    assert [r["category"] for r in rows] == ["math", "writing", "math", "chat"] and rows[0]["id"] == "s:1"
    (tmp_path / "s.jsonl").write_text(json.dumps([ROWS[0], "a string"], indent=2))
    with pytest.raises(DataError, match="row 2 is not a JSON object"):
        read_suite_file(tmp_path / "s.jsonl", Counter(), mapped(tmp_path))

def test_jsonl_suite_names_the_column_and_the_first_row_lacking_it(tmp_path):
    write_jsonl(tmp_path / "s.jsonl", [*ROWS, {"text": "no prompt here", "topic": "x"}])
    with pytest.raises(DataError, match=r"s\.jsonl': line 5 has no 'question' \(text\) or 'turns' \(messages\) column"):
        read_suite_file(tmp_path / "s.jsonl", Counter(), mapped(tmp_path))
    write_jsonl(tmp_path / "s.jsonl", [*ROWS[:2], {"question": "hi"}])
    with pytest.raises(DataError, match=r"line 3 has no 'topic' column \(the suite's category_field\)"):
        read_suite_file(tmp_path / "s.jsonl", Counter(), mapped(tmp_path, category_field="topic"))
    # the category column left at its default: a row without one is 'chat'
    assert read_suite_file(tmp_path / "s.jsonl", Counter(), mapped(tmp_path))[2]["category"] == "chat"
    write_jsonl(tmp_path / "s.jsonl", ROWS[:2])
    with pytest.raises(DataError, match=r"has no row of category 'code' \(its categories: math, writing\)"):
        read_suite_file(tmp_path / "s.jsonl", Counter(), mapped(tmp_path, category_field="topic", categories=["code"]))
    write_jsonl(tmp_path / "s.jsonl", ['{"question": "cut'])
    with pytest.raises(DataError, match="line 1 is not valid JSON"):
        read_suite_file(tmp_path / "s.jsonl", Counter(), mapped(tmp_path))


def test_hf_suite_from_a_saved_dataset_and_a_local_data_file(tmp_path):
    import datasets

    cols = {"question": [r["question"] if isinstance(r.get("question"), str) else "Name a prime." for r in ROWS],
            "topic": [r["topic"] for r in ROWS]}
    datasets.Dataset.from_dict(cols).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"test": datasets.Dataset.from_dict(cols)}).save_to_disk(str(tmp_path / "saved_dict"))
    datasets.Dataset.from_dict(cols).to_parquet(str(tmp_path / "eval.parquet"))
    for path, split in (("saved", "train"), ("saved_dict", "test"), ("eval.parquet", "test")):
        s = cfg_with(tmp_path, {"kind": "hf", "path": path, "split": split, "prompt_field": "question",
                                "category_field": "topic"}).eval.suites[0]
        rows = hf_suite_rows(s, lambda p: tmp_path / p, "the suite")
        assert [r["category"] for r in rows] == ["math", "writing", "math", "chat"], path
        assert rows[1]["messages"] == [{"role": "user", "content": "Write a haiku about snow."}]
    s = cfg_with(tmp_path, {"kind": "hf", "path": "saved_dict", "split": "validation"}).eval.suites[0]
    with pytest.raises(DataError, match=r"no split 'validation' \(its splits: test\)"):
        hf_suite_rows(s, lambda p: tmp_path / p, "the suite")
    # a mapping set (messages_field) is followed: its columns missing are named, no row read another way
    s = cfg_with(tmp_path, {"kind": "hf", "path": "saved", "messages_field": "messages", "category_field": "kind"}).eval.suites[0]
    with pytest.raises(DataError, match=r"row 1 has no 'prompt' \(text\) or 'messages' \(messages\) column \(its columns: question, topic\)"):
        hf_suite_rows(s, lambda p: tmp_path / p, "the suite")


def test_hf_suite_with_no_network_is_one_line_naming_the_id_and_a_local_copy(tmp_path, monkeypatch):
    """The real datasets.load_dataset on a hub id with the hub unreachable (tests run with HF_HUB_OFFLINE=1; set
    here in datasets' and huggingface_hub's own flags, read at their import)."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    s = cfg_with(tmp_path, {"kind": "hf", "path": "nobody-here/no-such-suite", "split": "test"}).eval.suites[0]
    with pytest.raises(DataError) as e:
        hf_suite_rows(s, lambda p: tmp_path / p, "eval.suites[0] dataset 'nobody-here/no-such-suite' split 'test'")
    msg = e.value.message
    assert "\n" not in msg and "'nobody-here/no-such-suite'" in msg and "the hub cannot be reached" in msg
    assert "kind: jsonl" in msg and "save_to_disk" in msg


def test_builtin_suite_is_deterministic_held_out_and_has_every_kind():
    from trtspec.demo_prompts import DEMO_N, DEMO_SEED, build, build_broad

    rows = builtin_rows(0)
    cats = Counter(r["category"] for r in rows)
    # the shipped sets take most of the code templates' prompts: EVAL_CODE_TASKS, asked by the suite alone, fill code
    assert set(cats) == {"explanation", "lists", "code", "writing", "chat", "math"} and min(cats.values()) >= 30
    assert cats["code"] == BUILTIN_PER_CATEGORY
    assert [r["category"] for r in rows[:6]] == ["explanation", "lists", "code", "writing", "chat", "math"]
    assert rows == builtin_rows(0) and rows != builtin_rows(1)
    trained = {r["prompt"] for r in build(DEMO_N, DEMO_SEED) + build_broad(DEMO_N, DEMO_SEED)}  # the shipped sets
    assert not {r["messages"][0]["content"] for r in rows} & trained
    assert len({r["messages"][0]["content"] for r in rows}) == len(rows)
    # picking categories changes none of their prompts
    assert builtin_rows(0, ["code", "math"]) == [r for r in rows if r["category"] in ("code", "math")]


def test_builtin_categories_are_checked_at_load(tmp_path):
    with pytest.raises(ConfigError, match=r"eval\.suites\[0\]\.categories: unknown builtin category 'poetry' "
                       r"\(builtin categories: explanation, lists, code, writing, chat, math\)"):
        cfg_with(tmp_path, {"kind": "builtin", "categories": ["poetry"]})
    with pytest.raises(ConfigError, match=r"eval\.suites\[1\]\.path: an hf suite needs a path"):
        cfg_with(tmp_path, {"kind": "builtin"}, {"kind": "hf"})
    with pytest.raises(ConfigError, match=r"eval\.suites\[0\]\.prompt_field: a builtin suite reads no file"):
        cfg_with(tmp_path, {"kind": "builtin", "prompt_field": "q"})


def test_interleave_takes_the_groups_in_turn():
    assert interleave([[1, 2, 3], [4], [5, 6]]) == [1, 4, 5, 2, 6, 3]


def test_validate_takes_suites_in_turn_and_names_them(tmp_path):
    """load_prompt_rows: eval.prompts in file order, then each suite, categories in turn, up to eval.num_prompts;
    the builtin suite leaves out the run's training prompts; prompt_source names every source."""
    from trtspec.stages import validate

    write_jsonl(tmp_path / "s.jsonl", ROWS)
    write_jsonl(tmp_path / "p.jsonl", [{"prompt": "First."}, {"prompt": "Second."}])
    cfg = cfg_with(tmp_path, {"kind": "jsonl", "path": "s.jsonl", "prompt_field": "question", "messages_field": "turns",
                              "category_field": "topic"}, {"kind": "builtin", "categories": ["code", "math"]},
                   prompts="p.jsonl", num_prompts=9)
    first_code = builtin_rows(7, ["code"])[0]["messages"]
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "train.jsonl", [{"messages": [*first_code, {"role": "assistant", "content": "def f(): ..."}]}])

    class Ctx:
        inputs = {"data": data}

    Ctx.cfg = cfg
    rows = validate.load_prompt_rows(Ctx())
    assert len(rows) == 9
    assert [r["suite"] for r in rows[:3]] == ["p.jsonl", "jsonl:s.jsonl", "builtin (code, math)"]
    assert [r["category"] for r in rows if r["suite"] == "jsonl:s.jsonl"] == ["math", "writing", "chat", "math"]
    assert first_code not in [r["messages"] for r in rows]  # trained on: left out
    assert {r["category"] for r in rows if r["suite"].startswith("builtin")} == {"code", "math"}
    assert validate.prompt_source(cfg) == "p.jsonl; jsonl:s.jsonl; builtin (code, math)"
    assert [f.name for f in validate.files_read(cfg)] == ["eval.prompts", "eval.suites[0].path"]


def test_validate_preflight_reads_the_suites(tmp_path, tiny_model_dir):
    from transformers import AutoConfig

    from trtspec.stages import validate

    model_config = AutoConfig.from_pretrained(tiny_model_dir)
    raw = {"model": {"source": str(tiny_model_dir)}, "data": {"sources": [{"kind": "jsonl", "path": "d.jsonl"}]},
           "eval": {"suites": [{"kind": "builtin"}], "num_prompts": 6, "max_new_tokens": 4}}
    validate.preflight(config_from_dict(raw, base_dir=tmp_path), model_config)
    write_jsonl(tmp_path / "long.jsonl", [{"prompt": "hi"}, {"prompt": "tell me more " * 400}])
    raw["eval"]["suites"] = [{"kind": "builtin"}, {"kind": "jsonl", "path": "long.jsonl"}]
    with pytest.raises(DataError, match=r"eval\.suites\[1\] \(jsonl:long\.jsonl\): 1 prompt\(s\) \(first: long:2, \d+ tokens\)"):
        validate.preflight(config_from_dict(raw, base_dir=tmp_path), model_config)


def test_a_benchs_count_of_prompts_is_a_whole_number_of_at_least_one():
    """bench.count, the type of the bench scripts' --prompts: 0 would spread a suite over nothing."""
    import argparse

    from trtspec.bench import count

    assert count("3") == 3
    for bad in ("0", "-1", "x", "2.5", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="at least 1"):
            count(bad)


def test_suite_rows_spread_over_the_file(tmp_path):
    """bench.suite_rows(spread_to=n): n rows from across a suite ordered by category, not its first category's."""
    from trtspec.bench import suite_rows

    path = tmp_path / "suite.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "category": f"c{i // 4}"}) + "\n" for i in range(16)))
    assert len(suite_rows(path)) == 16
    assert [r["category"] for r in suite_rows(path, spread_to=4)] == ["c0", "c1", "c2", "c3"]
    assert len(suite_rows(path, spread_to=40)) == 16
    path.write_text("\n")
    with pytest.raises(DataError, match="--suite '.*suite.jsonl' holds no prompt"):
        suite_rows(path)  # a script's one line, not an empty measurement
