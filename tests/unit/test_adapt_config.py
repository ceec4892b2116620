"""The build config `trtspec adapt` makes from an earlier run's manifests (trtspec.adapt.adapt_config)."""

from __future__ import annotations

import json

from trtspec.adapt import AdaptOptions, adapt_config, earlier_config
from trtspec.artifacts import RunDir, write_json
from trtspec.config import config_from_dict


def earlier(tmp, heldout=5):
    run = tmp / "earlier"
    RunDir(run).ensure()
    configs = {
        "data": {"model": {"source": "demo:smollm2-135m-instruct", "dtype": "auto"},
                 "data": {"sources": [{"kind": "regenerate", "path": "prompts/x.jsonl"}], "seq_len": 192,
                          "max_new_tokens": 128, "holdout_fraction": 0.03}, "seed": 3},
        "convert": {"convert": {"draft_vocab_size": 4096, "num_layers": 1}, "draft.method": "eagle3",
                    "dflash": {"block_size": 8, "num_layers": 2}},  # DFlash's defaults, as every manifest records them
        "train": {"train": {"epochs": 4.0, "lr": 1e-3, "max_steps": 500}, "draft.length": 3,
                  "eval.acceptance_prompts": 64},
        "validate": {"validate": {"baseline_tolerance": 0.05}, "eval": {"prompts": "p.jsonl", "num_prompts": 4}},
    }
    for stage, cfg in configs.items():
        (run / stage).mkdir()
        write_json(run / stage / "manifest.json", {"stage": stage, "status": "done", "config": cfg})
    (run / "data" / "heldout.jsonl").write_text("".join(json.dumps({"id": str(i)}) + "\n" for i in range(heldout)))
    (run / "validate" / "report.json").write_text("{}")
    return RunDir(run)


def test_earlier_config_leaves_out_keys_at_their_defaults(tmp_path):
    raw = earlier_config(earlier(tmp_path))
    assert "dflash" not in raw  # an EAGLE-3 run's recorded DFlash defaults would read as DFlash options
    assert raw["convert"] == {"draft_vocab_size": 4096} and raw["seed"] == 3
    assert "draft" not in raw  # eagle3 and length 3 are the defaults
    assert raw["data"]["seq_len"] == 192 and raw["train"] == {"epochs": 4.0, "lr": 1e-3, "max_steps": 500}


def test_adapt_config_trains_on_the_traffic_beside_the_earlier_rows_from_the_earlier_draft(tmp_path):
    run = earlier(tmp_path)
    raw = adapt_config(run, "traffic.jsonl", 100, longest_prompt=150, o=AdaptOptions(epochs=1.5, lr=2e-4, replay=2.0, grow_vocab=256))
    cfg = config_from_dict(raw, base_dir=tmp_path)  # a valid build config
    assert [s.kind for s in cfg.data.sources] == ["regenerate", "run"]
    assert cfg.data.sources[1].path == str(run.path.resolve()) and cfg.data.sources[1].limit == 160  # 2 x 80 trained on
    assert cfg.data.holdout_fraction == 0.2 and cfg.data.seq_len == 150 + 128
    assert cfg.draft.init_from == str(run.path.resolve()) and cfg.draft.max_category_drop == 0.05  # the run's tolerance
    assert cfg.draft.grow_vocab == 256 and cfg.draft.step_back == [0.75, 0.5, 0.25]
    assert (cfg.train.epochs, cfg.train.lr, cfg.train.max_steps) == (1.5, 2e-4, None)
    assert cfg.eval.acceptance_prompts == 5 + 20 and cfg.eval.prompts is None  # every held-out row, old and new
    assert cfg.validate_.baseline == str((run.path / "validate" / "report.json").resolve())
    assert cfg.seed == 3 and cfg.convert.draft_vocab_size == 4096


def test_adapt_measures_the_earlier_runs_acceptance_suite_where_its_file_still_is(tmp_path):
    """eval.acceptance_suite is written relative to the earlier YAML: the adaptation reads the file the earlier train
    stage resolved (its manifest's suite.file), and leaves the key out where that file is gone."""
    run = earlier(tmp_path)
    train = run.path / "train" / "manifest.json"
    suite = tmp_path / "unseen.jsonl"
    suite.write_text('{"prompt": "Hi", "category": "chat"}\n')
    m = json.loads(train.read_text())
    m["config"]["eval.acceptance_suite"] = "prompts/unseen.jsonl"
    m["metrics"] = {"suite": {"path": "prompts/unseen.jsonl", "file": str(suite)}}
    train.write_text(json.dumps(m))
    raw = adapt_config(run, "traffic.jsonl", 100, longest_prompt=150, o=AdaptOptions())
    assert raw["eval"]["acceptance_suite"] == str(suite)
    suite.unlink()
    assert "acceptance_suite" not in adapt_config(run, "traffic.jsonl", 100, longest_prompt=150, o=AdaptOptions())["eval"]


def test_adapt_grows_a_compressed_draft_vocabulary_by_default(tmp_path):
    """--grow-vocab unset: GROW_VOCAB tokens for an EAGLE-3 draft with a compressed vocabulary, none for a draft of the
    target's whole vocabulary; the defaults replay the earlier rows 10 to 1 at lr 3e-4."""
    from trtspec.adapt import GROW_VOCAB

    run = earlier(tmp_path)
    raw = adapt_config(run, "traffic.jsonl", 100, longest_prompt=150, o=AdaptOptions())
    assert raw["draft"]["grow_vocab"] == GROW_VOCAB == 1024 and raw["train"]["lr"] == 3e-4
    assert raw["data"]["sources"][1]["limit"] == 800  # 10 x the 80 traffic rows trained on
    conv = run.path / "convert" / "manifest.json"
    conv.write_text(json.dumps({**json.loads(conv.read_text()), "config": {"convert": {"num_layers": 1}}}))
    assert adapt_config(run, "traffic.jsonl", 100, longest_prompt=150, o=AdaptOptions())["draft"]["grow_vocab"] == 0


def gate_ctx(tmp_path, **draft):
    from types import SimpleNamespace

    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / "head.safetensors").write_text("weights")
    cfg = config_from_dict({"data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}, "draft": {"max_category_drop": 0.02, **draft}})
    return SimpleNamespace(cfg=cfg, run=SimpleNamespace(path=tmp_path), out=out, log=lambda m: None)


def acc(**als):
    """An acceptance measurement of one prompt a category (evaluate_acceptance's form)."""
    return {"per_category": {c: {"AL@3": v} for c, v in als.items()}, "categories": list(als),
            "per_prompt": [(round(v * 1000), 1000) for v in als.values()]}


def test_the_warm_start_gate_refuses_a_draft_that_fell_behind_and_keeps_its_outputs(tmp_path):
    """The train stage's gate (stages.train.category_gate, refuse_fallen_draft): a category past draft.max_category_drop
    fails the stage in one line naming it, the outputs kept in RUN/train-failed; within it, the comparison is the
    stage's metric."""
    import pytest

    from trtspec.errors import ValidationFailed
    from trtspec.stages.train import category_gate, refuse_fallen_draft

    ctx = gate_ctx(tmp_path)
    gate = category_gate(ctx, acc(chat=2.0, code=1.5), acc(chat=1.97, code=1.9))  # -1.5%: within
    assert gate["passed"] and gate["compared"] == ["chat", "code"]
    fell = category_gate(ctx, acc(chat=2.0, code=1.5), acc(chat=1.9, code=1.9))
    with pytest.raises(ValidationFailed, match=r"falls behind the one it started from: category 'chat': AL 1\.90 is "
                                               r"5\.0% below the earlier draft's 2\.00 \(tolerance 2%\)"):
        refuse_fallen_draft(ctx, fell)
    assert (tmp_path / "train-failed" / "head.safetensors").read_text() == "weights"
    kept = json.loads((tmp_path / "train-failed" / "gate.json").read_text())  # the refused draft's figures
    assert kept["al_before"] == {"chat": 2.0, "code": 1.5} and kept["al_after"] == {"chat": 1.9, "code": 1.9}
    assert not kept["passed"] and kept["dropped"] == {"chat": {"now": 1.9, "baseline": 2.0}}
    assert fell["change_ci95"]["chat"] == [0.95, 0.95]  # one prompt: no spread
    two = {**acc(chat=1.9, code=1.9), "per_category": {"chat": {"AL@3": 1.9, "prompts": 2}, "code": {"AL@3": 1.9, "prompts": 5}}}
    assert category_gate(ctx, acc(chat=2.0, code=1.5), two)["too_few_prompts"] == ["chat"]  # 2 prompts: not gated


def test_a_categorys_change_has_a_paired_interval_over_its_prompts():
    """runtime.decode.al_ratio_interval: the same prompts drawn for both drafts; a change every prompt shares has a
    narrow interval, one a single prompt makes a wide one that spans no change."""
    from trtspec.runtime.decode import al_ratio_interval

    before = [(200, 100)] * 12
    lo, hi = al_ratio_interval(before, [(190, 100)] * 12)
    assert lo == hi == 0.95
    lo, hi = al_ratio_interval(before, [(200, 100)] * 11 + [(110, 100)])  # one prompt of twelve falls
    assert lo < 0.98 and hi == 1.0


def test_a_fallen_draft_is_stepped_back_toward_the_earlier_one_until_the_gate_passes(tmp_path, monkeypatch):
    """draft.step_back: the draft a share of the way from its warm start to its fine-tune (weights interpolated, the
    integer d2t the fine-tune's), measured per share in turn; the first that passes is kept, none: the fine-tune."""
    from types import SimpleNamespace

    import torch

    import trtspec.stages.train as train
    from trtspec.artifacts import write_tensors

    module = torch.nn.Module()
    module.w = torch.nn.Parameter(torch.full((2,), 2.0))
    module.register_buffer("d2t", torch.tensor([3, 4]))
    start = write_tensors(tmp_path / "head_init.safetensors", {"w": torch.zeros(2), "d2t": torch.tensor([3, 4])})
    fam = SimpleNamespace(module=lambda model: model, drafts=None)
    # chat falls 10% at the whole fine-tune (w = 2), in proportion to the share kept
    monkeypatch.setattr(train, "evaluate_acceptance", lambda model, rows, k, drafts: acc(chat=2.0 - 0.1 * float(model.w.detach()[0]), code=1.9))
    before, tuned = acc(chat=2.0, code=1.5), acc(chat=1.8, code=1.9)

    gate, kept = train.warm_start_gate(gate_ctx(tmp_path, step_back=[0.75, 0.1]), fam, module, start, [], before, tuned)
    assert gate["passed"] and gate["share"] == 0.1 and not gate["fine_tune"]["passed"]
    assert torch.allclose(module.w, torch.full((2,), 0.2)) and module.d2t.tolist() == [3, 4]
    assert round(kept["per_category"]["chat"]["AL@3"], 4) == 1.98 and kept["per_category"]["code"]["AL@3"] == 1.9

    module.w.data.fill_(2.0)
    gate, kept = train.warm_start_gate(gate_ctx(tmp_path, step_back=[0.75, 0.5]), fam, module, start, [], before, tuned)
    assert not gate["passed"] and gate["stepped_back"] == [0.75, 0.5] and kept is tuned
    assert torch.equal(module.w.detach(), torch.full((2,), 2.0))  # none passed: the fine-tune, refused by the stage
    import pytest

    from trtspec.errors import ValidationFailed

    with pytest.raises(ValidationFailed, match=r"falls behind the one it started from \(stepped back to 0\.75, 0\.50 of "
                                               r"the fine-tune too\): category 'chat': AL 1\.80 is 10\.0% below"):
        train.refuse_fallen_draft(gate_ctx(tmp_path), gate)


def test_engines_the_earlier_yaml_left_to_auto_are_chosen_again_where_the_adaptation_runs(tmp_path):
    """A run whose `auto` resolved to vllm, adapted on a machine without vLLM, answers with HF there (and the other
    way round): the adaptation's YAML says auto where the earlier one did, and what the earlier run chose otherwise."""
    run = earlier(tmp_path)
    for stage, key, chose in (("data", "data.answer_with", "vllm"), ("train", "train.states_from", "vllm")):
        manifest = json.loads((run.path / stage / "manifest.json").read_text())
        section = key.partition(".")[0]
        manifest["config"][section][key.partition(".")[2]] = chose
        manifest["from_auto"] = [key]
        write_json(run.path / stage / "manifest.json", manifest)
    raw = earlier_config(run)
    assert raw["data"]["answer_with"] == "auto" and raw["train"]["states_from"] == "auto"
    write_json(run.path / "train" / "manifest.json", {**json.loads((run.path / "train" / "manifest.json").read_text()),
                                                      "from_auto": []})  # chosen in the YAML: kept
    assert earlier_config(run)["train"]["states_from"] == "vllm"


def test_an_adaptation_renders_with_the_earlier_runs_template_wherever_its_file_is(tmp_path):
    """check_same_target compares the template file's sha256 the earlier data stage recorded: a copy elsewhere is the
    same template, the same path edited since is another, and so are other chat_template_kwargs."""
    import pytest

    from trtspec.artifacts import sha256_file
    from trtspec.errors import ConfigError
    from trtspec.warm_start import check_same_target

    first = tmp_path / "first.jinja"
    first.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    run = earlier(tmp_path)
    model = {"source": "demo:smollm2-135m-instruct", "chat_template": str(first), "chat_template_kwargs": {"x": 1}}
    write_json(run.path / "data" / "manifest.json", {"stage": "data", "status": "done", "config": {"model": model},
                                                     "chat_template_sha256": sha256_file(first), "files": {}})
    copy = tmp_path / "copy.jinja"
    copy.write_text(first.read_text())

    def build(template, kwargs=None):
        raw = {"model": {"source": model["source"], "chat_template": str(template), "chat_template_kwargs": kwargs or {"x": 1}},
               "data": {"sources": [{"kind": "regenerate", "path": "prompts/x.jsonl"}]}}
        return config_from_dict(raw, base_dir=tmp_path)

    check_same_target(run, build(copy), "RUN")
    check_same_target(run, build(first), "RUN")
    with pytest.raises(ConfigError, match=r"other model.chat_template_kwargs \(\{'x': 1\}; this build: \{'x': 2\}\)"):
        check_same_target(run, build(first, {"x": 2}), "RUN")
    first.write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    with pytest.raises(ConfigError, match=r"another chat template \(model.chat_template .*first.jinja, edited since;"):
        check_same_target(run, build(first), "RUN")
