"""transformers 4.x reads bundle/target/config.json as transformers 5 does.

The exporter writes transformers 5's keys (rope_parameters, dtype) and the legacy ones 4.x reads (rope_theta,
rope_scaling, torch_dtype). A real transformers 4.x runs in a subprocess from its own folder, put first on PYTHONPATH
(TRTSPEC_TRANSFORMERS4; the venv keeps 5.x). scripts/setup.sh installs it with:

    pip install --no-deps --target .venv/transformers4 transformers==4.57.6 huggingface_hub==0.36.2 tokenizers==0.22.2
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LEGACY_KEYS = ("rope_theta", "rope_scaling", "torch_dtype")

READ_CONFIG = """
import json, sys
import transformers
from transformers import AutoConfig
c = AutoConfig.from_pretrained(sys.argv[1])
chat = None
if len(sys.argv) > 2:  # the tokenizer too, as an engine on transformers 4.x loads it
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    chat = list(tok.apply_chat_template(json.loads(sys.argv[2]), add_generation_prompt=True, tokenize=True))
print(json.dumps({
    "chat_ids": chat,
    "version": transformers.__version__,
    "file": transformers.__file__,
    "rope_theta": c.rope_theta,
    "rope_scaling": c.rope_scaling,
    "torch_dtype": None if c.torch_dtype is None else str(c.torch_dtype).removeprefix("torch."),
    "num_hidden_layers": c.num_hidden_layers,
    "hidden_size": c.hidden_size,
}))
"""


@pytest.fixture(scope="module")
def transformers4() -> Path:
    where = os.environ.get("TRTSPEC_TRANSFORMERS4")
    if not where:
        pytest.skip("TRTSPEC_TRANSFORMERS4 is not set (the folder holding transformers 4.x: scripts/setup.sh "
                    "installs it into .venv/transformers4)")
    path = Path(where)
    if not (path / "transformers" / "__init__.py").is_file():
        pytest.skip(f"TRTSPEC_TRANSFORMERS4={where} holds no transformers package (run scripts/setup.sh)")
    return path


def read_with_transformers4(transformers4: Path, folder: Path, messages: list | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(transformers4), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    args = [json.dumps(messages)] if messages else []
    proc = subprocess.run([sys.executable, "-c", READ_CONFIG, str(folder), *args], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["version"].startswith("4."), got  # the 4.x from the folder, not the venv's 5.x
    assert Path(got["file"]).resolve().is_relative_to(transformers4.resolve()), got
    return got


def rope_of_transformers4(got: dict) -> dict:
    """4.x's rope_theta + rope_scaling in transformers 5's rope_parameters shape."""
    scaling = dict(got["rope_scaling"] or {})
    scaling.setdefault("rope_type", scaling.pop("type", "default"))
    return {"rope_theta": got["rope_theta"], **scaling}


@pytest.mark.interop
def test_transformers4_reads_the_target_config_as_transformers5(ci_bundle, transformers4):
    from transformers import AutoConfig

    from trtspec.models import load_tokenizer

    target = ci_bundle / "target"
    raw = json.loads((target / "config.json").read_text())
    messages = [{"role": "user", "content": "Name three colors."}]
    got = read_with_transformers4(transformers4, target, messages)
    # the tokenizer loads too (its class under its transformers-4 name) and encodes a chat as transformers 5 does
    five_tok = load_tokenizer(target)
    assert got["chat_ids"] == list(five_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                                return_dict=False))

    assert got["rope_theta"] == raw["rope_parameters"]["rope_theta"] == 100000.0
    assert got["torch_dtype"] == raw["dtype"]

    five = AutoConfig.from_pretrained(target)
    assert rope_of_transformers4(got) == dict(five.rope_parameters)
    assert got["torch_dtype"] == str(five.dtype).removeprefix("torch.")
    assert got["num_hidden_layers"] == five.num_hidden_layers == raw["num_hidden_layers"]
    assert got["hidden_size"] == five.hidden_size == raw["hidden_size"]


@pytest.mark.interop
def test_without_the_legacy_keys_transformers4_falls_back_to_the_default_rope(ci_bundle, transformers4, tmp_path):
    """The check above can fail: transformers 4.x ignores rope_parameters, so without rope_theta it uses 10000."""
    from transformers import AutoConfig

    raw = json.loads((ci_bundle / "target" / "config.json").read_text())
    stripped = {k: v for k, v in raw.items() if k not in LEGACY_KEYS}
    assert set(raw) - set(stripped) == set(LEGACY_KEYS)
    (tmp_path / "config.json").write_text(json.dumps(stripped, indent=2))

    got = read_with_transformers4(transformers4, tmp_path)
    assert got["rope_theta"] == 10000.0 != raw["rope_parameters"]["rope_theta"]
    assert got["rope_scaling"] is None
    # transformers 5 still reads the real value from rope_parameters: only 4.x needs the legacy keys
    assert AutoConfig.from_pretrained(tmp_path).rope_parameters["rope_theta"] == raw["rope_parameters"]["rope_theta"]
