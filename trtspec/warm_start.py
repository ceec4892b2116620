"""Building on an earlier run: a draft that continues from that run's trained draft (draft.init_from), and that run's
answered conversations as training rows (data.sources kind: run). `trtspec adapt` uses both.

Everything read from the earlier run is first checked against its stage manifests (RunDir.require with verify), and
refused in one line when it was built for another target, or its draft is of another method or length: a draft
trained on one target's states and vocabulary accepts nothing on another's.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from trtspec.artifacts import RunDir
from trtspec.errors import ArtifactError, ConfigError

if TYPE_CHECKING:
    from trtspec.config import BuildConfig


def earlier_run(path: Path, key: str) -> RunDir:
    """The run folder named by config key `key`, refused when it is none."""
    run = RunDir(path)
    if not path.is_dir() or not run.is_run():
        raise ConfigError(f"{key}: '{path}' is not a trtspec run folder", "name the --out folder of an earlier build")
    return run


def stage_of(run: RunDir, stage: str, key: str) -> tuple[Path, dict]:
    """A finished stage of the earlier run, its files checked against its manifest."""
    try:
        return run.require(stage, verify=True)
    except ArtifactError as e:
        raise ConfigError(f"{key}: {e.message}", e.hint) from None


def check_same_target(run: RunDir, cfg: BuildConfig, key: str) -> None:
    """The earlier run answered with the same target this build uses (its data stage's model.source), its prompts
    rendered the same way: the same chat template (model.chat_template; by its file's sha256 where the earlier
    manifest recorded it, so that a copy reads as the same and an edit in place as another) and the same
    model.chat_template_kwargs. Its rows' tokens are that rendering's."""
    _, m = stage_of(run, "data", key)
    model = (m.get("config") or {}).get("model") or {}
    if model.get("source") != cfg.model.source:
        raise ConfigError(f"{key}: '{run.path}' was built for another target ({model.get('source')}; this build: "
                          f"{cfg.model.source})", "adapt a run of the same model")
    if other_template(model.get("chat_template"), m.get("chat_template_sha256"), cfg):
        edited = model.get("chat_template") == cfg.model.chat_template
        raise ConfigError(f"{key}: '{run.path}' was built with another chat template (model.chat_template "
                          f"{model.get('chat_template')}" + (", edited since" if edited else "")
                          + f"; this build: {cfg.model.chat_template})",
                          "set model.chat_template to (a copy of) the template the earlier run rendered with"
                          if model.get("chat_template") else "leave model.chat_template unset, as the earlier run did")
    if (model.get("chat_template_kwargs") or {}) != (cfg.model.chat_template_kwargs or {}):
        raise ConfigError(f"{key}: '{run.path}' rendered its prompts with other model.chat_template_kwargs "
                          f"({model.get('chat_template_kwargs') or {}}; this build: {cfg.model.chat_template_kwargs or {}})",
                          "set model.chat_template_kwargs as the earlier run did")


def other_template(path: str | None, sha: str | None, cfg: BuildConfig) -> bool:
    """Whether this build renders with another chat template than the earlier run's (its model.chat_template `path`,
    and that file's sha256 where its manifest recorded one; runs before then are compared by path). This build's
    template file missing or no Jinja is refused as such first (models.read_chat_template), not as another template."""
    from trtspec.models import read_chat_template, template_stamp

    if cfg.model.chat_template:
        read_chat_template(cfg.resolve_path(cfg.model.chat_template))
    if not path or not cfg.model.chat_template:
        return bool(path) != bool(cfg.model.chat_template)
    return sha != template_stamp(cfg) if sha else path != cfg.model.chat_template


def check_init_from(cfg: BuildConfig) -> None:
    """draft.init_from: a finished, intact run of the same target whose draft has this build's method and length."""
    key = "draft.init_from"
    run = earlier_run(cfg.resolve_path(cfg.draft.init_from), key)
    check_same_target(run, cfg, key)
    _, m = stage_of(run, "train", key)
    c = m.get("config") or {}
    if c.get("draft.method") != cfg.draft.method:
        raise ConfigError(f"{key}: '{run.path}' trained a {c.get('draft.method')} draft, this build trains "
                          f"{cfg.draft.method}", "continue from a draft of the same method, or set draft.init_from: null")
    if c.get("draft.length") != cfg.draft.length:
        raise ConfigError(f"{key}: '{run.path}' trained its draft for length {c.get('draft.length')}, this build "
                          f"drafts {cfg.draft.length}", f"set draft.length: {c.get('draft.length')}")
    stage_of(run, "convert", key)


def initial_draft(cfg: BuildConfig, config_file: str, head_file: str) -> tuple[Path, Path, dict]:
    """(its convert config, its trained weights, its lineage) of the draft draft.init_from names, checked."""
    check_init_from(cfg)
    run = RunDir(cfg.resolve_path(cfg.draft.init_from))
    conv, _ = stage_of(run, "convert", "draft.init_from")
    train, m = stage_of(run, "train", "draft.init_from")
    lineage = {"run": str(run.path.resolve()), "head_sha256": m["files"][head_file]["sha256"],
               "heldout_al": (m.get("metrics") or {}).get(f"AL@{cfg.draft.length}"),
               "adapted_from": read_lineage(run)}
    return conv / config_file, train / head_file, lineage


def read_lineage(run: RunDir) -> dict | None:
    """The lineage the earlier run's own convert stage recorded (a chain of adaptations), if any."""
    m = run.manifest("convert") or {}
    return (m.get("metrics") or {}).get("init_from")


def run_rows(path: Path, skips: Counter, limit: int | None = None) -> tuple[list[dict], list[dict]]:
    """An earlier run's answered conversations (its training rows, `limit` of them, and its held-out rows), the
    target's tokens kept, its data stage's files checked once first. The data stage's reader of kind: run sources
    (the preflight reads through it too)."""
    from trtspec.chat import read_rows

    folder, _ = stage_of(earlier_run(path, "data.sources"), "data", "data.sources")
    return read_rows(folder / "train.jsonl")[:limit], read_rows(folder / "heldout.jsonl")


def stepped_back(start: dict, tuned: dict, share: float) -> dict:
    """The draft `share` of the way from its warm start to its fine-tune (WiSE-FT's weight interpolation: between two
    points of one fine-tune, the earlier draft's categories come back faster than the new traffic's gain goes);
    the keys of the warm start's file, tensors that are not floating point (EAGLE-3's d2t) the fine-tune's."""
    return {k: (a := s.to(tuned[k])) + share * (tuned[k] - a) if s.is_floating_point() else tuned[k] for k, s in start.items()}
