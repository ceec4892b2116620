"""An agent's conversations: the tools a request offers, an assistant turn's tool calls and the tool turns answering
them, read from data and traffic, rendered with the target's chat template as vLLM renders the request, and trained
on where the model wrote them (its calls), not where a tool did (its outputs)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import pytest
from stagekit import TOOL_TEMPLATE

from trtspec import chat

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Today's weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
AGENT = [{"role": "user", "content": "Should I take an umbrella in Paris?"},
         {"role": "assistant", "content": None, "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call_1", "content": "light rain, 14 degrees"},
         {"role": "assistant", "content": "Yes, take one: light rain today."}]


@pytest.fixture(scope="module")
def tool_tok(demo_model_dir):
    from trtspec.models import load_tokenizer

    tok = load_tokenizer(demo_model_dir)
    tok.chat_template = TOOL_TEMPLATE
    return tok


def test_an_agents_conversation_is_kept_with_its_tools_and_calls_as_templates_read_them():
    """OpenAI's form (arguments as a JSON text, a call's content null) becomes what vLLM hands a chat template: the
    arguments an object, the content empty; a tool turn keeps the call it answers."""
    skips: Counter = Counter()
    rows = chat.conversations_from_rows([{"messages": AGENT, "tools": [WEATHER]},
                                         {"messages": AGENT, "tools": "get_weather"}], "t", skips)
    assert len(rows) == 1 and rows[0]["tools"] == [WEATHER]
    call, output = rows[0]["messages"][1:3]
    assert call == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    assert output == {"role": "tool", "content": "light rain, 14 degrees", "tool_call_id": "call_1"}
    assert skips == {"tools that are no list of objects": 1}


def test_a_conversation_ending_on_a_tool_call_is_an_answer_and_bad_calls_are_counted():
    skips: Counter = Counter()
    bad_args = {**CALL, "function": {"name": "get_weather", "arguments": "{city: Paris"}}
    rows = chat.conversations_from_rows([{"messages": AGENT[:2]}, {"messages": [AGENT[0], {"role": "assistant", "tool_calls": [bad_args]}]},
                                         {"messages": [AGENT[0], AGENT[2], AGENT[3]]}], "t", skips)
    assert [r["messages"][-1]["tool_calls"][0]["function"]["name"] for r in rows] == ["get_weather"]
    assert skips == {"a tool call without a function name, or with arguments that are no JSON object": 1,
                     "a tool turn that answers no tool call": 1}


def test_the_model_is_trained_on_its_calls_and_answers_not_on_the_tools_output(tool_tok):
    row = chat.conversations_from_rows([{"messages": AGENT, "tools": [WEATHER]}], "t", Counter())[0]
    ids, mask, _ = chat.tokenize_row(row, tool_tok, 512)
    assert ids == chat.template_ids(tool_tok, row["messages"], False, row["tools"])
    whole = tool_tok.decode(ids)
    labelled = tool_tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert "Today's weather in a city" in whole  # the tools were rendered
    assert '"name": "get_weather", "arguments": {"city": "Paris"}' in labelled
    assert "Yes, take one: light rain today." in labelled
    assert "14 degrees" not in labelled and "umbrella" not in labelled and "Today's weather" not in labelled


QWEN3_LIKE = TOOL_TEMPLATE.replace("{% elif m.role == 'assistant' %}<|im_start|>assistant\n",  # an empty reasoning
                                   "{% elif m.role == 'assistant' %}<|im_start|>assistant\n"   # block on a last turn
                                   "{% if loop.last %}<think>\n\n</think>\n\n{% endif %}")
GEMMA4_LIKE = TOOL_TEMPLATE.replace("{%- if add_generation_prompt %}<|im_start|>assistant\n",  # one opened by the
                                    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think></think>")  # prompt


@pytest.mark.parametrize("template", [QWEN3_LIKE, GEMMA4_LIKE], ids=["empty-reasoning-when-last", "prompt-opens-reasoning"])
def test_a_call_is_labelled_where_the_template_renders_it_otherwise_once_turns_follow(demo_model_dir, template):
    """A turn rendered otherwise in the whole conversation than as its last turn (labels then found by text): the call
    is found by its own rendering."""
    from trtspec.models import load_tokenizer

    tok = load_tokenizer(demo_model_dir)
    tok.chat_template = template
    row = chat.conversations_from_rows([{"messages": AGENT, "tools": [WEATHER]}], "t", Counter())[0]
    ids, mask, _ = chat.tokenize_row(row, tok, 512)
    runs = "|".join(tok.decode([t for t, m in zip(ids, mask, strict=True) if m]).split("<|im_end|>"))
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in runs
    assert "Yes, take one: light rain today." in runs and "14 degrees" not in runs and "umbrella" not in runs


def test_a_template_that_does_not_show_tool_calls_skips_such_rows(demo_model_dir, tool_tok):
    """SmolLM2's own template renders an assistant turn's content alone: a call would train on an empty answer."""
    from trtspec.models import load_tokenizer

    rows = chat.conversations_from_rows([{"messages": AGENT, "tools": [WEATHER]}, {"messages": AGENT[:1] + AGENT[3:]}], "t", Counter())
    skips: Counter = Counter()
    kept = chat.rendered_rows(rows, load_tokenizer(demo_model_dir), skips, prompts=False)
    assert len(kept) == 1 and "tools" not in kept[0]
    assert list(skips) == [chat.REFUSED + "tool calls it does not show (a template for chat alone: serve a tool-calling one)"]
    assert len(chat.rendered_rows(rows, tool_tok, Counter(), prompts=False)) == 2


def test_an_agents_prompt_keeps_its_tools_into_the_held_out_prompt_and_its_encoding(tool_tok):
    row = chat.conversations_from_rows([{"messages": AGENT, "tools": [WEATHER]}], "t", Counter())[0]
    prompt = chat.prompt_rows([row])[0]
    assert prompt["tools"] == [WEATHER] and prompt["messages"][-1]["role"] == "tool"
    text = tool_tok.decode(chat.encode_prompt(tool_tok, prompt["messages"], prompt["tools"]))
    assert "<tools>" in text and text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_agent_requests_are_read_with_their_tools_and_a_prompt_without_tools_keeps_its_id(tmp_path, tool_tok):
    from trtspec.traffic import read_traffic

    plain = [{"role": "user", "content": "Hi"}]
    lines = [{"messages": AGENT[:3], "tools": [WEATHER]},
             {"messages": AGENT[:3], "tools": [WEATHER]},  # the same request again
             {"messages": AGENT[:1], "tools": [WEATHER]},  # the agent's first step: the same words, tools offered
             {"messages": AGENT[:1]},
             {"messages": plain},
             {"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}]
    f = tmp_path / "agent.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows, skips, _ = read_traffic(f, tok=tool_tok)
    assert [(len(r["messages"]), "tools" in r) for r in rows] == [(3, True), (1, True), (1, False), (1, False)]
    assert rows[0]["messages"][1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert rows[3]["id"] == "traffic-" + hashlib.sha1(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:12]
    assert skips == {"repeated prompt": 1, "Responses request without a usable chat turn (reasoning, images, custom or namespaced tools)": 1}


# tools as clients write them: the SDK's order, a description missing, keys in another order, strict set, extras
TOOL_FORMS = [WEATHER, {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
              {"function": {"parameters": {"type": "object"}, "description": "d", "name": "f"}, "type": "function"},
              {"type": "function", "function": {"name": "f", "description": "d", "parameters": {}, "strict": True}},
              {"type": "function", "function": {"name": "f", "description": "d", "x_note": 1}}]


def test_a_requests_tools_are_rendered_as_vllm_hands_them_to_the_template(tool_tok):
    """A tool JSON-printing templates show: its fields in vLLM's order, a missing one null, extras dropped; a bare
    function spec (HF's apply_chat_template reads those; vLLM refuses them) is kept as the row gave it."""
    rows = [chat.row_tools({"tools": [t]})[0]["tools"][0] for t in TOOL_FORMS]
    assert [list(r["function"]) for r in rows] == [["name", "description", "parameters"]] * 3 + [
        ["name", "description", "parameters", "strict"], ["name", "description", "parameters"]]
    assert rows[1]["function"]["description"] is None and list(rows[2]) == ["type", "function"]
    assert chat.row_tools({"tools": [WEATHER["function"]]})[0] == {"tools": [WEATHER["function"]]}


def test_a_requests_tools_are_vllms_model_dump_of_them():
    """The contract with vLLM's server: chat.engine_tool is its ChatCompletionToolsParam's model_dump(), key order
    included (scripts/check_engine_prompts.py compares whole prompts through its /tokenize)."""
    pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh --engines vllm)")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam

    for t in TOOL_FORMS:
        theirs = ChatCompletionToolsParam(**t).model_dump()
        assert json.dumps(chat.engine_tool(t)) == json.dumps(theirs), t


# an agent's step as a Responses API request: its message, its call and the call's output as items, its tools flat
RESPONSES_AGENT = {
    "model": "m", "instructions": "Be brief.",
    "input": [{"role": "user", "content": [{"type": "input_text", "text": "Should I take an umbrella in Paris?"}]},
              {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
              {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
              {"type": "function_call_output", "call_id": "call_1", "output": "light rain, 14 degrees"}],
    "tools": [{"type": "function", "name": "get_weather", "description": "Today's weather in a city",
               "parameters": WEATHER["function"]["parameters"]}, {"type": "web_search"}]}


def test_an_agents_responses_request_is_read_as_the_chat_request_vllm_makes_of_it(tmp_path, tool_tok):
    """A Responses API request's call joins the assistant turn before it, the call's output is a tool turn, its
    function tools take the chat form (another kind of tool is shown to no template); reasoning and custom tools are
    skipped, counted."""
    from trtspec.traffic import read_traffic

    reasoning = {"model": "m", "input": [{"type": "reasoning", "id": "r", "summary": []}, *RESPONSES_AGENT["input"]]}
    custom = {**RESPONSES_AGENT, "tools": [{"type": "custom", "name": "shell"}]}
    f = tmp_path / "responses.jsonl"
    no_tools = {"model": "m", "input": "Hi", "tools": None}
    f.write_text("".join(json.dumps(x) + "\n" for x in (RESPONSES_AGENT, reasoning, custom, no_tools)))
    rows, skips, _ = read_traffic(f, tok=tool_tok)
    assert len(rows) == 2 and "tools" not in rows[1] and rows[0]["messages"] == [
        {"role": "system", "content": "Be brief."}, AGENT[0],
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "light rain, 14 degrees", "tool_call_id": "call_1"}]
    assert rows[0]["tools"] == [{"type": "function", "function": {**WEATHER["function"]}}]
    assert skips == {"Responses request without a usable chat turn (reasoning, images, custom or namespaced tools)": 1,
                     "Responses request offering custom or namespaced tools": 1}


def test_a_responses_request_is_read_into_the_turns_and_tools_vllm_renders(tmp_path, tool_tok):
    """The contract with vLLM: its ResponsesRequest, construct_input_messages and construct_tool_dicts make of the
    same request the turns and tools trtspec reads (the calls' arguments an object, as vLLM's chat parsing hands
    them to the template)."""
    pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh --engines vllm)")
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.openai.responses.utils import construct_input_messages, construct_tool_dicts

    from trtspec.traffic import read_traffic

    request = ResponsesRequest(**RESPONSES_AGENT)
    turns = construct_input_messages(request_instructions=request.instructions, request_input=request.input)
    theirs, _ = chat.chat_turns(chat.content_text([dict(t) for t in turns], ("input_text", "output_text")))
    f = tmp_path / "responses.jsonl"
    f.write_text(json.dumps(RESPONSES_AGENT) + "\n")
    rows, _, _ = read_traffic(f, tok=tool_tok)
    assert rows[0]["messages"] == theirs
    assert rows[0]["tools"] == construct_tool_dicts(request.tools, request.tool_choice)


def test_the_data_stage_has_the_target_answer_an_agents_prompts_with_their_tools(tmp_path, tiny_model_dir, tool_tok):
    """Agent conversations as training rows (their calls labelled) and as prompts the target answers again: the
    target is asked the prompt its engine would render, tools and all, and every row written keeps its tools."""
    import shutil

    from stagekit import BareCtx

    from trtspec.config import config_from_dict
    from trtspec.stages import data

    model = tmp_path / "agent-model"
    shutil.copytree(tiny_model_dir, model)
    untied_head(model)
    (model / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    conf = json.loads((model / "tokenizer_config.json").read_text())
    conf.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(conf))
    cities = ["Paris", "Oslo", "Rome", "Lima", "Kyiv", "Cairo", "Quito", "Seoul"]
    rows = [{"messages": [{**AGENT[0], "content": f"Umbrella in {c}?"}, {**AGENT[1], "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": json.dumps({"city": c})}}]}, *AGENT[2:]],
             "tools": [WEATHER]} for c in cities]
    for name in ("agent.jsonl", "asked.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = config_from_dict({"model": {"source": str(model)}, "data": {
        "sources": [{"kind": "jsonl", "path": "agent.jsonl"}, {"kind": "jsonl", "path": "asked.jsonl", "regenerate": True}],
        "seq_len": 256, "max_new_tokens": 4, "batch_size": 4, "holdout_fraction": 0.25}}, base_dir=tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "work").mkdir()
    ctx = BareCtx(cfg=cfg, out=tmp_path / "out", work=tmp_path / "work", inputs={}, manifests={}, stage="data")
    m = data.run(ctx)
    written = [json.loads(ln) for f in ("train.jsonl", "heldout.jsonl") for ln in (tmp_path / "out" / f).read_text().splitlines()]
    assert m["train_rows"] + m["heldout_rows"] == 16 and all(r["tools"] == [WEATHER] for r in written)
    answered = [r for r in written if "input_ids" in r]
    assert len(answered) == 8
    for r in answered:  # asked with the tools: the prompt the target saw holds their specs
        prompt = chat.encode_prompt(tool_tok, r["messages"][:-1], r["tools"])
        assert r["input_ids"][: r["label_start"]] == prompt and "<tools>" in tool_tok.decode(prompt)


def untied_head(model_dir):
    """The tiny random model with an output head of its own: with its tied one it repeats the generation prompt's
    newline, and every answer is whitespace (such a regenerated row is dropped)."""
    import torch

    from trtspec.models import load_model

    lm = load_model(model_dir)
    lm.config.tie_word_embeddings = False
    lm.lm_head.weight = torch.nn.Parameter(torch.randn(lm.lm_head.weight.shape, generator=torch.Generator().manual_seed(0)))
    lm.save_pretrained(model_dir)


def test_model_chat_template_serves_the_target_with_a_tool_calling_template(tmp_path, tiny_model_dir):
    """model.chat_template (vLLM's --chat-template): the tiny model's own template shows no tool calls and its rows are
    refused; with the file, they are rendered with it, the target's tokenizer saved with it (the bundle's), and the
    stages reading the model are keyed on its text."""
    from trtspec.config import config_from_dict
    from trtspec.models import load_tokenizer, target_tokenizer
    from trtspec.pipeline.runner import work_key

    (tmp_path / "tools.jinja").write_text(TOOL_TEMPLATE)
    rows = chat.conversations_from_rows([{"messages": AGENT, "tools": [WEATHER]}], "t", Counter())
    data = {"sources": [{"kind": "jsonl", "path": "agent.jsonl"}]}
    own = config_from_dict({"model": {"source": str(tiny_model_dir)}, "data": data}, base_dir=tmp_path)
    cfg = config_from_dict({"model": {"source": str(tiny_model_dir), "chat_template": "tools.jinja"}, "data": data},
                           base_dir=tmp_path)
    assert cfg.model.chat_template == str(tmp_path / "tools.jinja")  # absolute, as a run's manifests name it
    skips: Counter = Counter()
    assert chat.rendered_rows(rows, target_tokenizer(own, tiny_model_dir), skips, prompts=False) == [] and skips
    tok = target_tokenizer(cfg, tiny_model_dir)
    assert chat.rendered_rows(rows, tok, Counter(), prompts=False) == rows
    tok.save_pretrained(tmp_path / "bundle-target")
    assert load_tokenizer(tmp_path / "bundle-target").chat_template == TOOL_TEMPLATE
    before, states = work_key(cfg, "data", {}), target_states(cfg, tmp_path)
    (tmp_path / "tools.jinja").write_text(TOOL_TEMPLATE.replace("You may call", "You can call"))
    assert work_key(cfg, "data", {}) != before and work_key(own, "data", {}) != before
    # the target's answers and states (the train stage's scratch) too: its held-out answers are to the prompts it renders
    assert target_states(cfg, tmp_path) != states and target_states(own, tmp_path) != states


def test_a_template_file_is_read_as_hf_compiles_it(tmp_path):
    """model.chat_template: a template with HF's `{% generation %}` blocks (assistant masks) is Jinja as
    apply_chat_template reads it; a broken one is refused in one line naming the file and the line."""
    from trtspec.errors import ConfigError
    from trtspec.models import read_chat_template

    masks = tmp_path / "masks.jinja"
    masks.write_text("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
                     "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}")
    assert read_chat_template(masks) == masks.read_text()
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}\n{{ m.content }")
    with pytest.raises(ConfigError, match=r"'.*broken.jinja' is no Jinja template: line 2"):
        read_chat_template(broken)


def target_states(cfg, run):
    """The train stage's scratch for what the frozen target computes, for the same data files."""
    from stagekit import stage_ctx

    from trtspec.stages.train import target_states_dir

    ctx = stage_ctx(cfg, run / "run", "train", {})
    ctx.manifests["data"] = {"files": {f: {"sha256": "0" * 64} for f in ("train_tokens.pt", "heldout.jsonl")}}
    return target_states_dir(ctx, [1, 2, 3]).name


def test_an_eval_suite_of_agent_prompts_keeps_their_tools(tmp_path):
    from trtspec.config import config_from_dict
    from trtspec.errors import DataError
    from trtspec.suites import suite_rows

    lines = [{"messages": AGENT[:3], "tools": [WEATHER], "category": "agent"}, {"prompt": "Hi", "category": "chat"}]
    (tmp_path / "suite.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    cfg = config_from_dict({"data": {"sources": [{"kind": "jsonl", "path": "d.jsonl"}]},
                            "eval": {"suites": [{"kind": "jsonl", "path": "suite.jsonl"}]}}, base_dir=tmp_path)
    rows = suite_rows(cfg, 0)
    assert [r.get("tools") for r in rows] == [[WEATHER], None]
    assert rows[0]["messages"][1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    (tmp_path / "suite.jsonl").write_text(json.dumps({**lines[0], "tools": {"get_weather": {}}}) + "\n")
    with pytest.raises(DataError, match=r"suite.jsonl': line 1's 'tools' is not a list of tool objects"):
        suite_rows(cfg, 0)


def test_cached_acceptance_answers_are_answered_again_once_their_prompts_render_otherwise(tool_tok, tmp_path):
    """The train stage's cache of the target's answers to its held-out and suite prompts is keyed on the target, the
    data and the template; a row that renders otherwise since (here its tool's description) is answered again."""
    import torch

    from trtspec.training.acceptance import build_eval_set

    answered = []

    class Engine:  # answers each prompt with one token; states as the answers (none needed here)
        def greedy_answers(self, tok, rows, max_new_tokens, batch_size):
            answered.append(len(rows))
            return [{"input_ids": torch.tensor(chat.encode_row(tok, r) + [7]), "start": len(chat.encode_row(tok, r)),
                     "category": r["category"]} for r in rows]

        def with_states(self, seqs):
            return seqs

    row = {"messages": AGENT[:1], "tools": [WEATHER], "category": "agent"}
    cache = tmp_path / "eval_seqs.pt"
    for _ in range(2):
        build_eval_set(None, tool_tok, [row], [], 4, cache, print, engine=Engine())
    assert answered == [1]  # answered once, then read from the cache
    renamed = {**row, "tools": [{"type": "function", "function": {**WEATHER["function"], "description": "Weather"}}]}
    got = build_eval_set(None, tool_tok, [renamed], [], 4, cache, print, engine=Engine())
    assert answered == [1, 1] and got[0]["input_ids"][:-1].tolist() == chat.encode_row(tool_tok, renamed)
    build_eval_set(None, tool_tok, [{**renamed, "category": "chat"}], [], 4, cache, print, engine=Engine())
    assert answered == [1, 1, 1]
