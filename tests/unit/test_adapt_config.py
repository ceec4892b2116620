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
    assert cfg.draft.grow_vocab == 256
    assert (cfg.train.epochs, cfg.train.lr, cfg.train.max_steps) == (1.5, 2e-4, None)
    assert cfg.eval.acceptance_prompts == 5 + 20 and cfg.eval.prompts is None  # every held-out row, old and new
    assert cfg.validate_.baseline == str((run.path / "validate" / "report.json").resolve())
    assert cfg.seed == 3 and cfg.convert.draft_vocab_size == 4096


def test_the_warm_start_gate_refuses_a_draft_that_fell_behind_and_keeps_its_outputs(tmp_path):
    """The train stage's gate (stages.train.warm_start_gate): a category past draft.max_category_drop fails the stage
    in one line naming it, the outputs kept in RUN/train-failed; within it, the comparison is the stage's metric."""
    from types import SimpleNamespace

    import pytest

    from trtspec.errors import ValidationFailed
    from trtspec.stages.train import warm_start_gate

    def acc(**als):
        return {"per_category": {c: {"AL@3": v} for c, v in als.items()}}

    out = tmp_path / "out"
    out.mkdir()
    (out / "head.safetensors").write_text("weights")
    ctx = SimpleNamespace(cfg=config_from_dict({"data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]},
                                                "draft": {"max_category_drop": 0.02}}),
                          run=SimpleNamespace(path=tmp_path), out=out, log=lambda m: None)
    gate = warm_start_gate(ctx, acc(chat=2.0, code=1.5), acc(chat=1.97, code=1.9))  # -1.5%: within
    assert gate["passed"] and gate["compared"] == ["chat", "code"]
    with pytest.raises(ValidationFailed, match=r"falls behind the one it started from: category 'chat': AL 1\.90 is "
                                               r"5\.0% below the earlier draft's 2\.00 \(tolerance 2%\)"):
        warm_start_gate(ctx, acc(chat=2.0, code=1.5), acc(chat=1.9, code=1.9))
    assert (tmp_path / "train-failed" / "head.safetensors").read_text() == "weights"
    two = {"per_category": {"chat": {"AL@3": 1.9, "prompts": 2}, "code": {"AL@3": 1.9, "prompts": 5}}}
    assert warm_start_gate(ctx, acc(chat=2.0, code=1.5), two)["too_few_prompts"] == ["chat"]  # 2 prompts: not gated
