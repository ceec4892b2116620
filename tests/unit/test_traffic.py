"""Reading the prompts a service received (trtspec.traffic): each format, what is skipped and why, and the one-line
refusals."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from trtspec.errors import DataError
from trtspec.traffic import read_traffic


def write(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_chat_jsonl_keeps_categories_drops_answers_and_repeats(tmp_path):
    f = write(tmp_path / "t.jsonl", [
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "category": "greet"},
        {"messages": [{"role": "user", "content": "Hi"}], "category": "greet"},  # the same prompt, answer dropped
        {"prompt": "What is 2+2?"},
    ])
    rows, skips, fmt = read_traffic(f, category="maths")
    assert fmt == "chat"
    assert [(r["category"], r["messages"]) for r in rows] == [
        ("greet", [{"role": "user", "content": "Hi"}]), ("maths", [{"role": "user", "content": "What is 2+2?"}])]
    assert skips == {"repeated prompt": 1}
    assert all(r["id"].startswith("traffic-") for r in rows)


def test_requests_the_targets_chat_template_refuses_are_skipped_and_counted(tmp_path, demo_model_dir):
    from trtspec.models import load_tokenizer

    tok = load_tokenizer(demo_model_dir)
    tok.chat_template = ("{%- for m in messages %}{%- if m.role == 'system' %}{{ raise_exception('System role not "
                         "supported') }}{%- endif %}{{- m.role + ': ' + m.content + '\\n' }}{%- endfor %}")
    system = {"role": "system", "content": "Be brief."}
    f = write(tmp_path / "t.jsonl", [{"messages": [system, {"role": "user", "content": "Hi"}]}, {"prompt": "What is 2+2?"}])
    rows, skips, _ = read_traffic(f, tok=tok)
    assert [r["messages"] for r in rows] == [[{"role": "user", "content": "What is 2+2?"}]]
    assert skips == {"refused by the chat template: System role not supported": 1}
    write(f, [{"messages": [system, {"role": "user", "content": "Hi"}]}])
    with pytest.raises(DataError, match=r"holds no usable prompt \(chat: 1 refused by the chat template: System role"):
        read_traffic(f, tok=tok)


def test_openai_batch_reads_chat_requests_and_their_text_parts(tmp_path):
    body = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": [{"type": "text", "text": "Name a "},
                                                                    {"type": "text", "text": "color."}]}],
            "metadata": {"category": "colors"}}
    f = write(tmp_path / "b.jsonl", [
        {"custom_id": "1", "method": "POST", "url": "/v1/chat/completions", "body": body},
        {"custom_id": "2", "method": "POST", "url": "/v1/completions", "body": {"prompt": "raw text"}},
    ])
    rows, skips, fmt = read_traffic(f)
    assert fmt == "openai-batch"
    assert rows[0]["category"] == "colors"
    assert rows[0]["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]
    assert skips == {"completion request (raw text, no chat turns)": 1}


def test_a_json_array_of_requests_and_the_turns_of_a_datasets_rows(tmp_path):
    """Requests exported as one JSON array (`json.dump(rows, f, indent=2)`), chat or batch; a row's turns in any form
    the data stage reads (LMSYS-Chat's `conversation`, ShareGPT's {from, value})."""
    f = tmp_path / "requests.json"
    f.write_text(json.dumps([
        {"conversation": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "category": "greet"},
        {"conversations": [{"from": "human", "value": "Name a color."}]},
        {"instruction": "Sum up.", "input": "A text."},
        "not a request",
    ], indent=2))
    rows, skips, fmt = read_traffic(f)
    assert fmt == "chat" and [(r["category"], r["messages"][-1]["content"]) for r in rows] == [
        ("greet", "Hi"), ("traffic", "Name a color."), ("traffic", "Sum up.\n\nA text.")]
    assert skips == {"unparsable line": 1}
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    f.write_text(json.dumps([{"custom_id": "1", "url": "/v1/chat/completions", "body": body}], indent=2))
    rows, _, fmt = read_traffic(f)
    assert fmt == "openai-batch" and rows[0]["messages"] == body["messages"]
    assert read_traffic(f, fmt="openai-batch")[0] == rows


def test_vllm_request_log_reads_json_bodies_and_counts_cut_ones(tmp_path):
    ok = {"messages": [{"role": "user", "content": "Tell me a joke."}], "max_tokens": 64}
    f = write(tmp_path / "vllm.log", [
        "INFO 11-28 10:00:00 [api_server.py:1] vLLM API server version 0.32.0",
        f"DEBUG 11-28 10:00:01 [request_logger.py:73] Request chatcmpl-1 JSON body: {json.dumps(ok)}",
        "INFO 11-28 10:00:01 [request_logger.py:66] Received request chatcmpl-1: params: SamplingParams(...)",
        'DEBUG 11-28 10:00:02 [request_logger.py:73] Request chatcmpl-2 JSON body: {"messages": [{"role": "us',
    ])
    rows, skips, fmt = read_traffic(f, category="jokes")
    assert fmt == "vllm-log" and len(rows) == 1 and rows[0]["category"] == "jokes"
    assert skips == {"request body cut short (vLLM's --max-log-len)": 1}
    rotated = tmp_path / "vllm.log.1.gz"  # logrotate's compressed log, passed as it is
    rotated.write_bytes(gzip.compress(f.read_bytes(), mtime=0))
    assert read_traffic(rotated, category="jokes") == (rows, skips, fmt)


RESPONSES_BODIES = [
    {"model": "m", "input": "Name a color.", "metadata": {"category": "colors"}},
    {"model": "m", "instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Hi "}, {"type": "input_text", "text": "there"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": "And now?"}]},
    {"model": "m", "input": [{"type": "function_call_output", "call_id": "c1", "output": "42"}]},
    {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                                          {"type": "input_image", "image_url": "data:image/png;base64,x"}]}]},
]
RESPONSES_TURNS = [
    [{"role": "user", "content": "Name a color."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "And now?"}],
]


def test_openai_responses_requests_in_a_batch_file_and_a_chat_file(tmp_path):
    """The Responses API (POST /v1/responses): `instructions` a system turn, `input` a text or message items (text
    parts joined); a request whose input holds a tool call's output, or an image, is no chat prompt for a text
    target: skipped and counted (its text alone is not what was asked)."""
    batch = write(tmp_path / "b.jsonl", [{"custom_id": str(i), "method": "POST", "url": "/v1/responses", "body": b}
                                          for i, b in enumerate(RESPONSES_BODIES)])
    rows, skips, fmt = read_traffic(batch)
    assert fmt == "openai-batch" and [r["messages"] for r in rows] == RESPONSES_TURNS
    image = {"role": "user", "content": [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "x"}}]}
    chat_rows, chat_skips, _ = read_traffic(write(tmp_path / "img.jsonl", [{"messages": [image]}, {"prompt": "Hi"}]))
    assert [r["messages"] for r in chat_rows] == [[{"role": "user", "content": "Hi"}]]
    assert chat_skips == {"request without a usable chat turn": 1}
    assert rows[0]["category"] == "colors" and rows[1]["category"] == "traffic"
    assert skips == {"Responses request without a usable chat turn (reasoning, images, custom or namespaced tools)": 2}
    rows, skips, fmt = read_traffic(write(tmp_path / "c.jsonl", RESPONSES_BODIES))
    assert fmt == "chat" and [r["messages"] for r in rows] == RESPONSES_TURNS


def test_responses_requests_as_vllm_logs_them(tmp_path):
    """vLLM's request logger writes `request.model_dump_json(exclude_unset=True)` of its own ResponsesRequest: the
    bodies made by vLLM's protocol classes, read back into the same turns."""
    pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh --engines vllm)")
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    lines = [f"DEBUG 12-07 10:00:0{i} [request_logger.py:74] Request resp_{i} JSON body: "
             f"{ResponsesRequest(**b).model_dump_json(exclude_unset=True)}" for i, b in enumerate(RESPONSES_BODIES[:2])]
    rows, skips, fmt = read_traffic(write(tmp_path / "vllm.log", lines))
    assert fmt == "vllm-log" and [r["messages"] for r in rows] == RESPONSES_TURNS and not skips


def sglang_line(event, obj, **extra):
    """A line of SGLang's JSON request log as its log_utils.log_json writes one (sgl-project/sglang, python/sglang/srt/
    utils/log_utils.py): json.dumps({"timestamp", "event", **data}, ensure_ascii=False), data {"obj": ...}."""
    return json.dumps({"timestamp": "2026-12-07T17:00:00.000001", "event": event, "obj": obj, **extra}, ensure_ascii=False)


def sglang_cut(text, max_length=2048):
    """request_logger._transform_data_for_logging's cut of a string at --log-requests-level 2."""
    half = max_length // 2
    return text[:half] + "..." + text[-half:] if len(text) > max_length else text


def test_sglang_json_request_log_reads_each_openai_request_once(tmp_path):
    """`--log-requests --log-requests-format json`: each OpenAI request's "request.received.openai" line (the request
    as sent: model_dump(exclude_none=True)) is a prompt; the same request's tokenized "request.received" and its
    "request.finished" lines, and the server's own lines, are left alone; a completion request and a text cut by
    level 2 are skipped, counted."""
    chat = {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour é."}],
            "max_tokens": 64, "stream": False}
    long = "word " * 600  # 3000 characters: level 2 logs its first and last 1024
    f = write(tmp_path / "sglang.log", [
        "[2026-12-07 17:00:00] INFO:     Started server process [1234]",
        sglang_line("request.received.openai", chat),
        sglang_line("request.received", {"text": None, "input_ids": [1, 2, 3], "rid": "abc"}, rid="abc"),
        sglang_line("request.finished", {"rid": "abc"}, rid="abc", out={"text": "Blue.", "meta_info": {}}),
        sglang_line("request.received.openai", chat),  # a repeat
        sglang_line("request.received.openai", {"model": "m", "prompt": "Once upon a time"}),  # /v1/completions
        sglang_line("request.received.openai", {"model": "m", "messages": [{"role": "user", "content": sglang_cut(long)}]}),
        sglang_line("request.received.openai", {"model": "m", "messages": [{"role": "user", "content": sglang_cut("short")}]}),
    ])
    rows, skips, fmt = read_traffic(f)
    assert fmt == "sglang-log"
    assert [r["messages"] for r in rows] == [chat["messages"], [{"role": "user", "content": "short"}]]
    assert skips == {"repeated prompt": 1, "completion request (raw text, no chat turns)": 1,
                     "request cut short (SGLang's --log-requests-level 2; 3 logs it whole)": 1}
    with pytest.raises(DataError, match=r"holds no usable prompt \(sglang-log: no request in it\)"):
        read_traffic(write(tmp_path / "s.log", [sglang_line("request.finished", {"rid": "x"})]), fmt="sglang-log")
    level1 = [sglang_line("request.received", {"rid": "x", "sampling_params": {"max_new_tokens": 8}}, rid="x")]
    with pytest.raises(DataError, match=r"sglang-log: 1 request logged without its text \(SGLang's --log-requests-level 0 or 1"):
        read_traffic(write(tmp_path / "l1.log", level1))


def test_requests_holding_unicode_line_separators_are_read_whole(tmp_path):
    """A request whose text holds U+2028 or U+0085 raw (JSON allows it; a writer with ensure_ascii=False writes it
    so) is one line of a JSONL file or a vLLM log, not two unparsable halves."""
    texts = ["Summarise:\u2028a passage", "next\x85line"]
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps({"prompt": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    rows, skips, fmt = read_traffic(f)
    assert fmt == "chat" and [r["messages"][0]["content"] for r in rows] == texts and not skips
    log = tmp_path / "vllm.log"
    log.write_text("".join(f"DEBUG 11-28 10:00:0{i} [request_logger.py:73] Request chatcmpl-{i} JSON body: "
                           + json.dumps({"messages": [{"role": "user", "content": t}]}, ensure_ascii=False) + "\n"
                           for i, t in enumerate(texts)), encoding="utf-8")
    rows, skips, fmt = read_traffic(log)
    assert fmt == "vllm-log" and [r["messages"][0]["content"] for r in rows] == texts and not skips


def test_a_byte_order_mark_before_the_first_request_is_read_past(tmp_path):
    """A JSONL saved by a Windows editor with a byte-order mark is still chat traffic, its first request kept."""
    f = tmp_path / "t.jsonl"
    f.write_text("\ufeff" + "".join(json.dumps({"prompt": t}) + "\n" for t in ["first", "second"]), encoding="utf-8")
    rows, skips, fmt = read_traffic(f)
    assert fmt == "chat" and [r["messages"][0]["content"] for r in rows] == ["first", "second"] and not skips


def test_unknown_format_and_no_usable_prompt_are_one_line_errors(tmp_path):
    with pytest.raises(DataError, match="not a traffic file"):
        read_traffic(write(tmp_path / "x.jsonl", [{"text": "a document"}]))
    with pytest.raises(DataError, match=r"holds no usable prompt \(chat: 1 request without a usable chat turn"):
        read_traffic(write(tmp_path / "y.jsonl", [{"messages": [{"role": "assistant", "content": "only an answer"}]}]))
    with pytest.raises(DataError, match="holds no usable prompt"):
        read_traffic(write(tmp_path / "z.log", ["INFO nothing here"]), fmt="vllm-log")



def test_a_pipe_is_refused_as_not_a_regular_file(tmp_path):
    # `--prompts <(zcat log.gz)` is a pipe: read once to check it, it would be empty when the stage reads it
    fifo = tmp_path / "requests.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match=r"is not a regular file \(a pipe or a device"):
        read_traffic(fifo)

def triton_trace(requests: list[tuple[int, str, str]]) -> str:
    """A trace as tritonserver 2.51 writes it at level TENSORS (seen in tests/interop/test_triton.py): each BYTES
    element framed by a backslash and a quote, its text as it is, quotes and newlines unescaped (no JSON)."""
    frame = '\\"'
    return "[" + ",".join(
        f'{{"id":{i},"model_name":"tensorrt_llm","model_version":1}},'
        f'{{"id":{i},"timestamps":[{{"name":"QUEUE_START","ns":{i}000}}]}},'
        f'{{"id":{i},"activity":"TENSOR_QUEUE_INPUT","tensor":{{"name":"text_input","data":"{frame}{text}{frame}",'
        f'"shape":"{shape}","dtype":"BYTES"}}}},'
        f'{{"id":{i},"activity":"TENSOR_QUEUE_INPUT","tensor":{{"name":"streaming","data":"0","shape":"1","dtype":"BOOL"}}}}'
        for i, text, shape in requests) + "]"


CONVERSATIONS = [
    [{"role": "user", "content": 'Say "hi",\nthen stop. Ünïcode ✓'}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a color."}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b <|im_end|> b"}, {"role": "user", "content": "c"}],
]


def test_a_triton_trace_is_read_back_into_turns_with_the_chat_template(tmp_path, demo_model_dir):
    """Triton's FILE.0, FILE.1, ... (log-frequency) or one FILE: each text_input rendered by the target's chat
    template read back into the turns it was rendered from; raw text, repeats and batched inputs skipped, counted."""
    from trtspec.models import load_tokenizer

    tok = load_tokenizer(demo_model_dir)
    texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in CONVERSATIONS]
    (tmp_path / "trace.json.0").write_text(triton_trace([(1, texts[0], "1"), (2, texts[1], "1")]))
    (tmp_path / "trace.json.1").write_text(triton_trace([(3, texts[2], "1,1"), (4, "raw text, no template", "1"),
                                                         (5, texts[0], "1"), (6, texts[1], "2")]))
    rows, skips, fmt = read_traffic(tmp_path / "trace.json", tok=tok)  # no FILE: Triton wrote only FILE.N
    assert fmt == "triton-trace" and [r["messages"] for r in rows] == CONVERSATIONS
    assert skips == {"text_input the chat template did not write (raw text)": 1, "repeated prompt": 1,
                     "text_input of several prompts": 1}
    one = tmp_path / "one" / "trace.json"
    one.parent.mkdir()
    one.write_text(triton_trace([(1, texts[1], "1")]))
    rows, _, fmt = read_traffic(one, tok=tok)
    assert fmt == "triton-trace" and [r["messages"] for r in rows] == [CONVERSATIONS[1]]


def test_turns_are_read_back_through_a_template_without_a_system_turn(demo_model_dir):
    """A Gemma-like template: it refuses a system turn and trims contents; what it did not write reads as None."""
    from trtspec.chat import turns_reader
    from trtspec.models import load_tokenizer

    tok = load_tokenizer(demo_model_dir)
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}"
                         "{% endif %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
                         "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
                         "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
    read = turns_reader(tok)
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
             {"role": "user", "content": "Two\nlines"}]
    assert read(tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)) == turns
    assert read("<start_of_turn>user\nHi<end_of_turn>\n") is None  # no generation prompt: no request for an answer
    assert read("Hi") is None
    long = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(39)]  # 20 user turns
    assert read(tok.apply_chat_template(long, tokenize=False, add_generation_prompt=True)) == long
    # more user turns than it tries, or a content that quotes what the template writes between turns: no cut to
    # trust, so no turns (not one turn holding the rest)
    assert turns_reader(tok, max_turns=19)(tok.apply_chat_template(long, tokenize=False, add_generation_prompt=True)) is None
    quoting = [{"role": "user", "content": "Why does <end_of_turn>\n<start_of_turn>model\n end a turn?"}]
    assert read(tok.apply_chat_template(quoting, tokenize=False, add_generation_prompt=True)) is None


def test_a_triton_trace_without_tensors_is_one_line(tmp_path, demo_model_dir):
    from trtspec.models import load_tokenizer

    f = tmp_path / "trace.json"
    f.write_text('[{"id":1,"model_name":"tensorrt_llm","model_version":1},'
                 '{"id":1,"timestamps":[{"name":"REQUEST_START","ns":1}]}]')
    with pytest.raises(DataError, match=r"holds no usable prompt \(triton-trace: no request in it\)") as e:
        read_traffic(f, tok=load_tokenizer(demo_model_dir))
    assert "level=TENSORS" in e.value.hint
