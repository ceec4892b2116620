"""`trtspec adapt` on the interop tier's CI run (the finished run it shares): the draft continues from the run's,
every category is measured before and after on the same held-out rows, the bundle says where it comes from, and a
draft that falls behind is refused with nothing exported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from trtspec.cli import main

PROMPTS = ["Name two animals that can fly.", "What is 15 plus 27?", "Write one sentence about the sea.",
           "List three things found in a kitchen.", "What color is the sky on a clear day?",
           "Say good morning to a neighbor.", "Name a planet with rings.", "What is 9 times 6?"]


def traffic_file(tmp: Path) -> Path:
    """The prompts as an OpenAI batch file, as a service's request log would be exported."""
    f = tmp / "batch.jsonl"
    f.write_text("".join(json.dumps({"custom_id": str(i), "method": "POST", "url": "/v1/chat/completions",
                                     "body": {"model": "demo", "messages": [{"role": "user", "content": p}]}}) + "\n"
                         for i, p in enumerate(PROMPTS)))
    return f


def adapt(ci_run: Path, tmp: Path, *extra: str):
    args = ["adapt", str(ci_run), "--prompts", str(traffic_file(tmp)), "--out", str(tmp / "new"),
            "--category", "traffic", "--set", "export.onnx=false", *extra]
    return CliRunner().invoke(main, args)


def manifest(run: Path, stage: str) -> dict:
    return json.loads((run / stage / "manifest.json").read_text())


def test_adapt_continues_the_draft_measures_every_category_and_records_lineage(ci_run, tmp_path):
    r = adapt(ci_run, tmp_path, "--epochs", "1", "--tolerance", "1.0")
    assert r.exit_code == 0, r.output
    new = tmp_path / "new"
    # the command's --set is in the YAML it wrote: `trtspec build adapt.yaml` goes on with the same adaptation
    assert yaml.safe_load((new / "adapt" / "adapt.yaml").read_text())["export"]["onnx"] is False
    # the draft started from the earlier run's trained draft, its compressed vocabulary grown by default with the
    # traffic's tokens: every earlier token keeps its output row, every other weight is the earlier draft's
    from safetensors.torch import load_file

    grown = manifest(new, "convert")["metrics"]["draft_vocab_grown"]
    assert grown["from"] == 2048 < grown["to"] <= 2048 + 1024
    start, earlier = load_file(new / "convert" / "head_init.safetensors"), load_file(ci_run / "train" / "head.safetensors")
    ids = lambda w: (torch.arange(len(w["d2t"])) + w["d2t"]).tolist()  # noqa: E731 - the draft's target token ids
    row = {t: i for i, t in enumerate(ids(start))}
    kept = [row[t] for t in ids(earlier)]
    assert torch.equal(start["lm_head.weight"][kept], earlier["lm_head.weight"])
    assert all(torch.equal(start[k], v) for k, v in earlier.items() if k not in ("lm_head.weight", "d2t"))
    # the earlier held-out rows stay held out, beside the traffic's own held-out share
    old_heldout = [json.loads(x) for x in (ci_run / "data" / "heldout.jsonl").read_text().splitlines()]
    new_heldout = [json.loads(x) for x in (new / "data" / "heldout.jsonl").read_text().splitlines()]
    assert {x["id"] for x in old_heldout} <= {x["id"] for x in new_heldout}
    # before and after on the same rows, every category, the earlier run's and the traffic's
    m = manifest(new, "train")["metrics"]
    assert m["eval_prompts"] == len(new_heldout) == len(old_heldout) + 2
    assert set(m["before"]["per_category"]) == set(m["per_category"]) == {x["category"] for x in old_heldout} | {"traffic"}
    assert m["before"]["per_category"]["traffic"]["prompts"] == m["per_category"]["traffic"]["prompts"] == 2
    # the CI run's categories hold 1-2 held-out prompts: reported, not gated (validate.baseline_min_prompts, 3)
    assert m["gate"]["gate"] == "baseline" and sorted(m["gate"]["compared"] + m["gate"]["too_few_prompts"]) == sorted(m["per_category"])
    lineage = manifest(new, "bundle")["metrics"]["lineage"]
    assert lineage["run"] == str(ci_run.resolve())
    assert lineage["head_sha256"] == manifest(ci_run, "train")["files"]["head.safetensors"]["sha256"]


@pytest.mark.full  # the gate's refusal itself: tests/unit/test_adapt_config.py (no training)
def test_adapt_refuses_a_draft_that_falls_behind(ci_run, tmp_path):
    r = adapt(ci_run, tmp_path, "--epochs", "4", "--lr", "0.5", "--tolerance", "0.02", "--step-back", "none",
              "--set", "validate.baseline_min_prompts=1")
    errors = [x for x in r.output.splitlines() if x.startswith("Error:")]
    assert r.exit_code == 1, r.output
    assert len(errors) == 1 and "the adapted draft falls behind the one it started from: category '" in errors[0], r.output
    new = tmp_path / "new"
    assert not (new / "train" / "manifest.json").exists() and not (new / "bundle").exists()
    assert (new / "train-failed" / "head.safetensors").is_file()
