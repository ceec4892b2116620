"""scripts/make_agent_requests.py: an agent's chat requests (tools offered, calls and their outputs), read back as
trtspec adapt reads traffic and rendered with the demo model's tool-calling template (build_configs/templates)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from stagekit import load_script

from trtspec.traffic import read_traffic

TEMPLATE = Path(__file__).parents[2] / "build_configs" / "templates" / "smollm2_tools.jinja"


def test_agent_requests_are_read_as_traffic_with_their_tools_and_render_their_calls(tmp_path, monkeypatch, demo_model_dir):
    from trtspec.chat import render
    from trtspec.models import load_tokenizer

    script = load_script("make_agent_requests")
    for name in ("a", "b"):
        monkeypatch.setattr(sys, "argv", ["x", "--n", "40", "--seed", "3", "--out", str(tmp_path / f"{name}.jsonl")])
        script.main()
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()  # the same seed, the same file
    tok = load_tokenizer(demo_model_dir, template=TEMPLATE)
    rows, skips, fmt = read_traffic(tmp_path / "a.jsonl", tok=tok)
    assert fmt == "chat" and not skips and len(rows) == 40 and {r["category"] for r in rows} == {"agent"}
    after_call = [r for r in rows if r["messages"][-1]["role"] == "tool"]
    assert 10 < len(after_call) < 30 and all(2 <= len(r["tools"]) <= 4 for r in rows)
    for r in after_call:  # the call offered, shown as the model would write it, its output after it
        call = r["messages"][-2]["tool_calls"][0]["function"]
        assert call["name"] in {t["function"]["name"] for t in r["tools"]}
        text = render(tok, r["messages"], r["tools"], True)
        assert f'<tool_call>\n{json.dumps({"name": call["name"], "arguments": call["arguments"]})}\n</tool_call>' in text
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    plain = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert render(tok, plain) == render(load_tokenizer(demo_model_dir), plain)  # chat as the model's own renders it
