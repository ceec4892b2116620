"""Pipeline control flow with stand-in stage functions: order, skip when unchanged, redo downstream on change."""

from __future__ import annotations

import json
import types

import pytest

from trtspec.config import STAGES, config_from_dict
from trtspec.errors import ArtifactError, ConfigError, DataError
from trtspec.pipeline import runner as pipeline

RAW = {"data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}}


@pytest.fixture
def calls(monkeypatch):
    """Replace each stage's run() with one that records the call and writes a file."""
    seen: list[str] = []

    def make(stage):
        def run(ctx):
            seen.append(stage)
            for dep, folder in ctx.inputs.items():  # upstream folders are finished stages
                assert (folder / "manifest.json").is_file(), dep
            (ctx.out / f"{stage}.txt").write_text(stage)
            return {"headline": f"{stage} ok"}

        return types.SimpleNamespace(run=run)

    modules = {s: make(s) for s in STAGES}
    monkeypatch.setattr(pipeline, "stage_module", lambda s: modules[s])
    monkeypatch.setattr(pipeline, "check_inputs", lambda cfg, stages: None)  # the stand-ins read no files
    return seen


def test_runs_in_order_then_skips_everything(tmp_path, calls):
    cfg = config_from_dict(RAW)
    res = pipeline.run_build(cfg, tmp_path / "r")
    assert calls == list(STAGES) and all(r.status == "done" for r in res)
    calls.clear()
    res = pipeline.run_build(cfg, tmp_path / "r")
    assert calls == [] and all(r.status == "cached" for r in res)
    assert res[0].headline == "data ok"


def test_each_stage_reports_its_own_peak_memory(tmp_path, calls, monkeypatch):
    """A stage's manifest holds its own peak resident memory, not the largest of the stages before it (Linux resets
    the process's high-water mark at each stage's start)."""
    from trtspec.artifacts import reset_peak_rss

    if not reset_peak_rss():
        pytest.skip("this OS cannot reset a process's high-water mark: a stage's peak is the build's so far")

    def data(ctx):
        block = bytearray(512 << 20)
        block[:: 1 << 12] = b"x" * len(block[:: 1 << 12])  # touch every page: resident, not just reserved
        del block
        (ctx.out / "data.txt").write_text("data")
        return {"headline": "data ok"}

    monkeypatch.setattr(pipeline.stage_module("data"), "run", data)
    pipeline.run_build(config_from_dict(RAW), tmp_path / "r", until="convert")
    data_m, convert_m = (json.loads((tmp_path / "r" / s / "manifest.json").read_text()) for s in ("data", "convert"))
    assert data_m["peak_rss_of"] == convert_m["peak_rss_of"] == "stage"
    assert data_m["peak_rss_gib"] - convert_m["peak_rss_gib"] > 0.4


def test_train_change_redoes_train_and_downstream_only(tmp_path, calls):
    pipeline.run_build(config_from_dict(RAW), tmp_path / "r")
    calls.clear()
    pipeline.run_build(config_from_dict({**RAW, "train": {"lr": 1e-4}}), tmp_path / "r")
    assert calls == ["train", "export", "engine", "validate"]


def test_engine_measurement_knob_redoes_the_engine_stage_only(tmp_path, calls):
    """engine.batch_sizes is measurement only (not in the bundle): the export is kept, the engine stage redone."""
    pipeline.run_build(config_from_dict(RAW), tmp_path / "r")
    calls.clear()
    pipeline.run_build(config_from_dict({**RAW, "engine": {"batch_sizes": [1, 4]}}), tmp_path / "r")
    assert calls == ["engine"]
    calls.clear()
    pipeline.run_build(config_from_dict({**RAW, "engine": {"batch_sizes": [1, 4]}, "serve": {"max_batch_size": 4}}), tmp_path / "r")
    assert calls == ["export", "engine", "validate"]  # a serving option: the bundle changes


def test_model_change_redoes_everything(tmp_path, calls):
    pipeline.run_build(config_from_dict(RAW), tmp_path / "r")
    calls.clear()
    pipeline.run_build(config_from_dict({**RAW, "model": {"source": "other/model"}}), tmp_path / "r")
    assert calls == list(STAGES)


def test_local_model_replaced_in_place_redoes_everything(tmp_path, calls):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"old weights")
    raw = {**RAW, "model": {"source": str(model)}}
    pipeline.run_build(config_from_dict(raw), tmp_path / "r")
    calls.clear()
    pipeline.run_build(config_from_dict(raw), tmp_path / "r")
    assert calls == []
    (old_scratch,) = (tmp_path / "r/.work").glob("data-*")
    (model / "model.safetensors").write_bytes(b"new weights, a new size")  # retrained into the same folder
    pipeline.run_build(config_from_dict(raw), tmp_path / "r")
    assert calls == list(STAGES)
    assert not old_scratch.exists()  # the old model's regenerated answers are not reused


def test_edited_data_file_redoes_data_and_downstream(tmp_path, calls):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "a"}\n')
    prompts = tmp_path / "p.txt"
    prompts.write_text("a\n")
    raw = {"data": {"sources": [{"kind": "regenerate", "path": str(rows)}]}, "eval": {"prompts": str(prompts)}}
    pipeline.run_build(config_from_dict(raw), tmp_path / "r")
    calls.clear()
    pipeline.run_build(config_from_dict(raw), tmp_path / "r")
    assert calls == []
    prompts.write_text("b\n")
    pipeline.run_build(config_from_dict(raw), tmp_path / "r")
    assert calls == ["validate"]
    calls.clear()
    (scratch,) = (tmp_path / "r/.work").glob("data-*")  # the data stage's answers live here, keyed by prompt
    (scratch / "answers.jsonl").write_text("kept")
    rows.write_text('{"prompt": "b"}\n')
    pipeline.run_build(config_from_dict(raw), tmp_path / "r")
    assert calls == list(STAGES)
    assert (scratch / "answers.jsonl").read_text() == "kept"  # so only the edited file's new prompts are answered


def test_corrupted_stage_is_redone_and_identical_output_keeps_downstream(tmp_path, calls):
    pipeline.run_build(config_from_dict(RAW), tmp_path / "r")
    (tmp_path / "r" / "convert" / "convert.txt").write_text("tampered")
    calls.clear()
    pipeline.run_build(config_from_dict(RAW), tmp_path / "r")
    assert calls == ["convert"]  # redone; it wrote the same bytes, so train & co. still hold


def test_truncated_manifest_is_redone(tmp_path, calls):
    pipeline.run_build(config_from_dict(RAW), tmp_path / "r")
    manifest = tmp_path / "r" / "convert" / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])
    calls.clear()
    res = pipeline.run_build(config_from_dict(RAW), tmp_path / "r")
    assert calls == ["convert"]  # neither trusted nor fatal: redone, and the same bytes keep train & co.
    assert [r.status for r in res] == ["cached", "done", *["cached"] * (len(STAGES) - 2)]
    assert json.loads(manifest.read_text())["status"] == "done"


def test_redone_stage_with_new_output_redoes_downstream(tmp_path, calls, monkeypatch):
    pipeline.run_build(config_from_dict(RAW), tmp_path / "r")
    orig = pipeline.stage_module

    def convert_differently(ctx):
        (ctx.out / "convert.txt").write_text("a different head")
        return {}

    monkeypatch.setattr(pipeline, "stage_module", lambda s: types.SimpleNamespace(run=convert_differently) if s == "convert" else orig(s))
    calls.clear()
    pipeline.run_build(config_from_dict(RAW), tmp_path / "r", start="convert", until="convert")
    pipeline.run_build(config_from_dict(RAW), tmp_path / "r")
    assert calls == ["train", "export", "engine", "validate"]


def test_from_until_and_force(tmp_path, calls):
    cfg = config_from_dict(RAW)
    pipeline.run_build(cfg, tmp_path / "r", until="convert")
    assert calls == ["data", "convert"]
    calls.clear()
    pipeline.run_build(cfg, tmp_path / "r", start="convert", until="train")
    assert calls == ["convert", "train"]
    calls.clear()
    pipeline.run_build(cfg, tmp_path / "r", until="data", force=True)
    assert calls == ["data"]


def test_unknown_stage_names_nearest(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'train'"):
        pipeline.run_build(config_from_dict(RAW), tmp_path / "r", until="trian")


def test_failed_stage_leaves_no_folder_and_reports(tmp_path, calls, monkeypatch):
    def boom(ctx):
        (ctx.out / "half.bin").write_text("half")
        raise DataError("bad rows")

    orig = pipeline.stage_module
    monkeypatch.setattr(pipeline, "stage_module", lambda s: types.SimpleNamespace(run=boom) if s == "train" else orig(s))
    seen = []
    with pytest.raises(DataError):
        pipeline.run_build(config_from_dict(RAW), tmp_path / "r", on_result=seen.append)
    assert [r.status for r in seen] == ["done", "done", "failed"]
    assert not (tmp_path / "r" / "train").exists() and not (tmp_path / "r" / ".tmp-train").exists()
    assert not (tmp_path / "r" / ".lock").exists()


@pytest.mark.parametrize("failure, free, full", [
    (RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"), 10 << 30, True),
    (OSError(28, "No space left on device"), 10 << 30, True),
    (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 896 vs 790"), 4096, True),  # torch.save
    (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 896 vs 790"), 10 << 30, False),
    (DataError("bad rows"), 0, False),  # our own errors say what they are
])
def test_a_stage_failing_on_a_full_disk_says_so(tmp_path, calls, monkeypatch, failure, free, full):
    """Libraries report a full disk in their own words (safetensors, torch.save without an errno): the build says it
    in one line of its own (exit 5), and only then."""
    import shutil

    from trtspec.errors import DiskFull

    def boom(ctx):
        raise failure

    orig = pipeline.stage_module
    monkeypatch.setattr(pipeline, "stage_module", lambda s: types.SimpleNamespace(run=boom) if s == "train" else orig(s))
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(pipeline.shutil, "disk_usage", lambda p: usage._replace(free=free))
    with pytest.raises(BaseException) as got:
        pipeline.run_build(config_from_dict(RAW), tmp_path / "r")
    assert isinstance(got.value, DiskFull) is full, got.value
    if full:
        assert got.value.exit_code == 5 and "the train stage wrote into" in got.value.message
    assert not (tmp_path / "r" / "train").exists() and (tmp_path / "r" / "convert" / "manifest.json").is_file()


def test_skipped_stage_skips_dependents(tmp_path, calls, monkeypatch):
    def skip(ctx):
        raise pipeline.StageSkipped("no GPU here")

    orig = pipeline.stage_module
    monkeypatch.setattr(pipeline, "stage_module", lambda s: types.SimpleNamespace(run=skip) if s == "export" else orig(s))
    res = {r.stage: r for r in pipeline.run_build(config_from_dict(RAW), tmp_path / "r")}
    assert res["export"].status == "skipped" and res["engine"].status == "skipped" and res["validate"].status == "skipped"
    assert "export" in res["validate"].reason


def test_preflight_checks_only_stages_that_will_run_before_any_stage(tmp_path, calls, monkeypatch):
    checked, loads = [], []
    for stage in ("convert", "quantize"):
        pipeline.stage_module(stage).preflight = lambda cfg, mc, stage=stage: checked.append((stage, mc))
    monkeypatch.setattr(pipeline, "load_model_config", lambda source: loads.append(source) or "model-config")
    pipeline.run_build(config_from_dict(RAW), tmp_path / "r")
    assert checked == [("convert", "model-config"), ("quantize", "model-config")] and len(loads) == 1
    checked.clear(), loads.clear(), calls.clear()
    pipeline.run_build(config_from_dict(RAW), tmp_path / "r")  # all cached: the model is not even resolved
    assert checked == [] and loads == []
    pipeline.run_build(config_from_dict({**RAW, "quantize": {"format": "fp8"}}), tmp_path / "r")
    assert [s for s, _ in checked] == ["quantize"] and calls == ["quantize", "export", "engine", "validate"]

    def refuse(cfg, mc):
        raise ConfigError("bad convert setting")

    checked.clear(), calls.clear()
    pipeline.stage_module("convert").preflight = refuse
    with pytest.raises(ConfigError, match="bad convert setting"):
        pipeline.run_build(config_from_dict({**RAW, "model": {"source": "other/model"}}), tmp_path / "r")
    assert calls == []  # not even the data stage ran


def as_written_by_validate(run) -> None:
    """The validate folder's manifest vouching for its files as they are now (a report validate itself wrote)."""
    from trtspec.artifacts import file_table, write_json

    m = run.manifest("validate")
    write_json(run.stage_dir("validate") / "manifest.json", {**m, "files": file_table(run.stage_dir("validate"))})


def test_validate_records_the_export_it_measured_as_deploy_reads_it(tmp_path, calls, monkeypatch):
    """deploy's drafting choice trusts validate's report only for the bundle it measured: the runner's record of
    validate's input and deploy's reading of it must agree (and disagree once export is redone with other outputs)."""
    import json

    from trtspec.artifacts import RunDir
    from trtspec.deploy.serving import measured_drafting

    stand_in = pipeline.stage_module

    def validate_run(ctx):
        (ctx.out / "report.json").write_text(json.dumps({"drafting": {
            "fastest": "eagle3_suffix", "suffix_len": 8,
            "methods": {m: {"tokens_per_s": 1.0} for m in ("speculative", "suffix", "eagle3_suffix")}}}))
        return {"headline": "validate ok"}

    exports = []

    def export_run(ctx):  # each export writes another bundle
        exports.append(1)
        (ctx.out / "bundle.txt").write_text(f"bundle {len(exports)}")
        return {"headline": "export ok"}

    runs = {"validate": validate_run, "export": export_run}
    monkeypatch.setattr(pipeline, "stage_module", lambda s: types.SimpleNamespace(run=runs[s]) if s in runs else stand_in(s))
    pipeline.run_build(config_from_dict(RAW), tmp_path / "r")
    run = RunDir(tmp_path / "r")
    assert measured_drafting(run)[:2] == ("eagle3_suffix", 8)
    # a DFlash bundle: "speculative" is its own draft, and suffix matching in front of it is not served
    report = run.stage_dir("validate") / "report.json"
    data = {**json.loads(report.read_text()), "draft_method": "dflash"}
    data["drafting"]["fastest"] = "speculative"
    report.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"validate/report\.json' no longer matches what the validate stage wrote"):
        measured_drafting(run)  # edited by hand: refused by name, never served
    as_written_by_validate(run)
    assert measured_drafting(run)[0] == "dflash"
    data["drafting"]["fastest"] = "eagle3_suffix"
    report.write_text(json.dumps(data))
    as_written_by_validate(run)
    assert measured_drafting(run)[0] is None and "do not serve together" in measured_drafting(run)[2]
    pipeline.run_build(config_from_dict(RAW), tmp_path / "r", start="export", until="export")  # validate not redone
    assert "older bundle" in measured_drafting(run)[2]


def test_preflight_reads_a_source_as_the_data_stage_will(tmp_path):
    """A conversation is usable as it is, but gives no prompt to regenerate when nothing comes before its answer."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"messages": [{"role": "assistant", "content": "Hello."}]}\n')
    source = {"kind": "jsonl", "path": str(rows)}
    pipeline.check_inputs(config_from_dict({"data": {"sources": [source]}}), ["data"])
    with pytest.raises(DataError, match=r"holds no usable prompt \(1 conversation without a turn before its answer\)"):
        pipeline.check_inputs(config_from_dict({"data": {"sources": [{**source, "regenerate": True}]}}), ["data"])
    pipeline.check_inputs(config_from_dict({"data": {"sources": [{**source, "regenerate": True}]}}), ["convert"])  # not read
    rows.write_text('{"messages": [{"role": "user", "content": "  "}, {"role": "assistant", "content": "Hello."}]}\n')
    with pytest.raises(DataError, match=r"holds no usable prompt \(1 an empty prompt\)"):  # the target asked nothing
        pipeline.check_inputs(config_from_dict({"data": {"sources": [{**source, "regenerate": True}]}}), ["data"])


def test_keys_added_after_runs_were_made_are_keyed_only_when_set():
    """model.train_on_quantized and draft.grow_vocab came after runs were made: at their defaults they are left out of
    the stages' keys (those runs stay finished), set they redo what reads them."""
    plain = config_from_dict(RAW)
    assert "train_on_quantized" not in pipeline._section_values(plain, "data")["model"]
    assert "draft.grow_vocab" not in pipeline._section_values(plain, "convert")
    assert "grow_vocab" not in pipeline._section_values(plain, "export")["draft"]
    grown = config_from_dict({**RAW, "draft": {"grow_vocab": 64}})
    assert pipeline._section_values(grown, "convert")["draft.grow_vocab"] == 64
    assert pipeline._section_values(grown, "export")["draft"]["grow_vocab"] == 64
    served = config_from_dict({**RAW, "model": {"train_on_quantized": "runs/fp8"}})
    assert pipeline._section_values(served, "data")["model"]["train_on_quantized"] == "runs/fp8"
    assert pipeline._section_values(served, "train")["model.train_on_quantized"] == "runs/fp8"


AUTO = {**RAW, "data": {**RAW["data"], "answer_with": "auto"}, "train": {"states_from": "auto"}}


@pytest.fixture
def vllm_here(monkeypatch):
    """vLLM installed and running every target (its build refusal None), unless a test says otherwise."""
    from trtspec.engines import vllm as vllm_engine

    monkeypatch.setattr(vllm_engine, "installed", lambda: True)
    monkeypatch.setattr(vllm_engine, "build_refusal", lambda model_config, method: None)
    monkeypatch.setattr(pipeline, "load_model_config", lambda source: "model-config")
    return vllm_engine


def resolved(raw: dict) -> tuple[str, str, list[str]]:
    said: list[str] = []
    cfg = pipeline.resolve_engines(config_from_dict(raw), said.append)
    return cfg.data.answer_with, cfg.train.states_from, said


def test_auto_answers_and_states_come_from_vllm_where_it_runs_the_target(vllm_here):
    assert resolved(AUTO) == ("vllm", "vllm", ["data.answer_with: auto -> vllm; train.states_from: auto -> vllm"])


def test_auto_falls_back_to_hf_saying_why(vllm_here, monkeypatch):
    monkeypatch.setattr(vllm_here, "installed", lambda: False)
    assert resolved(AUTO)[:2] == ("hf", "hf")
    monkeypatch.setattr(vllm_here, "installed", lambda: True)
    monkeypatch.setattr(vllm_here, "build_refusal", lambda cfg, method: "no states" if method == "eagle3" else None)
    answers, states, said = resolved(AUTO)
    assert (answers, states) == ("vllm", "hf") and said == ["data.answer_with: auto -> vllm; train.states_from: auto -> hf (no states)"]
    online = {**AUTO, "train": {"states_from": "auto", "mode": "online"}}
    monkeypatch.setattr(vllm_here, "build_refusal", lambda cfg, method: None)
    assert resolved(online)[:2] == ("vllm", "hf")  # the HF forward runs in every step
    quantized = {**AUTO, "model": {"train_on_quantized": "runs/fp8"}}
    assert resolved(quantized)[:2] == ("hf", "hf")  # only the HF target is quantized


def test_auto_streamed_states_with_no_engine_is_one_line(vllm_here, monkeypatch):
    monkeypatch.setattr(vllm_here, "installed", lambda: False)
    streamed = {**AUTO, "train": {"states_from": "auto", "mode": "streamed"}}
    with pytest.raises(ConfigError, match="no engine to stream states from: vllm is not installed"):
        resolved(streamed)


def test_concrete_settings_are_left_as_they_are(monkeypatch):
    monkeypatch.setattr(pipeline, "load_model_config", lambda source: pytest.fail("no auto: nothing to resolve"))
    cfg = config_from_dict(RAW)
    assert pipeline.resolve_engines(cfg, pytest.fail) is cfg


def test_a_build_keys_its_stages_on_what_auto_resolved_to(tmp_path, calls, vllm_here):
    pipeline.run_build(config_from_dict(AUTO), tmp_path / "r", until="train")
    data = json.loads((tmp_path / "r" / "data" / "manifest.json").read_text())
    assert data["config"]["data"]["answer_with"] == "vllm"
    assert data["from_auto"] == ["data.answer_with"]  # trtspec adapt chooses again where it runs
    train = json.loads((tmp_path / "r" / "train" / "manifest.json").read_text())
    assert train["config"]["train"]["states_from"] == "vllm" and train["from_auto"] == ["train.states_from"]
