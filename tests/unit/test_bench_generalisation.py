"""scripts/bench_generalisation.py's arithmetic: which answer position each speculative step's first guess aims at,
the bins, and the split of a suite's AL ratio into the traffic's difficulty and the draft's generalisation."""

from __future__ import annotations

import pytest
from stagekit import load_script

bench = load_script("bench_generalisation")


def test_each_step_reads_the_token_its_first_guess_aims_at():
    # answer[0] from the prefill; steps accept 2, 0, 1 -> first guesses aim at positions 1, 4, 5; the fourth step
    # would aim at 7, past the 7-token answer, and is dropped
    p = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    vocab = [True, True, True, True, False, True, True]
    got = bench.step_records([2, 0, 1, 0], list(range(7)), p, vocab)
    assert got == [(0.1, True, 2, True), (0.4, False, 0, False), (0.5, True, 1, True)]


def test_bins_cover_zero_to_one():
    assert [bench.bin_of(p) for p in (0.0, 0.49, 0.5, 0.94, 0.95, 0.99, 1.0)] == [0, 0, 1, 2, 3, 4, 4]


def rows(*per_bin):  # [(target p, accepted)] -> records, all in the draft vocabulary
    return [(p, a >= 1, a, True) for p, a in per_bin]


def test_a_suite_of_harder_tokens_is_difficulty_not_generalisation():
    held = bench.summary(rows((0.2, 0), (0.2, 0), (0.999, 3), (0.999, 3)))  # AL 1 on hard tokens, 4 on easy ones
    suite = bench.summary(rows((0.2, 0), (0.2, 0), (0.2, 0), (0.999, 3)))  # the draft as good, the traffic harder
    d = bench.decompose(held, suite)
    assert held["AL"] == 2.5 and suite["AL"] == 1.75 and d["predicted_AL"] == 1.75
    assert d["difficulty"] == pytest.approx(0.7) and d["generalisation"] == 1.0


def test_a_draft_that_accepts_less_at_the_same_confidence_does_not_generalise():
    held = bench.summary(rows((0.2, 0), (0.999, 3)))
    suite = bench.summary(rows((0.2, 0), (0.999, 1)))
    d = bench.decompose(held, suite)
    assert d["difficulty"] == 1.0 and d["generalisation"] == d["ratio"] == pytest.approx(1.5 / 2.5)
    shares = [b["share"] for b in suite["by_confidence"]]
    assert sum(shares) == pytest.approx(1.0) and suite["by_confidence"][-1]["first_accepted"] == 1.0


def test_a_bin_the_held_out_prompts_never_reached_counts_at_their_overall_al():
    held = bench.summary(rows((0.999, 3), (0.999, 1)))  # AL 3 overall, every step in the last bin
    suite = bench.summary(rows((0.2, 0), (0.999, 3)))
    assert bench.decompose(held, suite)["predicted_AL"] == 3.0


def test_each_suite_category_is_split_against_the_whole_held_out_set():
    held = bench.summary(rows((0.2, 0), (0.999, 3)))  # AL 2.5; 1 on hard tokens, 4 on easy ones
    suite = [(0.2, False, 0, True, "hard"), (0.2, False, 0, True, "hard"), (0.999, True, 1, True, "easy")]
    got = bench.per_category(held, suite)
    assert got["hard"]["difficulty"] == pytest.approx(1 / 2.5) and got["hard"]["generalisation"] == 1.0
    assert got["easy"]["difficulty"] == pytest.approx(4 / 2.5) and got["easy"]["generalisation"] == pytest.approx(2 / 4)
