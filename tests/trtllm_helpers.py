"""Helpers for the TensorRT-LLM adapter tests: a config, a minimal bundle, the fake tensorrt_llm on sys.path."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from trtspec.config import config_from_dict

CONTRACT = json.loads((Path(__file__).parent / "contracts" / "trtllm_api.json").read_text())
# defined here, not imported from a conftest: tests/interop has a conftest.py of its own, and `import conftest`
# would get whichever of the two was imported first
FAKE_TRTLLM = Path(__file__).parent / "fake_trtllm"


def make_cfg(tmp: Path, model: str = "demo:smollm2-135m-instruct", **sections: dict):
    """A config for the engine and serving tests: `sections` as in the YAML, e.g. serve={"max_batch_size": 16}."""
    raw = {"model": {"source": model}, "data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}, **sections}
    return config_from_dict(raw, base_dir=tmp)


def make_bundle(bundle: Path, cfg, target_from: Path | None = None, info: dict | None = None) -> Path:
    """target/ (a real HF folder when target_from is given, else config.json only), draft/ (EAGLE-3 config), serving files."""
    from trtspec.deploy.serving import write_serving_files
    from trtspec.draft_families import family

    bundle.mkdir(parents=True, exist_ok=True)
    if target_from is not None:
        shutil.copytree(target_from, bundle / "target")
    else:
        (bundle / "target").mkdir()
        (bundle / "target" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (bundle / "draft").mkdir()
    (bundle / "draft" / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 64, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}))
    (bundle / "draft" / "model.safetensors").write_bytes(b"\0" * 8)
    info = info or {"target_dtype": "bfloat16", "draft_dtype": "bfloat16", "quant_format": "none", "aux_layers": [0, 1, 2]}
    write_serving_files(bundle, cfg, info, family(cfg.draft.method))
    return bundle


def purge_trtllm() -> None:
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]


@pytest.fixture
def fake_trtllm(monkeypatch):
    """use(version) puts the test double of tensorrt_llm on sys.path at that version (fresh imports)."""

    def use(version: str = "1.2.0") -> None:
        purge_trtllm()
        monkeypatch.setenv("TRTSPEC_FAKE_TRTLLM_VERSION", version)
        monkeypatch.syspath_prepend(str(FAKE_TRTLLM))

    purge_trtllm()
    yield use
    purge_trtllm()


def trtllm_eagle31_gaps(draft: Path) -> list[str]:
    """Where an exported EAGLE-3.1 draft departs from what TensorRT-LLM's EAGLE-3 loader reads (CONTRACT['eagle3_draft'],
    main): the switches top-level booleans in config.json, and one fc_norm.{i}.weight of the target's width per
    captured layer when fc_norm is on."""
    from safetensors import safe_open

    contract = CONTRACT["eagle3_draft"]
    cfg = json.loads((draft / "config.json").read_text())
    gaps = [f"{key} is {cfg[key]!r}, not a boolean" for key in contract["eagle31_switches"]
            if key in cfg and not isinstance(cfg[key], bool)]
    gaps += [f"{key} is nested in eagle_config" for key in contract["eagle31_switches"] if key in cfg.get("eagle_config", {})]
    if cfg.get("fc_norm"):
        with safe_open(str(draft / "model.safetensors"), "pt") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
        width = cfg.get("target_hidden_size", cfg["hidden_size"])
        for i in range(len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])):
            name = contract["fc_norm_weight"].format(i=i)
            if shapes.get(name) != (width,):
                gaps.append(f"{name}: {shapes.get(name, 'missing')}, expected ({width},)")
    return gaps
