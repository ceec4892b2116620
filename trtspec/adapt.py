"""`trtspec adapt RUN --prompts FILE --out NEW_RUN`: a deployed draft adapted to the traffic it serves.

The earlier run's build config (read back from its stage manifests) with three changes, written to NEW_RUN/adapt/
adapt.yaml and run as any build is (a killed adapt resumes):
  data   the traffic's prompts (trtspec.traffic), answered again by the target, a share held out; beside them as many
         of the earlier run's training rows as `replay` says (kind: run), and all its held-out rows held out
  draft  init_from the earlier run: training continues from its draft (trtspec.warm_start), and the train stage
         fails when any category's held-out AL, old or new, falls more than the tolerance below the earlier draft's
         on the same rows (draft.max_category_drop) even after stepping back toward the earlier draft
         (draft.step_back), so nothing is exported from a draft that got worse
  train  fewer epochs at a lower learning rate (a fine-tune, not a new draft)
The bundle's manifest carries the lineage (metrics.lineage: the run and draft it continues from).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.artifacts import RunDir
from trtspec.config import STAGES, apply_overrides
from trtspec.errors import ConfigError
from trtspec.warm_start import earlier_run, stage_of

ADAPT_DIR = "adapt"  # NEW_RUN/adapt: the traffic's prompts and the build config made from the earlier run
GROW_VOCAB = 1024  # tokens a compressed draft vocabulary (EAGLE-3's convert.draft_vocab_size) takes by default


@dataclass
class AdaptOptions:
    """How the draft is adapted (trtspec adapt's options)."""

    fmt: str = "auto"  # the traffic file's format (trtspec.traffic.FORMATS)
    category: str | None = None  # the category of traffic rows that name none (None: "traffic")
    epochs: float = 2.0
    lr: float = 3e-4
    replay: float = 10.0  # earlier training rows per traffic training row (as many as the earlier run has)
    holdout: float = 0.2  # share of the traffic's prompts held out (measured before and after, never trained on)
    grow_vocab: int | None = None  # draft.grow_vocab: traffic tokens added to the draft's vocabulary (None: GROW_VOCAB where it can)
    step_back: tuple[float, ...] = (0.75, 0.5, 0.25)  # draft.step_back: shares of the fine-tune tried when a category falls
    tolerance: float | None = None  # draft.max_category_drop (None: the earlier run's validate.baseline_tolerance)


def earlier_config(run: RunDir) -> dict[str, Any]:
    """The earlier run's build config as its stages recorded it (each manifest holds the keys its stage reads), keys
    at their defaults left out (as a YAML would leave them: another draft family's section stays unset), and the
    engines the YAML left to `auto` (data.answer_with, train.states_from) left to it again."""
    raw: dict[str, Any] = {}
    for stage in STAGES:
        manifest = run.manifest(stage) or {}
        for key, value in (manifest.get("config") or {}).items():
            section, _, sub = key.partition(".")
            if sub:
                raw.setdefault(section, {})[sub] = value
            elif isinstance(value, dict):
                raw[section] = {**raw.get(section, {}), **value}
            else:
                raw[section] = value
        for key in manifest.get("from_auto") or ():  # chosen again on the machine the adaptation runs on
            section, _, sub = key.partition(".")
            raw.setdefault(section, {})[sub] = "auto"
    return without_defaults(raw)


def without_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` less the keys of a section that equal that section's default."""
    from trtspec.config import BuildConfig

    out: dict[str, Any] = {}
    for section, value in raw.items():
        field = BuildConfig.model_fields.get(section) or BuildConfig.model_fields.get(section + "_")
        if not isinstance(value, dict) or field is None or field.default_factory is None:
            out[section] = value
            continue
        default = field.default_factory().model_dump(mode="json")
        if kept := {k: v for k, v in value.items() if default.get(k, object()) != v}:
            out[section] = kept
    return out


def adapt_config(run: RunDir, traffic_file: str, traffic_rows: int, longest_prompt: int, o: AdaptOptions) -> dict[str, Any]:
    """The build config of the adaptation (see the module's docstring), relative to NEW_RUN/adapt; data.seq_len
    grown to hold the longest traffic prompt and its answer."""
    raw = earlier_config(run)
    old_heldout = sum(1 for line in (run.path / "data" / "heldout.jsonl").open(encoding="utf-8") if line.strip())
    new_heldout = math.ceil(traffic_rows * o.holdout)
    replay = max(1, round((traffic_rows - new_heldout) * o.replay))
    d = raw["data"]
    seq_len = max(d.get("seq_len", 256), longest_prompt + d.get("max_new_tokens", 256))
    raw["data"] = {**d, "holdout_fraction": o.holdout, "seq_len": seq_len, "sources": [
        {"kind": "regenerate", "path": traffic_file},
        {"kind": "run", "path": str(run.path.resolve()), "limit": replay}]}
    tolerance = o.tolerance if o.tolerance is not None else raw.get("validate", {}).get("baseline_tolerance", 0.02)
    raw["draft"] = {**raw.get("draft", {}), "init_from": str(run.path.resolve()), "max_category_drop": tolerance,
                    "grow_vocab": default_growth(raw) if o.grow_vocab is None else o.grow_vocab, "step_back": list(o.step_back)}
    raw["train"] = {**raw.get("train", {}), "epochs": o.epochs, "lr": o.lr, "max_steps": None}
    eval_ = {k: v for k, v in raw.get("eval", {}).items() if k not in ("prompts", "suites", "context_source", "acceptance_suite")}
    raw["eval"] = {**eval_, "acceptance_prompts": old_heldout + new_heldout}
    if suite := earlier_suite(run):  # the earlier draft's unseen prompts, measured again after adapting
        raw["eval"]["acceptance_suite"] = suite
    report = run.path / "validate" / "report.json"
    raw["validate"] = {**raw.get("validate", {}), "baseline": str(report.resolve()) if report.is_file() else None}
    return raw


def earlier_suite(run: RunDir) -> str | None:
    """The file of the earlier train stage's eval.acceptance_suite (its manifest's suite.file), where it still is."""
    file = (((run.manifest("train") or {}).get("metrics") or {}).get("suite") or {}).get("file")
    return file if file and Path(file).is_file() else None


def default_growth(raw: dict[str, Any]) -> int:
    """GROW_VOCAB for a draft whose family grows its vocabulary and whose vocabulary is compressed, else 0."""
    from trtspec.draft_families import family

    method = raw.get("draft", {}).get("method", "eagle3")
    return GROW_VOCAB if family(method).grows_vocab and raw.get("convert", {}).get("draft_vocab_size") else 0


def shares(text: str) -> tuple[float, ...]:
    """--step-back's shares ("0.75,0.5"; "none": none), each strictly between 0 and 1."""
    if text.strip().lower() in ("none", ""):
        return ()
    try:
        out = tuple(float(x) for x in text.split(","))
    except ValueError:
        out = ()
    if not out or not all(0 < x < 1 for x in out):
        raise ConfigError(f"--step-back '{text}' is not a list of shares", "give shares between 0 and 1, e.g. "
                          "--step-back 0.75,0.5, or --step-back none")
    return out


def prepare(run_path: Path, prompts: Path, out: Path, o: AdaptOptions, overrides: tuple[str, ...] = ()) -> tuple[Path, dict]:
    """Check the earlier run and the traffic, write NEW_RUN/adapt/{traffic.jsonl, adapt.yaml} (with the command's
    --set overrides, so that a build of the YAML is the adaptation it started); (the YAML, a summary)."""
    import json

    import yaml

    from trtspec.chat import encode_row
    from trtspec.models import load_tokenizer
    from trtspec.traffic import read_traffic

    if o.category is not None and not o.category.strip():
        raise ConfigError("--category is empty", "name the category of the traffic's prompts, e.g. --category support")
    run = earlier_run(run_path, "RUN")
    for stage in ("data", "convert", "train", "export"):
        stage_of(run, stage, "RUN")
    if out.resolve() == run.path.resolve():
        raise ConfigError(f"--out '{out}' is the run being adapted", "write the adaptation to a new folder")
    tok = load_tokenizer(stage_of(run, "export", "RUN")[0] / "target")
    rows, skips, fmt = read_traffic(prompts, o.fmt, o.category, tok)
    longest = max(len(encode_row(tok, r)) for r in rows)
    new = RunDir(out)
    new.ensure()
    folder = out / ADAPT_DIR
    folder.mkdir(exist_ok=True)
    (folder / "traffic.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    raw = apply_overrides(adapt_config(run, "traffic.jsonl", len(rows), longest, o), list(overrides))
    header = (f"# trtspec adapt {run.path} --prompts {prompts}: the earlier run's config, its draft continued on the "
              "traffic's prompts\n")
    (folder / "adapt.yaml").write_text(header + yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    categories = sorted({r["category"] for r in rows})
    return folder / "adapt.yaml", {"format": fmt, "prompts": len(rows), "categories": categories, "skipped": dict(skips)}
