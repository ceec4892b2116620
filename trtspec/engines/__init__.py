"""Serving engines, one package each, behind one small interface; the engine stage, deploy and doctor reach them
only through this registry.

Each engine module (engines/trtllm, engines/vllm, engines/sglang) has:
  NAME, SHORT, PACKAGE       as reports name it, its report columns' suffix, its Python package
  RUNS_BUNDLE                whether the engine stage can run a bundle in it here (SGLang: launch line and table only)
  availability()             (can it run here, why): the one check shared by the engine stage and `trtspec doctor`
  version()                  the installed release, or None
  refusal(target, method)    why it serves no `method` draft (eagle3, dflash, dspark) for the target folder, or None
  build_refusal(config, m)   why a build that names it as engine.backend stops before its first stage (config: the
                             target's HF config), or None
  support_row(family)        what its sources serve for a target family (`trtspec families`, docs/engines.md)
  own_process(target)        whether a run leaves this process changed (then it runs in a spawned one)
and, where RUNS_BUNDLE: describe(options), run_bundle(bundle, options, prompts, max_new, batch_sizes) and
report_options(options). The options are the bundle's llm_api_options.yaml (read_options; deploy.serving writes it),
which each engine reads in its own terms (vLLM: vllm.from_options).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from trtspec.engines import sglang, trtllm, vllm
from trtspec.errors import ArtifactError

OPTIONS_FILE = "llm_api_options.yaml"  # the bundle's launch options, TensorRT-LLM's LLM-API form, which every engine reads


class Engine(Protocol):
    NAME: str
    SHORT: str
    PACKAGE: str
    RUNS_BUNDLE: bool

    def availability(self) -> tuple[bool, str]: ...
    def version(self) -> str | None: ...
    def refusal(self, target: Path, method: str | None) -> str | None: ...
    def build_refusal(self, model_config: Any, method: str | None) -> str | None: ...
    def support_row(self, family: str) -> dict[str, Any]: ...
    def own_process(self, target: Path) -> bool: ...


ENGINES: dict[str, Engine] = {"trtllm": trtllm, "vllm": vllm, "sglang": sglang}  # type: ignore[dict-item]


def read_options(bundle_dir: Path) -> dict:
    """The bundle's launch options (OPTIONS_FILE), refused in one line when missing or not the export's."""
    import yaml

    p = Path(bundle_dir) / OPTIONS_FILE
    try:
        opts = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"'{p}' is missing", "re-run the export stage") from None
    except yaml.YAMLError:
        raise ArtifactError(f"'{p}' is not valid YAML", "re-run the export stage") from None
    if not isinstance(opts, dict) or "speculative_config" not in opts:
        raise ArtifactError(f"'{p}' has no speculative_config", "re-run the export stage")
    return opts


def engine(name: str) -> Engine:
    return ENGINES[name]


def resolve(backend: str) -> tuple[Engine | None, str]:
    """(the engine that runs the bundle here, why); (None, why) when the configured one (or, for auto, neither)
    can run. auto: TensorRT-LLM where it and a GPU exist, else vLLM where it is installed."""
    trt_ok, trt_why = trtllm.availability()
    if backend == "trtllm" or (backend == "auto" and trt_ok):
        return (trtllm, trt_why) if trt_ok else (None, f"{trt_why}; the bundle's serve.sh and triton/ run on a GPU server")
    vllm_ok, vllm_why = vllm.availability()
    if backend == "auto":
        return (vllm, f"{trt_why}: {vllm_why} instead") if vllm_ok else (None, f"{trt_why}; {vllm_why}")
    return (vllm, vllm_why) if vllm_ok else (None, f"{vllm_why}; the bundle's snippets/vllm.sh serves it wherever vLLM is installed")


def environment_key() -> dict:
    """What the engine stage's result depends on in this machine: a machine that gains an engine or a GPU re-runs it."""
    return {"tensorrt_llm": trtllm.version(), "vllm": vllm.version(), "cuda": trtllm.cuda_available()}


def matrix_rows() -> list[dict]:
    """Every target family as one row: its own facts, then each engine's support (`trtspec families`, the docs),
    keyed `<engine>_<what>`."""
    from trtspec.targets import FAMILIES

    return [{"family": f.name, "model_types": list(f.model_types), "runtime": f.runtime,
             **{f"{short}_{k}": v for short, eng in ENGINES.items() for k, v in eng.support_row(f.name).items()},
             "note": f.note} for f in FAMILIES]

