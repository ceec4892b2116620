"""scripts/bench_categories.py on the interop tier's CI run: every held-out prompt decoded without and with the draft
(the head alone, a suffix match in front of it, and one beside it), greedy outputs identical, a summary per category;
and the other bench scripts over drafts and suites (generalisation, step, drafters, drafting, and in the full tier
speculative and compile)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from stagekit import load_script

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.mark.parametrize("how,name", [([], "eagle3"), (["--suffix-min-match", "2"], "eagle3+suffix"),
                                      (["--suffix-branch", "1"], "eagle3|suffix")])
def test_categories_bench_keeps_greedy_output(ci_run, monkeypatch, capsys, how, name):
    bench = load_script("bench_categories")
    monkeypatch.setattr(sys, "argv", ["bench_categories.py", str(ci_run), "--prompts", "4", "--max-new-tokens", "24",
                                      "--no-compile", *how, "--json"])
    bench.main()
    out = json.loads(capsys.readouterr().out)
    assert out["prompts"] == 4 and out["draft"] == name
    assert sum(c["exact"] for c in out["per_category"].values()) == 4
    assert 1.0 <= out["acceptance_length"] <= 4.0 and out["speedup_vs_no_draft"] > 0


def test_generalisation_bench_reads_the_target_where_each_guess_aims(ci_run, monkeypatch, capsys, tmp_path):
    """scripts/bench_generalisation.py: both sets decoded greedily as without the draft, the HF forward's argmax is the
    answer (its probabilities read at the right positions), and the split multiplies back to the ratio."""
    from trtspec.bench import load_prompt_rows

    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"prompt": p, "category": c}) + "\n" for p, c in [
        ("Summarise: the river rose after three days of rain and the bridge closed.", "summarization"),
        ("You are a pirate. Greet the crew.", "roleplay")]))
    bench = load_script("bench_generalisation")
    monkeypatch.setattr(sys, "argv", ["bench_generalisation.py", str(ci_run), "--suite", str(suite), "--prompts", "3",
                                      "--max-new-tokens", "24", "--no-compile", "--json"])
    bench.main()
    out = json.loads(capsys.readouterr().out)
    held, s = out["heldout"], out["suite"]
    assert held["prompts"] == min(3, len(load_prompt_rows(ci_run, 3))) and s["prompts"] == 2
    assert held["identical"] == held["prompts"] and s["identical"] == 2
    assert held["scorer_argmax_agrees"] >= 0.95 and s["scorer_argmax_agrees"] >= 0.95
    assert out["ratio"] == pytest.approx(out["difficulty"] * out["generalisation"], abs=0.01)
    for x in (held, s):
        assert x["steps"] == sum(b["steps"] for b in x["by_confidence"]) > 0 and 1.0 <= x["AL"] <= 1 + out["k"]
    assert sum(v["steps"] for v in s["per_category"].values()) == s["steps"] and set(s["per_category"]) == {"summarization", "roleplay"}


def test_step_bench_on_a_suite(ci_run, monkeypatch, capsys, tmp_path):
    """scripts/bench_step.py --suite: the suite's prompts (spread over the file) timed as the held-out ones are, greedy
    output identical with and without the draft, the step's cost in decode steps."""
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"prompt": f"Question {i}: name a colour and a fruit.", "category": "chat"}) + "\n"
                             for i in range(4)))
    bench = load_script("bench_step")
    monkeypatch.setattr(sys, "argv", ["bench_step.py", str(ci_run), "--suite", str(suite), "--prompts", "2",
                                      "--max-new-tokens", "12", "--rounds", "1", "--no-compile", "--json"])
    bench.main()
    out = json.loads(capsys.readouterr().out)
    assert out["prompts_from"] == str(suite) and out["greedy_identical"] and out["prompt_tokens"] > 10
    assert out["rows"][0]["step_in_decode_steps"] > 0 and 1.0 <= out["rows"][0]["acceptance_length"] <= 4.0


def test_drafters_bench_on_a_suite(ci_run, monkeypatch, capsys, tmp_path):
    """scripts/bench_drafters.py --suite: the suite as the one prompt set, every draft's greedy output identical to
    the runtime without a draft."""
    suite = tmp_path / "mine.jsonl"
    suite.write_text("".join(json.dumps({"prompt": f"Question {i}: name a colour.", "category": "chat"}) + "\n" for i in range(4)))
    bench = load_script("bench_drafters")
    monkeypatch.setattr(sys, "argv", ["bench_drafters.py", str(ci_run), "--suite", str(suite), "--prompts", "2",
                                      "--max-new-tokens", "12", "--no-compile", "--json"])
    bench.main()
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["prompts"] for r in rows} == {"mine"} and all(r["identical"] == r["of"] == 2 for r in rows)


def test_drafting_bench_keeps_greedy_output(ci_run, monkeypatch, capsys, tmp_path):
    """scripts/bench_drafting.py: the head, suffix drafting alone, in front of the head and beside it, each prompt in
    turn; every method's greedy output identical to the runtime without a draft, on the held-out set and a file."""
    mine = tmp_path / "mine.jsonl"
    mine.write_text("".join(json.dumps({"prompt": f"Repeat after me: red, green, blue, {i}."}) + "\n" for i in range(2)))
    bench = load_script("bench_drafting")
    monkeypatch.setattr(sys, "argv", ["bench_drafting.py", str(ci_run), "--sets", f"heldout,{mine}", "--prompts", "2",
                                      "--max-new-tokens", "12", "--no-compile", "--json"])
    bench.main()
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["method"] for r in rows} == {"eagle3", "suffix", "eagle3+suffix", "eagle3|suffix"}
    assert {r["set"] for r in rows} == {"heldout", str(mine)}
    assert all(r["exact"] == r["prompts"] == 2 and 1.0 <= r["acceptance_length"] for r in rows), rows


@pytest.mark.full
def test_speculative_bench_keeps_greedy_output(ci_run):
    """scripts/bench_speculative.py on a finished run: one row per k, and the speculative outputs equal HF generate's."""
    import subprocess

    out = subprocess.run([sys.executable, str(SCRIPTS / "bench_speculative.py"), str(ci_run), "--prompts", "2",
                          "--max-new-tokens", "8", "--ks", "1,2", "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout[out.stdout.index("{"):])["rows"]
    assert [r["k"] for r in rows] == [1, 2]
    assert all(r["exact"] == 2 and r["acceptance_length"] >= 1.0 and r["hf_generate"] > 0 for r in rows)


@pytest.mark.full
def test_compile_bench_compiles_with_an_empty_and_a_warm_cache(ci_run):
    """scripts/bench_compile.py: a process with an empty inductor cache, then one reusing it; both compile."""
    import subprocess

    out = subprocess.run([sys.executable, str(SCRIPTS / "bench_compile.py"), str(ci_run), "--runs", "2", "--json"],
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout[out.stdout.index("{"):])["rows"]
    assert [r["cache"] for r in rows] == ["empty", "warm"]
    assert all("compiled with torch.compile" in r["note"] and r["seconds"] > 0 for r in rows)
