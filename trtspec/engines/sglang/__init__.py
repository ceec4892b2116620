"""SGLang, as far as trtspec takes it: the launch line a bundle is served with (snippets/sglang.sh) and the table of
target families whose SGLang model serves a draft (engines/sglang/support.py). The engine stage does not run it:
SGLang has no CPU build to run here; its launcher is written into every bundle it can load.
"""

from __future__ import annotations

import importlib.util
from importlib import metadata
from pathlib import Path
from typing import Any

from trtspec.engines.sglang import support

NAME, SHORT, PACKAGE = "SGLang", "sglang", "sglang"  # as reports name it, its columns' suffix, its package
RUNS_BUNDLE = False
SGLANG_MIN = "0.5.12"  # the first release that loads an EAGLE-3 draft's layers.0.* weights (older read midlayer.*)
ALGORITHMS = {"Eagle3": "EAGLE3", "DFlash": "DFLASH", "DSpark": "DSPARK"}  # LLM-API decoding_type -> its algorithm


def version() -> str | None:
    if importlib.util.find_spec("sglang") is None:
        return None
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return "unknown"


def availability() -> tuple[bool, str]:
    """Never here: the engine stage runs TensorRT-LLM or vLLM; SGLang serves the bundle through snippets/sglang.sh."""
    installed = f"sglang {version()} is installed, but " if version() else ""
    return False, f"{installed}the engine stage does not run SGLang; the bundle's snippets/sglang.sh serves it"


def launch_command(decoding_type: str, tp: int, k: int) -> str:
    """The launch line of snippets/sglang.sh (run from the bundle folder): the target with the draft, k tokens
    drafted a step and k + 1 verified (--speculative-num-draft-tokens counts the step's own token). An EAGLE-3 head
    drafts a chain: k steps of top-1."""
    chain = f" \\\n  --speculative-num-steps {k} --speculative-eagle-topk 1" if decoding_type == "Eagle3" else ""
    return (f"exec python -m sglang.launch_server --model-path ./target --tp {tp} \\\n"
            f"  --speculative-algorithm {ALGORITHMS[decoding_type]} --speculative-draft-model-path ./draft{chain} "
            f"--speculative-num-draft-tokens {k + 1} \"$@\"\n")


def refusal(target: Path, method: str | None) -> str | None:
    """Why SGLang's model for the target folder's family serves no `method` draft (support.py), or None."""
    from trtspec.targets import family_if_known

    family = family_if_known(target)
    return support.refusal_for(family.name, method) if family is not None and method else None


def build_refusal(model_config: Any, method: str | None) -> str | None:
    return None  # never engine.backend


def support_row(family: str) -> dict[str, Any]:
    s = support.SUPPORT[family]
    return {"file": s.file, "eagle3": s.eagle3, "dflash": s.dflash}


def own_process(target: Path) -> bool:
    return False
