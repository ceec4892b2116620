"""What --check says a build will take: the rows a local source holds (lines, cut at its limit, less the held-out
share), unknown for a hub dataset without a limit, and the offline states' fp16 size of those rows."""

from __future__ import annotations

import json

from trtspec.config import config_from_dict
from trtspec.resources import FEW_ROWS, few_rows_warning, lines, training_rows

BASE = {"model": {"source": "demo:smollm2-135m-instruct"}}


def test_training_rows_from_local_files_and_limits(tmp_path):
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"text": f"q{i}"}) + "\n" for i in range(40)) + "\n")
    cfg = config_from_dict({**BASE, "data": {"sources": [{"kind": "regenerate", "path": "p.jsonl"},
                                                         {"kind": "regenerate", "path": "p.jsonl", "limit": 10}],
                                             "holdout_fraction": 0.25}}, base_dir=tmp_path)
    assert training_rows(cfg) == 37  # (40 + 10) x 0.75, the blank line not a row
    hub = config_from_dict({**BASE, "data": {"sources": [{"kind": "hf", "path": "org/chats"}]}}, base_dir=tmp_path)
    assert training_rows(hub) is None
    limited = config_from_dict({**BASE, "data": {"sources": [{"kind": "hf", "path": "org/chats", "limit": 100}],
                                                 "holdout_fraction": 0.1}}, base_dir=tmp_path)
    assert training_rows(limited) == 90


def test_the_lines_flag_what_exceeds_the_machine():
    est = {"target_weights_gib": 30.0, "trainer_loads": "the whole target", "free_memory_gib": 20.0,
           "training_rows": 1000, "states_gib": 80.0, "free_disk_gib": 50.0}
    memory, disk = lines(est)
    assert "weights 30.0 GiB (MORE than is free)" in memory and "20.0 GiB free now" in memory
    assert "at most 1000" in disk and "offline states at most 80.0 GiB (MORE than is free)" in disk
    assert "MORE" not in lines({**est, "target_weights_gib": 1.0})[0]


def test_few_training_rows_are_said_before_the_build_and_in_check(tmp_path):
    """A build whose sources hold fewer than FEW_ROWS training rows says so in one line before its data stage (and
    --check says it on its data line); one with enough says nothing."""
    def cfg(n):
        (tmp_path / f"p{n}.jsonl").write_text("".join(json.dumps({"text": f"q{i}"}) + "\n" for i in range(n)))
        return config_from_dict({**BASE, "data": {"sources": [{"kind": "regenerate", "path": f"p{n}.jsonl"}],
                                                  "holdout_fraction": 0.25}}, base_dir=tmp_path)

    assert few_rows_warning(cfg(12)).startswith("warning: the data sources give at most 9 training rows (FEW")
    assert few_rows_warning(cfg(2 * FEW_ROWS)) is None
    est = {"target_weights_gib": 1.0, "trainer_loads": "the whole target", "free_memory_gib": 20.0,
           "training_rows": 9, "states_gib": None, "free_disk_gib": 50.0}
    assert "at most 9 (FEW" in lines(est)[1] and "FEW" not in lines({**est, "training_rows": FEW_ROWS})[1]


def llama_8b_shape(folder):
    """Llama-3.1-8B's config and its four shards' sizes as sparse files: --check reads sizes, not weights."""
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, dtype="bfloat16").save_pretrained(folder)
    for i, size in enumerate([4976698672, 4999802720, 4915916176, 1168138808], 1):
        with open(folder / f"model-0000{i}-of-00004.safetensors", "wb") as f:
            f.truncate(size)
    return folder


def test_each_stage_is_sized_from_the_targets_checkpoint(tmp_path):
    """Per stage, the memory its models take and the disk it leaves: an 8B target's weights (15 GiB of bf16) in
    every stage that loads it, twice where quantize reloads it, the states on disk only when offline, halved in fp8,
    vLLM's engines where vLLM answers; what is over the machine flagged."""
    from trtspec.resources import LIBRARIES_GIB, estimate

    target = llama_8b_shape(tmp_path / "llama8b")
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"text": f"q{i}"}) + "\n" for i in range(1000)))

    def stages(**sections):
        raw = {"model": {"source": str(target), "dtype": "bfloat16", "build_dtype": "bfloat16"},
               "data": {"sources": [{"kind": "regenerate", "path": "p.jsonl"}], "seq_len": 512, "holdout_fraction": 0.0}}
        for k, v in sections.items():
            raw[k] = {**raw.get(k, {}), **v}
        est = estimate(config_from_dict(raw, base_dir=tmp_path), tmp_path / "run")
        return est, {s["stage"]: s for s in est["stages"]}

    est, s = stages(train={"mode": "offline"}, quantize={"format": "fp8"})
    weights = est["target_weights_gib"]
    assert 14.9 < weights < 15.0
    assert s["convert"]["memory_gib"] == round(weights + LIBRARIES_GIB, 1)
    assert s["quantize"]["memory_gib"] == round(2 * weights + LIBRARIES_GIB, 1)
    states = 2 * 1000 * 512 * 4096 * 4 / 2**30  # fp16, three aux layers and the last
    assert abs(s["train"]["disk_gib"] - s["convert"]["disk_gib"] - states) < 0.02
    assert abs(s["export"]["disk_gib"] - s["convert"]["disk_gib"] / 2 - weights / 2) < 0.05  # fp8 target, bf16 draft
    _, fp8 = stages(train={"mode": "offline", "states_storage": "fp8"})
    assert abs(fp8["train"]["disk_gib"] - fp8["convert"]["disk_gib"] - states / 2) < 0.02
    _, online = stages(train={"mode": "online"}, quantize={"format": "none"})
    assert online["train"]["disk_gib"] == online["convert"]["disk_gib"] and online["quantize"]["memory_gib"] == LIBRARIES_GIB
    _, served = stages(data={"answer_with": "endpoint"}, engine={"backend": "vllm", "batch_sizes": [1]})
    assert served["data"]["memory_gib"] == LIBRARIES_GIB
    assert served["engine"]["memory_gib"] > 2 * weights  # two vLLM engines of the target
    # vLLM answering holds its weights and the KV cache of answer_vllm's window (at most KV_CACHE_GIB_AT_MOST), not
    # of data.batch_size: at batch 8 it is sized as at 128
    from trtspec.engines.vllm import ENGINE_OWN_GIB, KV_CACHE_GIB_AT_MOST

    _, vllm8 = stages(data={"answer_with": "vllm", "batch_size": 8})
    assert vllm8["data"]["memory_gib"] == round(weights + KV_CACHE_GIB_AT_MOST + ENGINE_OWN_GIB + LIBRARIES_GIB, 1)
    # a DFlash2 draft's layers are its dflash backbone's: 4 of them weigh more than 2 in the train stage
    _, two = stages(draft={"method": "dflash2"}, dflash={"num_layers": 2})
    _, four = stages(draft={"method": "dflash2"}, dflash={"num_layers": 4})
    assert four["train"]["memory_gib"] > two["train"]["memory_gib"]
    said = {line.split()[0]: line for line in lines({**est, "free_memory_gib": 20.0, "free_disk_gib": 40.0})}
    assert said["quantize"].startswith("  quantize  memory 31.4 GiB (the target twice") and "(MORE than is free)" in said["quantize"]
    assert said["convert"].startswith("  convert   memory 16.5 GiB (the target); disk") and "MORE" not in said["convert"]
