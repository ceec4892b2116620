"""The draft families' registry (trtspec.draft_families): an exported draft is loaded by the family that declares its
architecture, and a draft no family declares is refused by name, never loaded as another; each family is one object in
its own package implementing trtspec.draft_family.DraftFamily."""

from __future__ import annotations

import json

import pytest

from trtspec import dflash, eagle
from trtspec.draft_families import DRAFT_FAMILIES, draft_method, family
from trtspec.draft_family import DraftFamily
from trtspec.errors import ArtifactError


def draft(tmp_path, **cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize("archs, method", [
    (["LlamaForCausalLMEagle3"], "eagle3"),
    (["DFlashDraftModel"], "dflash"),
    (["Qwen3DSparkModel", "DFlashDraftModel"], "dflash"),  # a DSpark export names vLLM's and SGLang's class first
    (["DFlash2DraftModel"], "dflash2"),
])
def test_each_declared_architecture_loads_as_its_family(tmp_path, archs, method):
    assert draft_method(draft(tmp_path, architectures=archs)) == method


def test_an_eagle3_checkpoint_as_its_authors_publish_it_is_eagle3(tmp_path):
    cfg = {"architectures": ["LlamaForCausalLM"], "draft_vocab_size": 32000, "eagle_config": {}}
    assert draft_method(draft(tmp_path, **cfg)) == "eagle3"


@pytest.mark.parametrize("archs", [["MedusaModel"], ["LlamaForCausalLM"], []])
def test_an_undeclared_draft_is_refused_by_name(tmp_path, archs):
    with pytest.raises(ArtifactError, match="which no draft family loads"):
        draft_method(draft(tmp_path, architectures=archs))


def test_every_family_declares_its_architectures_apart_from_the_others():
    declared = [a for m in DRAFT_FAMILIES for a in family(m).architectures]
    assert set(DRAFT_FAMILIES) == {"eagle3", "dflash", "dflash2"} and len(declared) == len(set(declared))
    assert family("eagle3").architectures == eagle.ARCHITECTURES  # declared once, read by the family and its runtime
    assert family("dflash").architectures == dflash.ARCHITECTURES


# what each family must provide itself (the protocol's bodies are docstrings); the rest is shared
OWN = ("check_convert", "convert", "build", "save_head", "load_head", "train_forward", "state_layers",
       "drafts", "check_export", "export_draft", "write_readme", "load_drafter")


@pytest.mark.parametrize("method", sorted(DRAFT_FAMILIES))
def test_each_family_is_one_object_in_its_own_package_implementing_the_interface(method):
    fam = family(method)
    assert fam.name == method and type(fam).__module__ == f"trtspec.{ {'eagle3': 'eagle'}.get(method, method)}.family"
    onnx = ("export_onnx", "format_onnx_check") if fam.exports_onnx else ()
    missing = [m for m in OWN + onnx if getattr(type(fam), m) is getattr(DraftFamily, m)]
    assert not missing, f"{method} does not implement {missing}"
    for attr in ("title", "config_file", "head_file", "offline_key", "module_attr"):
        assert isinstance(getattr(fam, attr), str) and getattr(fam, attr)
    assert fam.sections and fam.architectures
