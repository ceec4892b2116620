"""scripts/check_template_masks.py: what the data stage labels in conversations a chat template renders."""

from __future__ import annotations

import json
import sys

import pytest
from stagekit import TOOL_TEMPLATE, load_script

from trtspec.errors import DataError

CHATML = ("{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def test_the_script_labels_answers_and_names_a_template_that_hides_them(tmp_path, monkeypatch, capsys, demo_model_dir):
    script = load_script("check_template_masks")
    (tmp_path / "chatml.jinja").write_text(CHATML)
    # answers rendered otherwise than written, and a generation prompt no turn shows: no labels can be found for them
    (tmp_path / "shouting.jinja").write_text(CHATML.replace("m.content", "m.content | upper").replace(
        "'<|im_start|>assistant\\n' }}", "'<|im_start|>assistant\\n<think>\\n' }}"))
    (tmp_path / "tools.jinja").write_text(TOOL_TEMPLATE)
    (tmp_path / "strict.jinja").write_text("{{ raise_exception('System role not supported') }}")
    monkeypatch.setattr(sys, "argv", ["x", str(tmp_path), str(demo_model_dir), "--json"])
    assert script.main() == 1
    got = json.loads(capsys.readouterr().out)
    assert got["chatml"]["system, two turns"] == {"labelled": ["A1 blue.<|im_end|>\n", "A2 red.<|im_end|>\n"],
                                                  "verdict": "right"}
    hidden = "tool calls it does not show (a template for chat alone: serve a tool-calling one)"
    for template in ("chatml", demo_model_dir.name):  # each shows an answer's text alone, not its tool calls
        assert got[template].pop("agent") == {"refused": hidden}
    assert {c["verdict"] for c in got[demo_model_dir.name].values()} == {"right"}
    assert got["tools"]["agent"] == {"verdict": "right", "labelled": [  # the call and the answer, not the tool's output
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n', "A1 take one.<|im_end|>\n"]}
    long = got["chatml"]["after the others"]  # data.context_tokens' row: every answer of the chat labelled
    assert long["verdict"] == "right" and len(long["labelled"]) == 6 and long["labelled"][-1] == "A3 green.<|im_end|>\n"
    assert got["shouting"]["one turn"] == {"labelled": [], "verdict": "'A1 blue is one.' not labelled"}
    assert "System role not supported" in got["strict"]["one turn"]["refused"]
    monkeypatch.setattr(sys, "argv", ["x", str(tmp_path / "none.jinja")])
    with pytest.raises(DataError, match=r"is neither a model folder nor a .jinja file"):
        script.main()
