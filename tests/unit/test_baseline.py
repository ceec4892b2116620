"""validate.baseline, the per-category acceptance regression gate: a category whose AL falls more than the tolerance
below an earlier report's fails the gate by name; a baseline from another target or draft length, or no report at
all, is refused in one line."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from trtspec.checks import baseline_gate, check_gates, read_baseline
from trtspec.errors import ConfigError

TARGET = {"model_type": "llama", "hidden_size": 576, "layers": 30, "vocab_size": 49152}


def report(**al: float) -> dict:
    return {"target": TARGET, "draft_len": 3, "per_category": {c: {"acceptance_length": a} for c, a in al.items()}}


def write(tmp_path, data) -> object:
    p = tmp_path / "baseline.json"
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def test_a_category_that_dropped_past_the_tolerance_fails_by_name():
    gate = baseline_gate(report(math=2.0, code=1.5), {"math": 2.0, "code": 1.6, "rag": 1.9}, 0.02)
    assert not gate["passed"] and gate["message"].startswith("category 'code': AL 1.50 is 6.2% below the baseline's 1.60")
    assert gate["compared"] == ["code", "math"] and gate["not_measured"] == ["rag"]
    assert baseline_gate(report(math=1.97), {"math": 2.0}, 0.02)["passed"]  # 1.5% down: within 2%
    v = SimpleNamespace(require_exact=False, min_acceptance_length=None, min_speedup=None, baseline_tolerance=0.1,
                        baseline_min_prompts=1)
    assert check_gates(v, report(code=1.5), {"code": 1.6})[0]["passed"]
    assert check_gates(v, report(code=1.5), None) == []


def test_a_category_of_too_few_prompts_is_reported_not_gated():
    """One prompt's AL is no estimate of a category's: below validate.baseline_min_prompts a fall does not fail."""
    now = report(math=1.0, code=1.5)
    now["per_category"]["math"]["prompts"], now["per_category"]["code"]["prompts"] = 1, 4
    gate = baseline_gate(now, {"math": 2.0, "code": 1.5}, 0.02, min_prompts=3)
    assert gate["passed"] and gate["too_few_prompts"] == ["math"] and gate["compared"] == ["code"]
    assert gate["message"].endswith("not gated, fewer than 3 prompts: math")
    assert not baseline_gate(now, {"math": 2.0, "code": 1.5}, 0.02, min_prompts=1)["passed"]


def test_a_baseline_sharing_no_category_with_the_run_is_refused():
    from trtspec.checks import check_baseline_categories

    check_baseline_categories({"math": 2.0, "code": 1.6}, {"code", "chat"}, "b.json")  # one shared: gated on it
    with pytest.raises(ConfigError, match=r"shares no category .*baseline: code, math; this run: chat, writing"):
        check_baseline_categories({"math": 2.0, "code": 1.6}, {"chat", "writing"}, "b.json")


def test_an_earlier_report_is_read(tmp_path):
    assert read_baseline(write(tmp_path, report(math=2.1, chat=1.8)), TARGET, 3) == {"math": 2.1, "chat": 1.8}
    # a file the user writes by hand needs only per_category
    assert read_baseline(write(tmp_path, {"per_category": {"math": {"acceptance_length": 2}}}), TARGET, 3) == {"math": 2.0}


@pytest.mark.parametrize("data, message", [
    ("not json", "is not JSON"),
    ({"per_category": {}}, "has no per_category acceptance lengths"),
    ({"per_category": {"math": {"acceptance_length": "2"}}}, "has no per_category acceptance lengths"),
    ({**report(math=2.0), "target": {**TARGET, "layers": 16}}, "was measured on another target .*16 layers"),
    ({**report(math=2.0), "draft_len": 5}, "at draft length 5, this build drafts 3"),
])
def test_a_baseline_that_cannot_be_compared_is_refused(tmp_path, data, message):
    with pytest.raises(ConfigError, match=message):
        read_baseline(write(tmp_path, data), TARGET, 3)
    with pytest.raises(ConfigError, match="does not exist"):
        read_baseline(tmp_path / "missing.json", TARGET, 3)


def test_category_speeds_sum_each_categorys_runs_over_repetitions():
    """run i of a repetition is prompt i: a category's tokens over its runs' seconds, every repetition."""
    from trtspec.checks import category_speeds

    rows = [{"category": "a"}, {"category": "b"}, {"category": "a"}]
    timed = {"speculative": {"outputs": [[1] * 10, [1] * 4, [1] * 6], "run_seconds": [1.0, 1.0, 1.0, 1.0, 1.0, 3.0]},
             "runtime_no_draft": {"outputs": [[1] * 10, [1] * 4, [1] * 6], "run_seconds": [2.0, 1.0, 2.0, 2.0, 1.0, 2.0]}}
    got = category_speeds(rows, timed)
    assert got["a"]["tokens_per_s"] == {"speculative": round(32 / 6, 1), "runtime_no_draft": 4.0}
    assert got["b"]["tokens_per_s"] == {"speculative": 4.0, "runtime_no_draft": 4.0} and got["b"]["speedup_vs_no_draft"] == 1.0


def test_a_comparison_the_library_cannot_run_on_the_model_is_skipped_with_its_reason():
    """HF assisted generation with early exit raises IndexError inside transformers' cache on a GPT-OSS of 8
    alternating sliding/full layers (transformers 5.19); validate reports it skipped and keeps the other methods, and
    the model answers as before (transformers left it with the exit layer's depth, and validate's HF generate failed)."""
    import torch
    from transformers import AutoModelForCausalLM

    from trtspec.checks import hf_early_exit_answer, runnable_comparisons
    from trtspec.generation import hf_answer
    from trtspec.targets.tiny import tiny_config

    cfg = tiny_config("gpt_oss", 256, dict(bos_token_id=1, eos_token_id=2, pad_token_id=0))
    cfg.num_hidden_layers, cfg.layer_types = 8, ["sliding_attention", "full_attention"] * 4
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    methods = {"hf_prompt_lookup": lambda p: hf_answer(hf, p, 8, {2}, prompt_lookup_num_tokens=3),
               "hf_assisted": lambda p: hf_early_exit_answer(hf, p, 24, {2}, 2)}
    skipped, logged = {}, []
    before = hf_answer(hf, list(range(3, 40)), 8, {2})
    kept = runnable_comparisons(methods, list(range(3, 40)), skipped, logged.append)
    assert hf.config.num_hidden_layers == 8 and hf_answer(hf, list(range(3, 40)), 8, {2}) == before
    assert list(kept) == ["hf_prompt_lookup"]
    assert skipped["hf_assisted"].startswith("transformers raised IndexError on this model: list index out of range")
    assert logged == [f"hf_assisted skipped: {skipped['hf_assisted']}"]


def test_a_comparison_far_slower_than_hf_generate_is_reported_from_its_trial_and_not_timed():
    """validate.compare_hf_min_speed: a speed-up reading under that share of HF generate's speed on the first prompt
    is skipped with both figures; one as fast is kept; 0 keeps every one."""
    import time

    from trtspec.checks import runnable_comparisons

    def taking(seconds):  # a method answering 8 tokens in `seconds`
        return lambda p: time.sleep(seconds) or p[:8]

    methods = {"hf_prompt_lookup": taking(0.03), "hf_assisted": taking(0.6)}
    skipped, logged = {}, []
    kept = runnable_comparisons(methods, list(range(40)), skipped, logged.append, taking(0.03), 0.5)
    assert list(kept) == ["hf_prompt_lookup"]
    assert skipped["hf_assisted"].startswith("0.0") and " HF generate on the first prompt (" in skipped["hf_assisted"]
    assert skipped["hf_assisted"].endswith("under validate.compare_hf_min_speed 0.5: not timed further")
    assert logged == [f"hf_assisted skipped: {skipped['hf_assisted']}"]
    assert list(runnable_comparisons(methods, list(range(40)), {}, print, taking(0.03), 0)) == list(methods)
