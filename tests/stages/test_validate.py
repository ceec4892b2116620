"""The validate stage on a tiny bundle: report contents, gates after the report, one-line errors for bad input."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
from stagekit import export_random_eagle, rerandomized

from trtspec.artifacts import RunDir
from trtspec.config import config_from_dict
from trtspec.errors import ArtifactError, DataError, ValidationFailed
from trtspec.pipeline.stage import StageContext

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory, tiny_model_dir):
    """data/heldout.jsonl and bundle/{target,draft} as the upstream stages leave them."""
    root = tmp_path_factory.mktemp("run")
    target = rerandomized(tiny_model_dir, root / "source", seed=0)
    bundle = root / "bundle"
    shutil.copytree(target, bundle / "target")
    export_random_eagle(target, bundle / "draft", keep_rope=False)  # modelopt's default export (yarn rope)
    data = root / "data"
    data.mkdir()
    rows = [
        {"id": "a", "category": "math", "messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]},
        {"id": "b", "category": "chat", "messages": [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello!"}]},
    ]
    (data / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "manifest.json").write_text(json.dumps({"config": {"model": {"source": str(target)}}}))  # the source, as recorded
    return root, target, bundle, data


def make_ctx(tmp_path: Path, run_inputs, draft: dict | None = None, evaluation: dict | None = None, **validate) -> StageContext:
    root, source, bundle, data = run_inputs
    raw = {
        "model": {"source": str(source)},
        "data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]},
        "eval": {"num_prompts": 2, "max_new_tokens": 12, "repeats": 1, **(evaluation or {})},
        "draft": {"length": 3, **(draft or {})},
        "validate": validate,
    }
    cfg = config_from_dict(raw, base_dir=tmp_path)
    out = tmp_path / "out"
    out.mkdir(parents=True)
    (tmp_path / "rundir").mkdir()
    return StageContext(cfg, RunDir(tmp_path / "rundir"), "validate", out, tmp_path / "work",
                        {"data": data, "export": bundle}, {})


# torch.compile's own work (inductor's C++ for every row count a tree verifies: minutes on a slow CPU, cold cache)
# is tested by test_runtime's compiled greedy test; the default tier runs validate with torch.compile as the identity,
# so compile_steps, its warm-up and the report run as they do compiled; the full tier compiles for real.
@pytest.mark.parametrize("inductor", [False, pytest.param(True, marks=pytest.mark.full)], ids=["compile-identity", "inductor"])
def test_validate_writes_report(tmp_path, run_inputs, monkeypatch, inductor):
    import torch

    from trtspec.stages import validate

    if not inductor:
        monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    metrics = validate.run(make_ctx(tmp_path, run_inputs, {"shape": "dynamic_tree"}, require_exact=True,
                                    compare_hf_min_speed=0))  # every comparison timed, however slow on this model
    r = json.loads((tmp_path / "out" / "report.json").read_text())
    assert r["greedy_match"] == {"matched": 2, "total": 2, "first_divergence": {}, "runtime_no_draft_matched": 2}
    assert r["prompts"] == 2 and r["draft_len"] == 3 and r["acceptance_length"] >= 1.0
    assert set(r["tokens_per_s"]) == {"hf_generate", "runtime_no_draft", "speculative", "hf_prompt_lookup", "hf_assisted"}
    assert "assistant_early_exit" in r["method_notes"]["hf_assisted"]
    # each run's wall time, in run order: 2 prompts x the config's repetitions per method
    assert {m: len(s) for m, s in r["run_seconds"].items()} == {m: 2 * r["repeats"] for m in r["tokens_per_s"]}
    assert r["speedup_vs_hf"] == pytest.approx(r["tokens_per_s"]["speculative"] / r["tokens_per_s"]["hf_generate"], rel=0.01)
    # the cost model: speculative / no-draft speed = AL / (cost of one speculative step in decode steps)
    # the step's cost from the decode steps alone (the prompts' prefill is no step): AL x decode / speculative decode
    dec = r["decode_tokens_per_s"]
    assert r["step_cost_vs_decode"] == pytest.approx(r["acceptance_length"] * dec["runtime_no_draft"] / dec["speculative"], rel=0.01)
    assert set(r["per_category"]) == {"math", "chat"}
    for c in r["per_category"].values():  # each category: AL within its interval, a rate per draft position, exactness
        assert c["ci95"][0] <= c["acceptance_length"] <= c["ci95"][1] and len(c["per_position"]) == 3
        assert c["exact"] == c["prompts"]
    assert sum(c["prompts"] for c in r["per_category"].values()) == 2
    assert r["target"]["model_type"] == "llama" and r["target"]["layers"] == 4
    assert set(r["sampling_check"]) == {"speculative"} and r["sampling_check"]["speculative"]["passed"], r["sampling_check"]
    assert r["sampling_check"]["speculative"]["drafted"] == 200  # the head drafts every time
    for f in ("report.md", "acceptance_histogram.png", "per_position_acceptance.png", "speed.png"):
        assert (tmp_path / "out" / f).stat().st_size > 0
    assert "2/2" in metrics["headline"]
    assert r["drafting"] is None  # suffix drafting off: nothing to compare
    # the timed runtime is the compiled one (this machine and CI have a C++ compiler), and the report says so
    assert r["runtime_compiled"] is True and "torch.compile" in r["compile"]["note"]
    assert "Compilation:" in (tmp_path / "out" / "report.md").read_text()
    # the kernels were chosen by timing on this machine, and the report says which and what bounds the speed
    from trtspec.runtime.kernels import CANDIDATES

    assert set(r["kernels"]["target"]["by_rows"]) <= set(CANDIDATES) and set(r["kernels"]["draft"]["by_rows"]) <= set(CANDIDATES)
    storage = r["kernels"]["draft"]["draft_weights"]  # how the draft's weights are stored, timed at load
    assert storage["weights"] in ("float32", "bfloat16") and set(storage["ms_per_pass"]) == {"float32", "bfloat16"}
    assert f"The draft's weights: {storage['weights']}" in (tmp_path / "out" / "report.md").read_text()
    packed = r["kernels"]["target"]["packed_mb"]  # the memory a packed copy of the target's weights takes, if chosen
    assert (packed > 0) == ("packed" in r["kernels"]["target"]["by_rows"])
    assert ("The `packed` kernel reads a copy" in (tmp_path / "out" / "report.md").read_text()) == (packed > 0)
    assert r["kernels"]["target"]["native_pass"]  # this machine and CI build the native kernels: one call per pass
    assert "passes run as one native call each" in (tmp_path / "out" / "report.md").read_text()
    lim = r["limits"]
    assert lim["bandwidth"]["gb_per_s"] > 0 and lim["limit_tokens_per_s"] > 0
    # sampled among the timed runs: before them, and after each prompt's HF, no-draft and last run (2 prompts, 1 repetition)
    samples = lim["bandwidth"]["samples_gb_per_s"]
    assert len(samples) == 7
    # each no-draft run is held against the mean of the samples right before and after it
    around = lim["bandwidth"]["no_draft_runs_gb_per_s"]
    assert around == pytest.approx([(samples[1] + samples[2]) / 2, (samples[4] + samples[5]) / 2], abs=0.01)
    runs = lim["decode_runs_tokens_per_s"]
    assert len(runs) == 2 and all(t > 0 for t in runs)
    mb = lim["weight_mb_per_token"]
    assert lim["decode_fraction_runs"] == pytest.approx([t / (b * 1e3 / mb) for t, b in zip(runs, around, strict=True)], rel=0.01)
    assert lim["decode_fraction_of_limit"] == pytest.approx(statistics.median(lim["decode_fraction_runs"]), abs=0.002)
    assert lim["no_draft_fraction_of_limit"] == pytest.approx(lim["no_draft_tokens_per_s"] / lim["limit_tokens_per_s"], rel=0.01)
    assert lim["no_draft_tokens_per_s"] == pytest.approx(r["tokens_per_s"]["runtime_no_draft"], rel=0.01)
    # decode steps alone: the prefill's time and the first token taken out. Not always faster than per answer: that
    # holds only while a prompt's prefill costs more than a token (a short prompt's eager prefill on a busy host
    # can cost less than a compiled step), so only its sign and the step time that follows from it are checked
    assert lim["decode_tokens_per_s"] > 0
    assert lim["decode_step_ms"] == pytest.approx(1e3 / lim["decode_tokens_per_s"], rel=0.01, abs=0.001)  # rounded to 1 us
    assert r["machine"]["cores"] >= 1
    # the step by the products' timing: the verify pass over its rows (a tree: more than FEW_ROWS) at the kernels' cost
    from trtspec.measure import products_cost
    from trtspec.runtime.kernels import FEW_ROWS

    assert r["verify_rows"] > FEW_ROWS
    verify = products_cost(r["kernels"]["target"], r["verify_rows"])
    assert lim["step_cost_by_products"] == pytest.approx(verify - 1 + lim["step_cost_by_bytes"], abs=0.002)
    assert "by the products' timing at load" in (tmp_path / "out" / "report.md").read_text()
    assert "What limits the speed" in (tmp_path / "out" / "report.md").read_text()
    assert "median of 2 runs" in (tmp_path / "out" / "report.md").read_text()


def test_validate_compares_suffix_drafting(tmp_path, run_inputs):
    """draft.suffix_len on: EAGLE-3, suffix and both timed side by side, every greedy output identical."""
    from trtspec.stages import validate

    validate.run(make_ctx(tmp_path, run_inputs, {"suffix_len": 6, "suffix_min_match": 2}, compile=False))
    r = json.loads((tmp_path / "out" / "report.json").read_text())
    d = r["drafting"]
    assert set(d["methods"]) == {"speculative", "suffix", "eagle3_suffix"} and d["fastest"] in d["methods"]
    assert d["suffix_len"] == 6
    # lossless at temperature > 0 with each drafting, each check exercising drafts
    checks = r["sampling_check"]
    assert set(checks) == set(d["methods"]) and all(c["passed"] and c["drafted"] > 0 for c in checks.values()), checks
    assert all(m["identical"] == 2 and m["acceptance_length"] >= 1.0 for m in d["methods"].values()), d
    assert d["methods"]["speculative"]["acceptance_length"] == r["acceptance_length"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Drafting methods side by side" in md and "| suffix |" in md.split("## Sampling check")[1]


def test_suite_categories_reach_the_report(tmp_path, run_inputs):
    """eval.suites: the builtin suite's categories are the report's per_category, prompt_source names the suite."""
    from trtspec.stages import validate

    suites = [{"kind": "builtin", "categories": ["code", "math"]}]
    validate.run(make_ctx(tmp_path, run_inputs, evaluation={"suites": suites, "max_new_tokens": 4}, compile=False,
                          compare_hf=False, sampling_temperature=None))
    r = json.loads((tmp_path / "out" / "report.json").read_text())
    assert r["prompt_source"] == "builtin (code, math)" and r["prompts_per_source"] == {"builtin (code, math)": 2}
    assert set(r["per_category"]) == {"code", "math"} and all(c["prompts"] == 1 for c in r["per_category"].values())
    for c in r["per_category"].values():  # each category's own speed, with and without the draft
        tps = c["tokens_per_s"]
        assert tps["speculative"] > 0 and tps["runtime_no_draft"] > 0
        assert c["speedup_vs_no_draft"] == round(tps["speculative"] / tps["runtime_no_draft"], 3)
    assert "speedup vs no draft |" in (tmp_path / "out" / "report.md").read_text()


def test_context_bins_measure_acceptance_by_context_length(tmp_path, run_inputs):
    """eval.context_bins: each prompt after earlier training conversations filling the bin, speculative output equal
    to the target's own at every length; the report and report.md carry the curve."""
    from trtspec.stages import validate

    root, source, bundle, data = run_inputs
    mine = tmp_path / "data"
    shutil.copytree(data, mine)
    talk = [{"messages": [{"role": "user", "content": f"Tell me fact {i} about rivers."},
                          {"role": "assistant", "content": f"Fact {i}: rivers carry water and silt to the sea."}]} for i in range(40)]
    (mine / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in talk))
    ctx = make_ctx(tmp_path, (root, source, bundle, mine), evaluation={"max_new_tokens": 6, "context_bins": [256, 64],
                   "context_prompts": 2}, compile=False, compare_hf=False, sampling_temperature=None)
    validate.run(ctx)
    r = json.loads((tmp_path / "out" / "report.json").read_text())
    short, long = r["per_context"]
    assert (short["bin"], long["bin"]) == (64, 256) and short["context_tokens"] < long["context_tokens"] <= 256
    assert short["exact"] == long["exact"] == 2 and short["vs_shortest"] == 1.0 and short["prompts"] == 2
    assert "| context (tokens) |" in (tmp_path / "out" / "report.md").read_text()
    for plot in ("acceptance_by_context.png", "acceptance_by_category.png"):
        assert (tmp_path / "out" / plot).stat().st_size > 1000 and f"]({plot})" in (tmp_path / "out" / "report.md").read_text()


def test_context_bins_can_be_filled_with_documents(tmp_path, run_inputs):
    """eval.context_source: documents: the bins filled with a document before each question (the user's file here,
    read as a file of the stage's), the output still the target's own."""
    from trtspec.stages import validate

    root, source, bundle, data = run_inputs
    docs = [{"text": f"Chapter {i}. The river town kept its bridges in good repair and counted boats every spring."}
            for i in range(30)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    ctx = make_ctx(tmp_path, run_inputs, evaluation={"max_new_tokens": 6, "context_bins": [200, 60], "context_prompts": 2,
                   "context_source": "documents", "context_documents": str(tmp_path / "docs.jsonl")},
                   compile=False, compare_hf=False, sampling_temperature=None)
    assert [f.name for f in validate.files_read(ctx.cfg)] == ["eval.context_documents"]
    validate.run(ctx)
    short, long = json.loads((tmp_path / "out" / "report.json").read_text())["per_context"]
    assert short["context_tokens"] < long["context_tokens"] <= 200 and short["exact"] == long["exact"] == 2


def test_a_context_bin_past_the_window_is_refused_before_any_stage(tmp_path, run_inputs):
    from transformers import AutoConfig

    from trtspec.errors import ConfigError
    from trtspec.stages import validate

    ctx = make_ctx(tmp_path, run_inputs, evaluation={"max_new_tokens": 8, "context_bins": [64, 4096]})
    model_config = AutoConfig.from_pretrained(run_inputs[1])
    window = model_config.max_position_embeddings
    ctx.cfg.eval.context_bins = [64, window]
    with pytest.raises(ConfigError, match=rf"eval.context_bins {window}: with eval.max_new_tokens 8 it needs {window + 8} tokens"):
        validate.preflight(ctx.cfg, model_config)


def test_gate_fails_after_writing_the_report(tmp_path, run_inputs):
    from trtspec.stages import validate

    ctx = make_ctx(tmp_path, run_inputs, min_speedup=1000.0, compile=False, compare_hf=False, sampling_temperature=None)
    with pytest.raises(ValidationFailed, match="speedup .* < required 1000"):
        validate.run(ctx)
    kept = ctx.run.path / "validate-failed" / "report.json"
    assert json.loads(kept.read_text())["gates"][0]["passed"] is False


def test_bad_inputs_are_one_line_errors(tmp_path, run_inputs):
    from trtspec.stages import validate

    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no usable prompts"):
        validate.run(make_ctx(tmp_path / "e", run_inputs, evaluation={"prompts": str(tmp_path / "empty.jsonl")}))
    with pytest.raises(DataError, match="exceed the target's context of 1024"):
        validate.run(make_ctx(tmp_path / "l", run_inputs, evaluation={"max_new_tokens": 5000}))
    root, source, bundle, data = run_inputs
    broken = tmp_path / "bundle"
    shutil.copytree(bundle, broken)
    (broken / "draft" / "model.safetensors").unlink()
    ctx = make_ctx(tmp_path / "b", run_inputs)
    ctx.inputs["export"] = broken
    with pytest.raises(ArtifactError, match=r"missing draft/model.safetensors"):
        validate.run(ctx)
