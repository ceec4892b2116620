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


def test_an_eagle3_vocabulary_grows_with_the_labels_it_lacks(tmp_path):
    """draft.grow_vocab: the most frequent labels the earlier head cannot draft join its vocabulary; d2t stays
    ascending, each old output row moves with its token, the new rows start at zero (the draft proposes what it did),
    the config says the new size, and the coverage before and after is the labels' share each vocabulary holds."""
    import torch
    from safetensors.torch import load_file, save_file

    old = torch.tensor([0, 2, 5, 7])
    rows = torch.arange(4 * 3, dtype=torch.float32).reshape(4, 3) + 1
    save_file({"d2t": old - torch.arange(4), "lm_head.weight": rows, "fc.weight": torch.ones(3, 9)},
              tmp_path / "head_init.safetensors")
    (tmp_path / "eagle_config.json").write_text(json.dumps({"eagle_architecture_config": {"draft_vocab_size": 4}}))
    counts = torch.tensor([5, 0, 5, 9, 0, 5, 0, 5, 0, 3, 1])  # 3 and 9 lack, 10 rarer still
    metrics = family("eagle3").grow_vocab(tmp_path, counts, 2, lambda *a: None)
    w = load_file(tmp_path / "head_init.safetensors")
    ids = torch.arange(6) + w["d2t"]
    assert ids.tolist() == [0, 2, 3, 5, 7, 9]
    assert torch.equal(w["lm_head.weight"][[0, 1, 3, 4]], rows) and not w["lm_head.weight"][[2, 5]].any()
    assert torch.equal(w["fc.weight"], torch.ones(3, 9))
    assert json.loads((tmp_path / "eagle_config.json").read_text())["eagle_architecture_config"]["draft_vocab_size"] == 6
    assert metrics["draft_vocab_grown"] == {"from": 4, "to": 6, "coverage_before": round(20 / 33, 4),
                                            "coverage_after": round(32 / 33, 4)}
    assert not family("dflash").grows_vocab and not family("dflash2").grows_vocab
