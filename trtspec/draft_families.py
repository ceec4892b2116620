"""The draft families trtspec trains and ships, by draft.method, and what is looked up by a family's name or by the
architecture an exported draft declares.

    eagle3   EAGLE-3 head: one token per pass, chained k times           trtspec.eagle.family.EAGLE3
    dflash   DFlash block drafter: block_size - 1 tokens in one pass      trtspec.dflash.family.DFLASH
             (dflash.projector: dspark: DSpark, block_size tokens, each biased by a Markov head from the one before)
    dflash2  DFlash2: DFlash's block with causal convolutions and a       trtspec.dflash2.family.DFLASH2
             candidate selector

A family is one package of what is its own, implementing trtspec.draft_family.DraftFamily. This registry imports
each, so it stands above them: the stages, the pipeline and the CLI look families up here; what stands below the
families (the config, the runtime, the engines, deploy) is handed the family, or what it needs of it, by its caller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.dflash.family import DFLASH
from trtspec.dflash2.family import DFLASH2
from trtspec.draft_family import DraftFamily
from trtspec.eagle.family import EAGLE3
from trtspec.errors import ArtifactError, ConfigError

DRAFT_FAMILIES: dict[str, DraftFamily] = {f.name: f for f in (EAGLE3, DFLASH, DFLASH2)}  # draft.method -> its family
# the build config's sections the families read: in the convert and train stages' READS, so a new family's section
# keys their work without touching them
SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(s for f in DRAFT_FAMILIES.values() for s in f.sections))


def family(method: str) -> DraftFamily:
    """The family of draft.method."""
    return DRAFT_FAMILIES[method]


def check_recipe(cfg: Any, source: str = "the build config") -> None:
    """The draft family's rules of a build config (DraftFamily.check_config), then a section another family reads,
    set (to other than its default) while draft.method is this one: refused, naming the first key. Run before any
    stage (the pipeline's preflight) and wherever the CLI reads a recipe."""
    own = family(cfg.draft.method)
    try:
        own.check_config(cfg)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None
    for other in DRAFT_FAMILIES.values():
        for name in (s for s in other.sections if s not in own.sections):
            section = getattr(cfg, name)
            defaults = type(section).model_fields
            if keys := sorted(k for k in section.model_fields_set if getattr(section, k) != defaults[k].default):
                raise ConfigError(f"{source}: {name}.{keys[0]} is an option of the {other.title}, but draft.method is "
                                  f"{cfg.draft.method} (set draft.method: {other.name}, or drop the {name} section)")


def draft_method(draft_dir: Path) -> str:
    """Which draft family (its draft.method) an exported draft folder holds, from the architectures its config.json
    names (DraftFamily.architectures); an EAGLE-3 checkpoint as its authors publish it (LlamaForCausalLM with a
    draft_vocab_size and an eagle_config) is EAGLE-3. A draft no family declares is refused by name, never loaded as
    another."""
    from trtspec.artifacts import read_json

    return method_of(read_json(Path(draft_dir) / "config.json"), draft_dir)


def method_of(cfg: dict, draft_dir: Path) -> str:
    """draft_method of a draft whose config.json is `cfg` (read once by the caller)."""
    archs = cfg.get("architectures") or []
    declared = {a: fam.name for fam in DRAFT_FAMILIES.values() for a in fam.architectures}
    if known := [declared[a] for a in archs if a in declared]:
        return known[0]
    if "draft_vocab_size" in cfg and "eagle_config" in cfg:
        return "eagle3"
    raise ArtifactError(f"'{draft_dir}' holds a draft of architectures {archs}, which no draft family loads",
                        f"trtspec loads {', '.join(sorted(declared))}")


def speculative_method(draft_dir: Path) -> str:
    """An exported draft's speculative method as the engines name it: its family's (eagle3, dflash, dflash2), or dspark
    (a DFlash backbone with a Markov head, dflash_config.projector_type dspark)."""
    from trtspec.artifacts import read_json

    cfg = read_json(Path(draft_dir) / "config.json")
    if (cfg.get("dflash_config") or {}).get("projector_type") == "dspark":
        return "dspark"
    return method_of(cfg, draft_dir)


def load_drafter(draft_dir: Path, target: Any, weights: str = "auto", settings: Any = None) -> Any:
    """The runtime drafter for an exported draft, by the family that declares its architecture (an unknown one is
    refused by name: draft_method). weights: how the draft's product weights are stored, auto (bfloat16 where timed
    faster) | float32 | bfloat16; settings: runtime.settings.RuntimeSettings (default: as the target runs)."""
    return family(draft_method(draft_dir)).load_drafter(draft_dir, target, weights=weights, settings=settings)
