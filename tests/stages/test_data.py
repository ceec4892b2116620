"""The data stage: each input format, bad inputs, the loss mask, the held-out split, resumable regeneration."""

from __future__ import annotations

import codecs
import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from stagekit import BareCtx

from trtspec import chat
from trtspec.config import config_from_dict
from trtspec.errors import DataError
from trtspec.generation import hf_greedy
from trtspec.stages import data


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((json.dumps(r) if not isinstance(r, str) else r) + "\n" for r in rows))
    return path


def test_messages_and_sharegpt_rows(tmp_path):
    skips: Counter = Counter()
    rows = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], "category": "chat"},
        {"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}, {"from": "human", "value": "thanks"}]},
        {"messages": [{"role": "user", "content": "no answer here"}]},
        {"text": "a plain document"},
    ]
    got = chat.conversations_from_rows(chat.read_jsonl(_write(tmp_path / "c.jsonl", rows + ["{broken"]), skips), "c", skips)
    assert [r["messages"][-1]["content"] for r in got] == ["hello", "4", "a plain document"]
    assert got[1]["messages"] == [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    assert got[2]["category"] == "text"
    assert skips == Counter({"no assistant turn": 1, "unparsable line": 1})


def test_prompt_file_dedup_and_bad_lines(tmp_path):
    skips: Counter = Counter()
    p = _write(tmp_path / "p.jsonl", [{"prompt": "a"}, {"prompt": "a"}, {"prompt": ""}, "not json", {"prompt": "b", "category": "math"}])
    prompts = chat.read_prompt_file(p, skips)
    assert [(x["messages"][0]["content"], x["category"]) for x in prompts] == [("a", "chat"), ("b", "math")]
    assert skips == Counter({"duplicate prompt": 1, "prompt row without prompt": 1, "unparsable prompt line": 1})
    plain = tmp_path / "p.txt"
    plain.write_text("first prompt\n\nsecond prompt\n")
    assert len(chat.read_prompt_file(plain, Counter())) == 2


def test_rows_holding_unicode_line_separators_are_read_whole(tmp_path):
    """JSON holds U+2028, U+2029 and U+0085 raw inside a string (json.dumps with ensure_ascii=False, as the data stage
    writes data/train.jsonl); a JSON Lines row ends at "\\n" only, and a CRLF file reads as an LF one."""
    texts = ["one\u2028line", "two\u2029paragraphs", "next\x85line"]
    conv = [{"messages": [{"role": "user", "content": t}, {"role": "assistant", "content": t}]} for t in texts]
    f = tmp_path / "c.jsonl"
    f.write_text("".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in conv), encoding="utf-8")
    skips: Counter = Counter()
    got = chat.conversations_from_rows(chat.read_jsonl(f, skips), "c", skips)
    assert [r["messages"][-1]["content"] for r in got] == texts and not skips
    assert [r["messages"][-1]["content"] for r in chat.read_rows(f)] == texts
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps({"prompt": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    assert [x["messages"][0]["content"] for x in chat.read_prompt_file(p, skips)] == texts and not skips


def test_a_byte_order_mark_before_the_first_row_is_not_part_of_it(tmp_path):
    """Notepad and Windows PowerShell 5 write UTF-8 with a byte-order mark; the first row is read as any other."""
    p = tmp_path / "p.jsonl"
    p.write_text("\ufeff" + "".join(json.dumps({"prompt": t}) + "\n" for t in ["a", "b"]), encoding="utf-8")
    skips: Counter = Counter()
    assert [x["messages"][0]["content"] for x in chat.read_prompt_file(p, skips)] == ["a", "b"] and not skips
    c = tmp_path / "c.jsonl"
    c.write_text("\ufeff" + json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
                 + "\n", encoding="utf-8")
    assert len(chat.read_jsonl(c, skips)) == 1 and not skips



def test_utf16_with_its_byte_order_mark_is_read_and_unmarked_utf16_refused(tmp_path):
    """Windows PowerShell 5's `>` and Out-File write UTF-16 with a byte-order mark: read like UTF-8, CRLF and all.
    Without a mark the encoding cannot be told, and the file is refused in one line as before."""
    text = "".join(json.dumps({"prompt": t}, ensure_ascii=False) + "\r\n" for t in ["Größe?", "✓ b"])
    p = tmp_path / "p.jsonl"
    for encoded in (text.encode("utf-16"), codecs.BOM_UTF16_BE + text.encode("utf-16-be")):
        p.write_bytes(encoded)
        skips: Counter = Counter()
        chat.check_text_file(p, "data file", "")
        assert [x["messages"][0]["content"] for x in chat.read_prompt_file(p, skips)] == ["Größe?", "✓ b"] and not skips
    p.write_bytes(text.encode("utf-16-le"))
    with pytest.raises(DataError, match="cannot be read as UTF-8 text"):
        chat.read_prompt_file(p, Counter())


# One row as each kind of file users bring writes it: the anchors' prepared files, the public chat logs, and the
# instruction datasets
DATASET_ROWS = {
    "SpecForge prepare_data.py": {"id": "s1", "conversations": [{"role": "user", "content": "Hi"},
                                                               {"role": "assistant", "content": "Hello"}]},
    "ShareGPT": {"id": "g1", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]},
    "LMSYS-Chat-1M, WildChat": {"conversation_id": "l1", "conversation": [{"role": "user", "content": "Hi"},
                                                                           {"role": "assistant", "content": "Hello"}]},
    "Alpaca": {"instruction": "Hi", "input": "", "output": "Hello"},
    "Alpaca with an input": {"instruction": "Sum up.", "input": "A text.", "output": "Short."},
    "Dolly": {"instruction": "Who is here?", "context": "Bob is here.", "response": "Bob.", "category": "closed_qa"},
    "OpenOrca": {"id": "o1", "system_prompt": "Be brief.", "question": "Hi", "response": "Hello"},
}


def test_the_rows_of_the_anchors_files_and_public_datasets_are_read_as_conversations_and_prompts(tmp_path):
    """Each row shape gives the same turns as OpenAI `messages` would, as a conversation (kind: jsonl) and as a
    prompt (kind: regenerate, or jsonl with regenerate: true); before, all but ShareGPT were dropped as having no
    `messages`, and SpecForge's and Model Optimizer's {role, content} `conversations` as turns without a role."""
    f = _write(tmp_path / "rows.jsonl", list(DATASET_ROWS.values()))
    skips: Counter = Counter()
    got = chat.read_source(f, skips, "jsonl")
    assert not skips and [r["messages"] for r in got] == [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]] * 4 + [
        [{"role": "user", "content": "Sum up.\n\nA text."}, {"role": "assistant", "content": "Short."}],
        [{"role": "user", "content": "Who is here?\n\nBob is here."}, {"role": "assistant", "content": "Bob."}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]]
    assert [r["id"] for r in got][:3] == ["s1", "g1", "rows:2"] and got[5]["category"] == "closed_qa"
    turns = [r["messages"][:-1] for r in got]
    assert [r["messages"] for r in chat.read_source(f, skips, "jsonl", regenerate=True)] == turns and not skips
    assert [r["messages"] for r in chat.read_source(f, skips, "regenerate")] == turns[3:]  # a prompt file: once each
    assert skips == Counter({"duplicate prompt": 3})


def test_model_optimizers_prepared_conversations_are_prompts_for_the_target(tmp_path):
    """prepare_input_conversations writes the user's turns only, for the target to answer: prompts under kind:
    regenerate or regenerate: true; as conversations to train on they have no answer, and the refusal says what to
    set."""
    f = _write(tmp_path / "input_conversations.jsonl", [
        {"conversation_id": "m1", "conversations": [{"role": "user", "content": "Tell me a joke."}]},
        {"conversation_id": "m2", "conversations": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"},
                                                    {"role": "user", "content": "Again?"}]},
    ])
    for kind, regenerate in (("regenerate", False), ("jsonl", True)):
        skips: Counter = Counter()
        got = chat.read_source(f, skips, kind, regenerate=regenerate)
        assert [r["messages"][-1]["content"] for r in got] == ["Tell me a joke.", "Hi"] if kind == "jsonl" else \
            ["Tell me a joke.", "Again?"]
    skips = Counter()
    rows = chat.read_source(f, skips, "jsonl")
    assert [r["messages"][-1]["content"] for r in rows] == ["Yo"] and skips == Counter({"no assistant turn": 1})
    with pytest.raises(DataError, match=r"holds no usable conversation \(2 no assistant turn\).*regenerate: true"):
        chat.require_rows([], f, "data file", "conversation", Counter({"no assistant turn": 2}))


def test_an_hf_source_reads_a_local_copy_of_a_dataset(tmp_path):
    """kind: hf with no network: a .parquet file as the hub serves datasets, or a save_to_disk folder, by datasets'
    own code; rows as a jsonl source reads them, prompts under regenerate: true; `limit` rows at most."""
    import datasets

    rows = [DATASET_ROWS["ShareGPT"], DATASET_ROWS["Dolly"], {"conversations": [{"from": "human", "value": "Alone"}]}]
    ds = datasets.Dataset.from_list([{"conversations": r.get("conversations"), "instruction": r.get("instruction"),
                                      "context": r.get("context"), "response": r.get("response")} for r in rows])
    ds.to_parquet(str(tmp_path / "chats.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    for path in ("chats.parquet", "saved"):
        cfg = config_from_dict({"data": {"sources": [{"kind": "hf", "path": path}, {"kind": "hf", "path": path,
                                                                                    "regenerate": True, "limit": 2}]}},
                               base_dir=tmp_path)
        skips: Counter = Counter()
        got = data.hf_conversations(cfg, 0, skips)
        assert [r["messages"][-1]["content"] for r in got] == ["Hello", "Bob."] and skips == Counter({"no assistant turn": 1})
        assert [r["messages"] for r in data.hf_conversations(cfg, 1, skips)] == [
            [{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Who is here?\n\nBob is here."}]]
    ds.to_json(str(tmp_path / "chats.jsonl.gz"), compression="gzip")  # a compressed data file, read through
    cfg = config_from_dict({"data": {"sources": [{"kind": "hf", "path": "chats.jsonl.gz"}]}}, base_dir=tmp_path)
    assert [r["messages"][-1]["content"] for r in data.hf_conversations(cfg, 0, Counter())] == ["Hello", "Bob."]
    cfg = config_from_dict({"data": {"sources": [{"kind": "hf", "path": "gone.parquet"}]}}, base_dir=tmp_path)
    with pytest.raises(DataError, match=r"data\.sources\[0\] dataset 'gone\.parquet' split 'train': '.*gone\.parquet' does not exist"):
        data.hf_conversations(cfg, 0, Counter())


def test_a_file_that_is_one_json_array_is_read_as_its_rows(tmp_path):
    """`json.dump(rows, f, indent=2)` writes one array over many lines. Read line by line, a prompt file's lines "[",
    "{" and '"prompt": "..."' each became a prompt for the target to answer, and documents likewise."""
    p = tmp_path / "p.json"
    p.write_text(json.dumps([{"prompt": "What is a star?"}, {"prompt": "Name a river."}], indent=2))
    skips: Counter = Counter()
    assert [x["messages"][0]["content"] for x in chat.read_prompt_file(p, skips)] == ["What is a star?", "Name a river."]
    assert not skips
    c = tmp_path / "c.json"
    c.write_text(json.dumps([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}, 3],
                            indent=2))
    assert [r["messages"][1]["content"] for r in chat.read_source(c, skips, "jsonl")] == ["yo"]
    assert skips == Counter({"not a JSON object": 1})
    d = tmp_path / "docs.json"
    d.write_text(json.dumps([{"text": "A long document."}, {"title": "no text"}], indent=2))
    skips = Counter()
    assert chat.read_documents(d, skips) == ["A long document."] and skips == Counter({"row without a 'text' field": 1})
    t = tmp_path / "t.txt"  # a plain prompt that only starts like an array stays a prompt
    t.write_text("[INST] Say hi.\nName a color.\n")
    assert [x["messages"][0]["content"] for x in chat.read_prompt_file(t, Counter())] == ["[INST] Say hi.", "Name a color."]

def test_prompt_rows_of_messages_read_as_suites_and_traffic_read_them(tmp_path):
    """A prompt file's `messages`: text parts joined, roles named as in conversations, a last answer dropped; a row
    with a turn the target cannot be prompted with is skipped whole (it was cut down to its other turns: a system
    turn alone asked the target for an answer)."""
    rows = [
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": [{"type": "text", "text": "Name "}, {"type": "text", "text": "a colour."}]}]},
        {"messages": [{"role": "human", "content": "Hi"}, {"role": "gpt", "content": "Hello"}]},
        {"messages": [{"role": "user", "content": "Weather?"}, {"role": "tool", "content": "{}"}]},
    ]
    skips: Counter = Counter()
    got = chat.read_prompt_file(_write(tmp_path / "p.jsonl", rows), skips)
    assert [x["messages"] for x in got] == [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}],
        [{"role": "user", "content": "Hi"}]]
    assert skips == Counter({"prompt row without prompt": 1})


def test_unreadable_and_missing_files(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        chat.read_jsonl(tmp_path / "nope.jsonl", Counter())
    bad = tmp_path / "bin.jsonl"
    bad.write_bytes(PNG)  # an image passed as data (FF FE would be UTF-16's mark)
    with pytest.raises(DataError, match="UTF-8"):
        chat.read_jsonl(bad, Counter())


PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))  # no text in any encoding trtspec reads


def test_compressed_files_are_read_as_the_text_inside(tmp_path):
    """A JSONL (or prompt, or traffic) file gzip-, bzip2- or xz-compressed is read by its first bytes, whatever its
    name; one cut short is one line naming it."""
    import bz2
    import lzma

    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo ✓"}]}] * 2
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
    for name, packed in (("c.jsonl.gz", gzip.compress(text, mtime=0)), ("c.jsonl.bz2", bz2.compress(text)),
                         ("c.xz", lzma.compress(text))):
        (tmp_path / name).write_bytes(packed)
        chat.check_text_file(tmp_path / name, "data file", "")
        assert [r["messages"][1]["content"] for r in chat.read_source(tmp_path / name, Counter(), "jsonl")] == ["yo ✓"] * 2
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(text * 500, mtime=0)[:-40])
    with pytest.raises(DataError, match=r"data file '.*cut\.jsonl\.gz' is gzip-compressed and cannot be read whole \(EOFError"):
        chat.read_source(cut, Counter(), "jsonl")
    corrupt = bytearray(gzip.compress(text * 500, mtime=0))
    corrupt[20:60] = bytes(b ^ 0xFF for b in corrupt[20:60])
    cut.write_bytes(bytes(corrupt))
    with pytest.raises(DataError, match=r"is gzip-compressed and cannot be read whole \(error: Error -3"):
        chat.read_source(cut, Counter(), "jsonl")


def test_loss_mask_covers_assistant_tokens_only(tiny_model_dir):
    from trtspec.models import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    row = {"messages": [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "Blue is a color."}]}
    ids, mask, cut = chat.tokenize_row(row, tok, 512)
    assert not cut and len(ids) == len(mask)
    labelled = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert "Blue is a color." in labelled and "Name a color" not in labelled
    short_ids, short_mask, cut = chat.tokenize_row(row, tok, 8)
    assert cut and len(short_ids) == 8 and short_ids == ids[:8]


# Two templates that render an earlier turn otherwise once later turns follow, written from their families'
# behaviour: Qwen3's drops an earlier answer's reasoning and shows the last answer in a <think> block; Mistral's
# (v0.3) moves the system message into the last user turn, which a conversation ending in an answer does not have.
QWEN3_LIKE = (
    "{%- set ns = namespace(last=0) %}{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last = loop.index0 %}"
    "{%- endif %}{%- endfor %}{%- for m in messages %}{%- if m.role != 'assistant' %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- else %}{%- set answer = m.content %}"
    "{%- set thought = m.reasoning_content if m.reasoning_content is string else '' %}{%- if '</think>' in answer %}{%- set thought = answer.split('</think>')[0].split('<think>')[-1]"
    ".strip() %}{%- set answer = answer.split('</think>')[-1].lstrip() %}{%- endif %}{%- if loop.index0 > ns.last %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + thought + '\\n</think>\\n\\n' + answer + '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>assistant\\n' + answer + '<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and "
    "enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")
MISTRAL_LIKE = (
    "{%- if messages[0].role == 'system' %}{%- set system = messages[0].content %}{%- set turns = messages[1:] %}"
    "{%- else %}{%- set turns = messages %}{%- endif %}{%- for m in turns %}{%- if m.role == 'user' %}"
    "{%- if loop.last and system is defined %}{{- '[INST] ' + system + '\\n\\n' + m.content + '[/INST]' }}{%- else %}"
    "{{- '[INST] ' + m.content + '[/INST]' }}{%- endif %}{%- else %}{{- ' ' + m.content + '</s>' }}{%- endif %}{%- endfor %}")

# DeepSeek-R1's distills: an answer rendered without its reasoning, the generation prompt opening a <think> block
R1_LIKE = (
    "{%- for m in messages %}{%- if m.role == 'user' %}{{- '<|im_start|>User:' + m.content }}{%- elif m.role == "
    "'assistant' %}{{- '<|im_start|>Assistant:' + m.content.split('</think>')[-1] + '<|im_end|>' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>Assistant:<think>\\n' }}{%- endif %}")


def labelled_spans(tok, row: dict) -> list[str]:
    ids, mask, _ = chat.tokenize_row(row, tok, 512)
    assert ids == chat.template_ids(tok, row["messages"], False)
    runs = [[]]
    for t, m in zip(ids, mask, strict=True):
        runs[-1].append(t) if m else runs[-1] and runs.append([])
    return [tok.decode(r) for r in runs if r]


def test_loss_mask_of_a_template_that_rewrites_earlier_turns(tiny_model_dir):
    """Each answer's own tokens are labelled, and nothing of a user's turn, where the template renders an earlier
    turn otherwise once later turns follow. Before, the labels of such a turn were counted from its own rendering
    and fell on the next user's words (Qwen3) or on the system message's length away from the answer (Mistral)."""
    from trtspec.models import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    turns = [{"role": "user", "content": "Name a colour."},
             {"role": "assistant", "content": "<think>\nA primary one.\n</think>\n\nBlue."},
             {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "Red."}]
    assert labelled_spans(tok, {"messages": turns}) == ["<think>\nA primary one.\n</think>\n\nBlue.<|im_end|>\n",
                                                        "Red.<|im_end|>\n"]  # the demo's template keeps every turn
    tok.chat_template = QWEN3_LIKE
    assert labelled_spans(tok, {"messages": turns}) == ["Blue.<|im_end|>\n", "<think>\n\n</think>\n\nRed.<|im_end|>\n"]
    # the reasoning of a server's response (`reasoning_content`) is kept, and labelled where the template shows it
    reasoned = chat.conversations_from_rows([{"messages": [*turns[:3], {**turns[3], "reasoning_content": "Warm."}]}], "r",
                                            Counter())[0]
    assert labelled_spans(tok, reasoned) == ["Blue.<|im_end|>\n", "<think>\nWarm.\n</think>\n\nRed.<|im_end|>\n"]
    tok.chat_template = MISTRAL_LIKE
    system = [{"role": "system", "content": "Answer in one word."}]
    same = [{"role": "user", "content": "Yes or no?"}, {"role": "assistant", "content": "Yes."}] * 2
    assert labelled_spans(tok, {"messages": system + turns[2:] + same}) == [" Red.</s>", " Yes.</s>", " Yes.</s>"]
    assert labelled_spans(tok, {"messages": system + turns[2:]}) == [" Red.</s>"]
    # an answer found after the reasoning that names it, and an answer that is a word of the template's
    thought = [{"role": "user", "content": "Colour?"}, {"role": "assistant", "content": "<think>Say Blue.</think>Blue."},
               {"role": "user", "content": "Role?"}, {"role": "assistant", "content": "INST"}]
    assert labelled_spans(tok, {"messages": system + thought + turns[2:]}) == ["Say Blue.</think>Blue.</s>", " INST</s>",
                                                                              " Red.</s>"]
    tok.chat_template = R1_LIKE  # before, the labels began as many tokens late as '<think>\n' has: '.<|im_end|>'
    assert labelled_spans(tok, {"messages": turns}) == ["\n\nBlue.<|im_end|>", "Red.<|im_end|>"]


def test_chat_template_kwargs_are_set_for_every_prompt_and_in_the_saved_tokenizer(tmp_path, tiny_model_dir):
    """model.chat_template_kwargs: {enable_thinking: false} encodes each prompt as vLLM's chat_template_kwargs would;
    an answer to the prompt encoded otherwise is asked again; the saved tokenizer (the bundle's) renders the same; a
    variable the template does not read is refused."""
    import shutil

    from trtspec.errors import ConfigError
    from trtspec.models import load_model, load_tokenizer, with_template_kwargs

    model = tmp_path / "qwen3ish"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text(QWEN3_LIKE)
    conf = json.loads((model / "tokenizer_config.json").read_text())
    conf.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(conf))
    ask = [{"role": "user", "content": "Name a colour."}]
    thinking, plain = load_tokenizer(model), load_tokenizer(model, {"enable_thinking": False})
    assert thinking.decode(chat.encode_prompt(thinking, ask)).endswith("<|im_start|>assistant\n")
    assert plain.decode(chat.encode_prompt(plain, ask)).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    plain.save_pretrained(tmp_path / "bundle")
    assert chat.encode_prompt(load_tokenizer(tmp_path / "bundle"), ask) == chat.encode_prompt(plain, ask)
    prompts, answers, asked = [{"id": "a", "category": "chat", "messages": ask}], tmp_path / "answers.jsonl", []
    lm = _talkative(load_model(model))
    rows = data.regenerate(prompts, plain, answers, hf_answers(lm, plain, 3, asked), print)
    assert rows[0]["input_ids"][: rows[0]["label_start"]] == chat.encode_prompt(plain, ask)
    data.regenerate(prompts, plain, answers, hf_answers(lm, plain, 3, asked), print)
    data.regenerate(prompts, thinking, answers, hf_answers(lm, thinking, 3, asked), print)
    assert asked == [chat.encode_prompt(plain, ask), chat.encode_prompt(thinking, ask)]  # not asked twice as it was
    defaulted = "{%- if reasoning_effort is not defined %}{%- set reasoning_effort = 'medium' %}{%- endif %}{{ reasoning_effort }}"
    import jinja2  # a variable the template defaults where unset (gpt-oss's reasoning_effort) is read, and set

    assert jinja2.Template(with_template_kwargs(defaulted, {"reasoning_effort": "low"}, model)).render() == "low"
    with pytest.raises(ConfigError, match=r"^model.chat_template_kwargs: the chat template in .* reads no enable_thinking \(it reads: add_generation_prompt, messages\)"):
        load_tokenizer(tiny_model_dir, {"enable_thinking": False})


def test_rows_the_chat_template_refuses_are_skipped_and_counted(tiny_model_dir):
    from trtspec.models import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    tok.chat_template = ("{%- for m in messages %}{%- if m.role == 'system' %}{{ raise_exception('System role not "
                         "supported') }}{%- endif %}{{- m.role + ': ' + m.content + '\\n' }}{%- endfor %}")
    plain = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]
    rows = [{"messages": plain}, {"messages": [{"role": "system", "content": "Be brief."}, *plain]}]
    skips = Counter()
    assert chat.rendered_rows(rows, tok, skips, prompts=False) == rows[:1]
    assert skips == {"refused by the chat template: System role not supported": 1}
    with pytest.raises(DataError, match=r"^the target's chat template refuses the turns system/user: System role not"):
        chat.encode_prompt(tok, rows[1]["messages"][:2])
    tok.chat_template = "{%- for tool in tools %}{{ tool }}{%- endfor %}{{- messages[0].content }}"  # fails: tools=None
    assert chat.rendered_rows(rows, tok, skips, prompts=False) == []
    assert skips["refused by the chat template: TypeError: 'NoneType' object is not iterable"] == 2


def test_split_keeps_heldout_and_is_seeded():
    rows = [{"id": str(i)} for i in range(20)]
    train, held = data.split_heldout(rows, 0.1, seed=0)
    assert len(held) == 2 and len(train) == 18 and not {r["id"] for r in held} & {r["id"] for r in train}
    assert data.split_heldout(rows, 0.1, seed=0) == (train, held)
    assert len(data.split_heldout(rows[:3], 0.01, 0)[1]) == 1  # a small fraction still keeps one row




def _ctx(tmp_path, model_dir, sources, **data_kw):
    cfg = config_from_dict(
        {"model": {"source": str(model_dir)}, "data": {"sources": sources, "seq_len": 48, "max_new_tokens": 4, "batch_size": 4, **data_kw}},
        base_dir=tmp_path,
    )
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    return BareCtx(cfg=cfg, out=out, work=work, inputs={}, manifests={}, stage="data")


def test_stage_jsonl_writes_contract_and_counts(tmp_path, tiny_model_dir):
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "word " * (3 + 40 * (i % 2))}]} for i in range(10)]
    _write(tmp_path / "c.jsonl", rows + [{"messages": [{"role": "user", "content": "x"}]}])
    m = data.run(_ctx(tmp_path, tiny_model_dir, [{"kind": "jsonl", "path": "c.jsonl"}], seq_len=64))
    assert m["train_rows"] + m["heldout_rows"] == 10 and m["heldout_rows"] == 1
    assert m["skipped"] == {"no assistant turn": 1}
    assert m["train_truncated"] + m["heldout_truncated"] == 5  # the long answers
    first = json.loads((tmp_path / "out" / "train.jsonl").read_text().splitlines()[0])
    assert set(first) == {"id", "category", "messages"} and first["messages"][-1]["role"] == "assistant"
    import torch

    t = torch.load(tmp_path / "out" / "train_tokens.pt")
    assert t["input_ids"].shape == (9, 64) and t["loss_mask"].shape == (9, 64)


def test_conversations_without_a_labelled_token_are_counted_and_none_at_all_refused(tmp_path, tiny_model_dir):
    long = " ".join(["word"] * 100)
    rows = [{"messages": [{"role": "user", "content": long if i % 2 else f"q{i}"}, {"role": "assistant", "content": "ok"}]}
            for i in range(10)]
    _write(tmp_path / "c.jsonl", rows)
    m = data.run(_ctx(tmp_path, tiny_model_dir, [{"kind": "jsonl", "path": "c.jsonl"}], seq_len=64))
    assert m["train_unlabelled"] + m["heldout_unlabelled"] == 5 and m["train_label_tokens"] > 0  # the long prompts' answers
    _write(tmp_path / "c.jsonl", [r for i, r in enumerate(rows) if i % 2])
    with pytest.raises(DataError, match=r"^no training conversation keeps a labelled token within data.seq_len=64"):
        data.run(_ctx(tmp_path, tiny_model_dir, [{"kind": "jsonl", "path": "c.jsonl"}], seq_len=64))


def test_a_source_the_chat_template_refuses_whole_is_named_with_the_templates_reason(tmp_path, tiny_model_dir):
    """Rows skipped for another reason first (a tool turn) do not stand in for the template's own words."""
    import shutil

    model = tmp_path / "strict"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text("{%- for m in messages %}{%- if m.role == 'system' %}{{ raise_exception("
                                               "'System role not supported') }}{%- endif %}{{- m.content }}{%- endfor %}")
    conf = json.loads((model / "tokenizer_config.json").read_text())
    conf.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(conf))
    answer = {"role": "assistant", "content": "Hello."}
    _write(tmp_path / "c.jsonl", [{"messages": [{"role": "tool", "content": "x"}, answer]},
                                  {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, answer]}])
    with pytest.raises(DataError, match=r"c.jsonl': the target's chat template refuses every row: System role not supported \(merge"):
        data.run(_ctx(tmp_path, model, [{"kind": "jsonl", "path": "c.jsonl"}]))


def test_stage_empty_dataset_is_an_error(tmp_path, tiny_model_dir):
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no usable conversation"):
        data.run(_ctx(tmp_path, tiny_model_dir, [{"kind": "jsonl", "path": "e.jsonl"}]))


def test_tokenizer_without_chat_template(tmp_path, tiny_model_dir):
    import shutil

    from trtspec.models import load_tokenizer

    model = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model)
    cfg_file = model / "tokenizer_config.json"
    conf = json.loads(cfg_file.read_text())
    conf.pop("chat_template", None)
    cfg_file.write_text(json.dumps(conf))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "x"}) + "\n")
    with pytest.raises(DataError, match="no chat template"):
        data.run(_ctx(tmp_path, model, [{"kind": "jsonl", "path": "c.jsonl"}]))
    # a base model trained on documents alone (the hint's "text source only"): its held-out documents' openings are
    # the prompts the train and validate stages measure the draft on
    (tmp_path / "d.txt").write_text("".join(f"the river {i} flows north past the old mill into the valley\n" for i in range(10)))
    m = data.run(_ctx(tmp_path, model, [{"kind": "text", "path": "d.txt"}], holdout_fraction=0.2))
    held = chat.prompt_rows(chat.read_rows(tmp_path / "out" / "heldout.jsonl"))
    assert m["train_rows"] == 8 and [len(r["messages"][0]["content"].split()) for r in held] == [6, 6]
    tok = load_tokenizer(model)
    assert chat.encode_prompt(tok, held[0]["messages"]) == tok(held[0]["messages"][0]["content"])["input_ids"]


def test_a_held_out_document_is_prompted_with_its_opening():
    """chat.prompt_rows: a document's first half (at most DOCUMENT_PROMPT_WORDS words, its spacing kept) as a user
    turn; one of fewer than 4 words, like a conversation without an answer, is left out."""
    rows = [chat.text_row("def f(x):\n    return x + 1\n\nprint(f(2))\n", "a"), chat.text_row("too short", "b"),
            chat.text_row(" ".join(map(str, range(500))), "c"), {"id": "d", "messages": [{"role": "user", "content": "q"}]}]
    got = chat.prompt_rows(rows)
    assert [r["id"] for r in got] == ["a", "c"] and got[0]["messages"] == [{"role": "user", "content": "def f(x):\n    return"}]
    assert got[1]["messages"][0]["content"].split() == [str(i) for i in range(chat.DOCUMENT_PROMPT_WORDS)]


def _talkative(model):
    """The tiny random model with an output head of its own: with its tied one it repeats its last input token, the
    generation prompt's newline, and every answer is whitespace (a regenerated row with an empty answer is dropped)."""
    import torch

    g = torch.Generator().manual_seed(0)
    head = model.get_output_embeddings()
    head.weight = torch.nn.Parameter(torch.randn(head.weight.shape, generator=g))
    return model


def hf_answers(model, tok, max_new: int, asked: list | None = None):
    """The data stage's HF answerer (batches of 4), recording the prompts it is asked."""
    from trtspec.answering import answer_hf

    def answer(prompts):
        if asked is not None:
            asked.extend(prompts)
        return answer_hf(model, prompts, max_new, {tok.eos_token_id}, tok.pad_token_id, 0.0, 4)

    return answer


def test_regenerate_resumes_after_a_kill(tmp_path, tiny_model_dir, tiny_prompts_file):
    from trtspec.models import load_model, load_tokenizer

    model, tok = _talkative(load_model(tiny_model_dir)), load_tokenizer(tiny_model_dir)
    prompts = chat.read_prompt_file(tiny_prompts_file, Counter())
    answers = tmp_path / "answers.jsonl"
    full = data.regenerate(prompts, tok, answers, hf_answers(model, tok, 3), print)
    assert len(full) == len(prompts) and all(r["messages"][-1]["role"] == "assistant" and r["messages"][-1]["content"] for r in full)
    assert {json.loads(x)["id"] for x in answers.read_text().splitlines()} == {p["id"] for p in prompts}
    # a kill after the first batch, mid-write of the second: the first batch is kept, the torn line ignored
    lines = answers.read_text().splitlines()
    answers.write_text("\n".join(lines[:4]) + "\n" + lines[4][:10])
    kept = {json.loads(x)["id"]: json.loads(x)["answer"] for x in lines[:4]}
    asked: list = []
    again = data.regenerate(prompts, tok, answers, hf_answers(model, tok, 3, asked), print)
    assert len(again) == len(prompts) and all(r["messages"][-1]["content"] == kept[r["id"]] for r in again if r["id"] in kept)
    # only the 2 unanswered prompts were asked again
    assert len(asked) == 2
    assert len([x for x in answers.read_text().splitlines() if x.startswith("{") and x.endswith("}")]) == 6


def test_regenerated_rows_train_on_the_targets_own_tokens(tmp_path, tiny_model_dir, tiny_prompts_file):
    """A regenerated row's tokens are the prompt and answer as the target wrote them, and the loss covers the answer
    exactly; re-tokenizing the decoded answer would not always give them back."""
    from trtspec.models import load_model, load_tokenizer

    model, tok = _talkative(load_model(tiny_model_dir)), load_tokenizer(tiny_model_dir)
    prompts = chat.read_prompt_file(tiny_prompts_file, Counter())
    rows = data.regenerate(prompts, tok, tmp_path / "answers.jsonl", hf_answers(model, tok, 5), print)
    assert len(rows) == len(prompts)
    prompts_ids = [chat.encode_prompt(tok, r["messages"][:-1]) for r in rows]
    answers = hf_greedy(model, prompts_ids, 5, {tok.eos_token_id}, tok.pad_token_id)
    for row, prompt, answer in zip(rows, prompts_ids, answers, strict=True):
        ids, mask, cut = chat.tokenize_row(row, tok, 512)
        assert ids == prompt + answer and not cut
        assert [t for t, m in zip(ids, mask, strict=True) if m] == answer
    # an answers file from before the tokens were kept: those prompts are answered again, not trusted
    (tmp_path / "old.jsonl").write_text(json.dumps({"id": prompts[0]["id"], "answer": "text only"}) + "\n")
    again = data.regenerate(prompts[:1], tok, tmp_path / "old.jsonl", hf_answers(model, tok, 5), print)
    assert again[0]["messages"][-1]["content"] != "text only" and again[0]["input_ids"] == rows[0]["input_ids"]


def test_conversations_can_be_answered_again_by_the_target(tmp_path, tiny_model_dir, monkeypatch):
    """data.sources[*].regenerate on a jsonl (or hf) source: the rows' own answers are dropped and the target answers
    the turns before them; the earlier turns are kept as the prompt."""
    from trtspec.models import load_model, load_tokenizer

    model, tok = _talkative(load_model(tiny_model_dir)), load_tokenizer(tiny_model_dir)
    monkeypatch.setattr(data, "answerer", lambda ctx, target, longest: hf_answers(model, tok, 4))
    _write(tmp_path / "c.jsonl", [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "FROM THE FILE"}]},
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                      {"role": "user", "content": "c"}, {"role": "assistant", "content": "FROM THE FILE"}]},
    ])
    kept = data.run(_ctx(tmp_path, tiny_model_dir, [{"kind": "jsonl", "path": "c.jsonl"}], holdout_fraction=0.0))
    assert kept["train_rows"] == 2
    rows = [json.loads(x) for x in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
    assert sorted(r["messages"][-1]["content"] for r in rows) == ["FROM THE FILE"] * 2

    (tmp_path / "out" / "train.jsonl").unlink()
    data.run(_ctx(tmp_path, tiny_model_dir, [{"kind": "jsonl", "path": "c.jsonl", "regenerate": True}], holdout_fraction=0.0))
    rows = sorted((json.loads(x) for x in (tmp_path / "out" / "train.jsonl").read_text().splitlines()),
                  key=lambda r: len(r["messages"]))
    prompts = [[{"role": "user", "content": "hi"}],
               [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]]
    assert [r["messages"][:-1] for r in rows] == prompts
    answers = hf_greedy(model, [chat.encode_prompt(tok, p) for p in prompts], 4, {tok.eos_token_id}, tok.pad_token_id)
    assert [r["input_ids"][-len(a):] for r, a in zip(rows, answers, strict=True)] == answers
    assert all(r["messages"][-1]["content"] != "FROM THE FILE" for r in rows)


@pytest.mark.parametrize("attention", ["sdpa", "matmul"])
def test_batched_generate_matches_one_prompt_at_a_time(tiny_model_dir, tiny_prompts_file, attention):
    """Left padding changes nothing (each answer equals its unbatched greedy answer), with transformers' SDPA and
    with the data stage's matmul attention, and the output head gets a contiguous input (load_model's hook: the
    strided last-position slice costs 250x at batch 64 in bf16)."""
    from trtspec.models import load_model, load_tokenizer, use_matmul_attention

    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    if attention == "matmul":
        use_matmul_attention(model)
    contiguous = []
    model.get_output_embeddings().register_forward_pre_hook(lambda _m, args: contiguous.append(args[0].is_contiguous()))
    prompts = [chat.encode_prompt(tok, p["messages"]) for p in chat.read_prompt_file(tiny_prompts_file, Counter())]
    eos, pad = {tok.eos_token_id}, tok.pad_token_id
    batched = hf_greedy(model, prompts, 6, eos, pad)
    assert batched == [hf_greedy(model, [p], 6, eos, pad)[0] for p in prompts]
    assert contiguous and all(contiguous)


def test_matmul_attention_equals_sdpa(tiny_model_dir):
    """Same logits as SDPA on a left-padded batch (prefill and a cached decode step), padding rows included: they
    see nothing, and must stay finite so that no NaN reaches the real rows through the next layer. And on one
    unpadded prompt, for which transformers passes no mask at all (causal is implied)."""
    import torch

    from trtspec.models import MATMUL_ATTENTION, load_model, load_tokenizer, use_matmul_attention

    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    tok.padding_side = "left"
    enc = tok(["a longer prompt with several more words in it", "short"], return_tensors="pt", padding=True)
    assert int((enc["attention_mask"] == 0).sum()) > 3
    step = {"input_ids": torch.tensor([[5], [7]]), "attention_mask": torch.cat((enc["attention_mask"], torch.ones(2, 1, dtype=torch.long)), 1)}
    real = enc["attention_mask"].bool()  # padding positions' logits are garbage under either attention

    def logits(attention: str) -> list:
        model.set_attn_implementation("sdpa") if attention == "sdpa" else use_matmul_attention(model)
        with torch.no_grad():
            first = model(**enc, use_cache=True)
            nxt = model(**step, past_key_values=first.past_key_values)
            alone = model(**tok(["one prompt without padding"], return_tensors="pt"))
        return [first.logits[real], nxt.logits, alone.logits]

    for a, b in zip(logits("sdpa"), logits(MATMUL_ATTENTION), strict=True):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_matmul_attention_on_cpu_is_undone_after(tiny_model_dir):
    """The train stage answers its held-out prompts with the matmul attention, then computes states with the
    model's own attention again: the switch is scoped, and undone after an error too."""
    from trtspec.models import MATMUL_ATTENTION, load_model, matmul_attention_on_cpu

    model = load_model(tiny_model_dir)
    prior = model.config._attn_implementation
    assert prior != MATMUL_ATTENTION
    with matmul_attention_on_cpu(model):
        assert model.config._attn_implementation == MATMUL_ATTENTION
        assert model.model.layers[0].self_attn.config._attn_implementation == MATMUL_ATTENTION
    assert model.config._attn_implementation == prior
    with pytest.raises(KeyError), matmul_attention_on_cpu(model):
        raise KeyError
    assert model.model.layers[0].self_attn.config._attn_implementation == prior


def test_demo_prompts_are_varied():
    rows = [json.loads(x) for x in (Path(__file__).parents[2] / "build_configs/prompts/demo_prompts.jsonl").read_text().splitlines()]
    cats = Counter(r["category"] for r in rows)
    assert len(rows) >= 300 and len({r["prompt"] for r in rows}) == len(rows)
    assert set(cats) == {"chat", "explanation", "lists", "code", "math", "writing"} and min(cats.values()) >= 30


def test_demo_prompts_are_what_the_generator_writes():
    """build_configs/prompts/demo_prompts.jsonl is scripts/make_demo_prompts.py's output at its defaults (no hand
    edits that the script would lose), and the script is deterministic."""
    import runpy

    root = Path(__file__).parents[2]
    gen = runpy.run_path(str(root / "scripts/make_demo_prompts.py"))
    for name, build in (("demo_prompts", gen["build"]), ("broad_prompts", gen["build_broad"])):
        shipped = [json.loads(x) for x in (root / f"build_configs/prompts/{name}.jsonl").read_text().splitlines()]
        assert build(len(shipped), 0) == shipped, name


def test_broad_prompts_hand_over_passages_and_share_none_with_the_unseen_suite():
    """The broad set's twelve kinds, a passage in a quarter of its prompts; build_configs/prompts/unseen_prompts.jsonl
    (written by hand, measured on as prompts unlike the training ones) shares no prompt with it or the demo set."""
    root = Path(__file__).parents[2] / "build_configs/prompts"
    broad = [json.loads(x) for x in (root / "broad_prompts.jsonl").read_text().splitlines()]
    cats = Counter(r["category"] for r in broad)
    assert len(cats) == 12 and min(cats.values()) >= 100
    assert 0.2 <= sum("\n\n" in r["prompt"] for r in broad) / len(broad) <= 0.3
    unseen = [json.loads(x) for x in (root / "unseen_prompts.jsonl").read_text().splitlines()]
    texts = {m["content"] for r in unseen for m in r.get("messages", [])} | {r["prompt"] for r in unseen if "prompt" in r}
    demo = {json.loads(x)["prompt"] for x in (root / "demo_prompts.jsonl").read_text().splitlines()}
    assert not texts & ({r["prompt"] for r in broad} | demo)
    assert Counter(r["category"] for r in unseen) == {c: 8 for c in ("extraction", "summarization", "roleplay", "reasoning",
                                                                      "stem", "humanities", "rewriting", "multiturn")}


def test_bench_regenerate_reports_each_variant(tiny_model_dir, tiny_prompts_file, tmp_path):
    """scripts/bench_regenerate.py times the data stage's answerers side by side, in one run (HF variants here; the
    engine variants need vLLM and minutes)."""
    import subprocess
    import sys

    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"model": {"source": str(tiny_model_dir)}, "data": {
        "sources": [{"kind": "regenerate", "path": str(tiny_prompts_file)}], "max_new_tokens": 4}}))
    script = Path(__file__).parents[2] / "scripts" / "bench_regenerate.py"
    out = subprocess.run([sys.executable, str(script), str(cfg), "--prompts", "4", "--repeats", "1", "--json",
                          "--variant", "hf-sdpa:2", "--variant", "hf-matmul:4"], capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    assert [r["variant"] for r in rows] == ["hf-sdpa:2", "hf-matmul:4"]
    assert rows[0]["ratio"] == 1.0 and all(r["tokens_per_s"] > 0 for r in rows)
    assert rows[1]["same_answers_as_first"] == 4  # the same greedy answers, either attention


def test_dropped_conversations_are_counted_by_their_real_reason():
    from collections import Counter

    from trtspec.chat import conversations_from_rows

    user = {"role": "user", "content": "Hi"}
    answer = {"role": "assistant", "content": "Hello!"}
    rows = [
        {"messages": [{"role": "developer", "content": "Be brief."}, user, answer]},  # kept: developer = system
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}, answer]},
        {"messages": [user, {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},  # a call of nothing
                      {"role": "tool", "content": "42"}, answer]},
        {"messages": [user, {"role": "tool", "content": "42"}, answer]},
        {"messages": [user, {"role": "assistant", "content": None}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, answer]},
        {"messages": [{"role": "narrator", "content": "Once"}, answer]},
        {"messages": [user]},
        {"messages": [user, {"role": "assistant", "content": "  "}]},
    ]
    skips: Counter = Counter()
    kept = conversations_from_rows(rows, "t", skips)
    assert [c["messages"][0] for c in kept] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert skips == Counter({"a tool call without a function name, or with arguments that are no JSON object": 1,
                             "a tool turn that answers no tool call": 1, "null content": 1, "non-text content parts": 1, "role 'narrator'": 1,
                             "no assistant turn": 1, "an empty answer": 1})


def test_long_context_rows_put_earlier_conversations_before_the_targets_own_answer(tiny_model_dir):
    """data.context_tokens: the drawn share of rows, each prompt after other rows' own turns within the drawn length,
    the answer the target's own tokens with the loss on them alone; the other rows as they were."""
    from trtspec.models import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    rows = []
    for i in range(20):
        prompt = [{"role": "user", "content": f"Name river number {i}."}]
        answer = tok(f" River {i} flows north.", add_special_tokens=False)["input_ids"]
        ids = chat.encode_prompt(tok, prompt)
        rows.append({"id": str(i), "category": "chat", "messages": prompt + [{"role": "assistant", "content": "x"}],
                     "input_ids": ids + answer, "label_start": len(ids)})
    out = chat.long_context_rows(rows, tok, 300, 0.5, seed=1)
    longer = [i for i, r in enumerate(out) if r.get("context_turns")]
    assert len(longer) >= 5 and sum(r is rows[i] for i, r in enumerate(out)) == 10  # 10 drawn; a short draw adds none
    for i in longer:
        row, own = out[i], rows[i]
        assert chat.own_turns(row) == own["messages"] and row["context_turns"] == len(row["messages"]) - 2
        assert own["messages"] not in [row["messages"][j : j + 2] for j in range(0, row["context_turns"], 2)]  # not itself
        prompt = chat.encode_prompt(tok, row["messages"][:-1])
        assert row["label_start"] == len(prompt) <= 300 and row["input_ids"][: len(prompt)] == prompt
        ids, mask, _ = chat.tokenize_row(row, tok, 512)
        assert [t for t, m in zip(ids, mask, strict=True) if m] == own["input_ids"][own["label_start"]:]
    # as history, a lengthened row gives only its own turns
    again, _ = chat.with_history({"messages": [{"role": "user", "content": "q"}]}, [out[longer[0]]], tok, 10_000)
    assert again["messages"][:2] == rows[longer[0]]["messages"]


def test_long_context_rows_keep_one_system_turn_first(tiny_model_dir):
    """The earlier conversations go after the row's own system turn, without theirs: a template that takes a system
    turn first only (Llama's, Mistral's, Gemma's, Phi-3's) renders every lengthened row; it refused each one with a
    system turn in its history, in one line after the data stage's minutes."""
    from trtspec.models import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
                         "{{ raise_exception('System role only first') }}{% endif %}<|{{ m['role'] }}|>{{ m['content'] }}"
                         "<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    system = [{"role": "system", "content": f"Answer as pirate {i}."} for i in range(2)]
    rows = [{"id": str(i), "messages": system[i % 2 :][:1] * (i % 3 != 0) + [
        {"role": "user", "content": f"Name river number {i}."}, {"role": "assistant", "content": f"River {i}."}]}
        for i in range(12)]
    out = chat.long_context_rows(rows, tok, 200, 1.0, seed=1)
    assert sum(1 for r in out if r.get("context_turns")) >= 6
    for row, own in zip(out, rows, strict=True):
        assert chat.own_turns(row) == own["messages"]
        assert [m["role"] == "system" for m in row["messages"]] == [m["role"] == "system" for m in own["messages"][:1]] + [
            False] * (len(row["messages"]) - 1)
        chat.tokenize_row(row, tok, 512)


def test_stage_lengthens_training_rows_only(tmp_path, tiny_model_dir):
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "word " * 5}]} for i in range(20)]
    _write(tmp_path / "c.jsonl", rows)
    m = data.run(_ctx(tmp_path, tiny_model_dir, [{"kind": "jsonl", "path": "c.jsonl"}], seq_len=200, context_tokens=150,
                      context_share=0.5, holdout_fraction=0.2))
    assert m["train_long_context_rows"] >= 4 and "after earlier conversations" in m["headline"]
    held = [json.loads(x) for x in (tmp_path / "out" / "heldout.jsonl").read_text().splitlines()]
    assert all(len(r["messages"]) == 2 and "context_turns" not in r for r in held)
    assert m["train_truncated"] == 0


def test_long_context_must_fit_the_sequence_and_the_window(tmp_path, tiny_model_dir):
    from transformers import AutoConfig

    from trtspec.errors import ConfigError

    src = [{"kind": "jsonl", "path": "c.jsonl"}]
    with pytest.raises(Exception, match=r"data.context_tokens 100 with data.max_new_tokens 4 needs data.seq_len >= 104"):
        _ctx(tmp_path, tiny_model_dir, src, seq_len=64, context_tokens=100)
    ctx = _ctx(tmp_path, tiny_model_dir, src, seq_len=4096, context_tokens=2000)
    with pytest.raises(ConfigError, match=r"data.context_tokens 2000: with data.max_new_tokens 4 it needs 2004 tokens, more than the target's window of 1024"):
        data.preflight(ctx.cfg, AutoConfig.from_pretrained(tiny_model_dir))


def test_with_document_puts_a_long_text_before_the_question_within_the_bin(tiny_model_dir):
    from trtspec.models import load_tokenizer
    from trtspec.suites import builtin_documents

    tok = load_tokenizer(tiny_model_dir)
    docs = builtin_documents()
    assert len(docs) == 15 and min(map(len, docs)) > 4000 and not any("\nFILE\n" in d for d in docs)
    prompts = [{"id": str(i), "messages": [{"role": "user", "content": f"What does section {i} say?"}]} for i in range(3)]
    for tokens in (40, 300, 900):
        for (row, n), p in zip(chat.at_context(prompts, docs, tok, tokens), prompts, strict=True):
            assert n == len(chat.encode_prompt(tok, row["messages"])) <= tokens
            last = row["messages"][-1]["content"]
            assert last.endswith(p["messages"][0]["content"])
            assert last.startswith(chat.DOCUMENT_INTRO) == (tokens > 40) and (tokens < 900 or n > 850)
    short, _ = chat.with_document(prompts[0], docs, tok, 300)
    other, _ = chat.at_context(prompts[:2], docs, tok, 300)[1]
    assert short["messages"] != other["messages"]  # each prompt starts at a document of its own


def test_documents_file_reader(tmp_path):
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "First document."}) + "\n" + json.dumps({"title": "x"}) + "\n")
    skips = Counter()
    assert chat.read_documents(tmp_path / "d.jsonl", skips) == ["First document."]
    assert skips == {"row without a 'text' field": 1}
    (tmp_path / "d.txt").write_text("one\n\ntwo\n")
    assert chat.read_documents(tmp_path / "d.txt", Counter()) == ["one", "two"]
