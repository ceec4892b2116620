"""The draft families the runtime loads, told apart by the architectures an exported draft's config.json names: each
family declares its own (DraftFamily.architectures)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.draft_families import DRAFT_FAMILIES, family
from trtspec.errors import ArtifactError
from trtspec.runtime.model import read_config


def draft_family(draft_dir: Path) -> str:
    """Which draft family (its draft.method) an exported draft folder holds, from the architectures its config.json
    names (DraftFamily.architectures); an EAGLE-3 checkpoint as its authors publish it (LlamaForCausalLM with a
    draft_vocab_size and an eagle_config) is EAGLE-3. A draft no family declares is refused by name, never loaded as
    another."""
    cfg = read_config(draft_dir)
    archs = cfg.get("architectures") or []
    declared = {a: method for method in DRAFT_FAMILIES for a in family(method).architectures}
    if known := [declared[a] for a in archs if a in declared]:
        return known[0]
    if "draft_vocab_size" in cfg and "eagle_config" in cfg:
        return "eagle3"
    raise ArtifactError(f"'{draft_dir}' holds a draft of architectures {archs}, which no draft family loads",
                        f"trtspec loads {', '.join(sorted(declared))}")


def speculative_method(draft_dir: Path) -> str:
    """An exported draft's speculative method as the engines name it: its family's (eagle3, dflash, dflash2), or dspark
    (a DFlash backbone with a Markov head, dflash_config.projector_type dspark)."""
    if (read_config(draft_dir).get("dflash_config") or {}).get("projector_type") == "dspark":
        return "dspark"
    return draft_family(draft_dir)


def load_drafter(draft_dir: Path, target: Any, weights: str = "auto", settings: Any = None) -> Any:
    """The runtime drafter for an exported draft, by the family that declares its architecture (an unknown one is
    refused by name: draft_family). weights: how the draft's product weights are stored, auto (bfloat16 where timed
    faster) | float32 | bfloat16; settings: runtime.settings.RuntimeSettings (default: as the target runs)."""
    return family(draft_family(draft_dir)).load_drafter(draft_dir, target, weights=weights, settings=settings)
