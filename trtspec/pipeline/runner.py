"""Run the stages in order, skipping those whose manifest still matches.

A stage's fingerprint hashes its own config section(s), the local data files it reads and its upstream stages'
fingerprints, so changing `train.lr` redoes train, export and validate, and nothing else, and editing a prompt file
redoes everything from the data stage on.
"""

from __future__ import annotations

import errno
import importlib
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from trtspec import ranks
from trtspec.artifacts import (
    RunDir,
    fingerprint,
    output_fingerprint,
    package_versions,
    peak_rss_gib,
    reset_peak_rss,
    sha256_file,
)
from trtspec.config import STAGES, BuildConfig, dump_config, keyed_when_set
from trtspec.draft_families import check_recipe
from trtspec.errors import ConfigError, DiskFull, TrtspecError
from trtspec.models import model_stamp, template_stamp
from trtspec.pipeline.stage import HOOK_DEFAULTS, InputFile, StageContext, StageSkipped


@dataclass
class StageResult:
    stage: str
    status: str  # done | skipped | cached | failed
    seconds: float = 0.0
    headline: str = ""
    reason: str = ""


def stage_module(stage: str):
    """The stage's module, whose `run` (and `preflight`) the runner calls."""
    return importlib.import_module(f"trtspec.stages.{stage}")


def contract(stage: str) -> ModuleType:
    """The stage's declared contract (trtspec.pipeline.stage): UPSTREAM, READS, and its optional hooks."""
    return importlib.import_module(f"trtspec.stages.{stage}")


def upstream_of(stage: str) -> tuple[str, ...]:
    return contract(stage).UPSTREAM


def hook(stage: str, name: str) -> Callable:
    """A stage's optional hook (environment_key, files_read, models_read, unused), or what its absence means."""
    return getattr(contract(stage), name, HOOK_DEFAULTS[name])


def at_defaults(cfg: BuildConfig, keys: tuple[str, ...]) -> dict[str, Any]:
    """The config as dump_config writes it, with each `section.key` of `keys` at its default."""
    full = dump_config(cfg)
    for name in keys:
        section, _, key = name.partition(".")
        full[section][key] = type(cfg.section_model(section)).model_fields[key].get_default(call_default_factory=True)
    return full


def _section_values(cfg: BuildConfig, stage: str) -> dict[str, Any]:
    """The values of a stage's READS; those its `unused` hook names are keyed at their defaults, so that changing
    a setting this config leaves unused redoes nothing, and a run keyed before the hook keeps its key."""
    full = at_defaults(cfg, hook(stage, "unused")(cfg))
    for section, keys in full.items():  # keys added after runs were made, at their default: not keyed (config.key)
        if isinstance(keys, dict) and (model := type(cfg.section_model(section))):
            for name in [k for k in keys if k in model.model_fields and keyed_when_set(model, k)]:
                if keys[name] == model.model_fields[name].get_default(call_default_factory=True):
                    del keys[name]
    values: dict[str, Any] = {}
    for name in contract(stage).READS:
        section, _, key = name.partition(".")
        if not key:
            values[name] = full[section]
        elif key in full[section]:
            values[name] = full[section][key]
    return values


def input_files(cfg: BuildConfig, stage: str) -> dict[str, str]:
    """sha256 of the local files a stage reads by path (its files_read: data sources, validate's prompts), so that
    editing one in place redoes the stage and what follows, as a changed key does. Model files are not hashed
    (gigabytes): the work key has their sizes and mtimes (models.model_stamp)."""
    return {f.written: sha256_file(f.path) if f.path.is_file() else "missing" for f in hook(stage, "files_read")(cfg)}


def work_key(cfg: BuildConfig, stage: str, upstream: dict[str, str]) -> str:
    """A stage's config, upstream stages and environment: the key of its resumable scratch (.work), which an edited
    input file does not void (the data stage's regenerated answers are keyed by prompt, so only new prompts are
    answered)."""
    env = hook(stage, "environment_key")()
    key = {"stage": stage, "config": _section_values(cfg, stage), "inputs": upstream, "env": env}
    if "model" in contract(stage).READS and (stamp := model_stamp(cfg.model.source)):
        key["model_files"] = stamp  # a local model replaced in place: every stage after is keyed on this one
    if "model" in contract(stage).READS and cfg.model.chat_template:
        key["chat_template"] = template_stamp(cfg)  # the template file edited in place: likewise
    return fingerprint(key)


def stage_fingerprint(key: str, files: dict[str, str]) -> str:
    """What a finished stage must match to be reused: its work key and the files it reads (input_files)."""
    return fingerprint({"key": key, "files": files}) if files else key


def select_stages(start: str | None, until: str | None) -> tuple[list[str], list[str]]:
    """(stages to visit, stages to redo) for --from/--until."""
    for name, value in (("--from", start), ("--until", until)):
        if value is not None and value not in STAGES:
            import difflib

            near = difflib.get_close_matches(value, STAGES, n=1)
            raise ConfigError(
                f"{name} '{value}' is not a stage" + (f"; did you mean '{near[0]}'?" if near else ""),
                f"stages: {', '.join(STAGES)}",
            )
    i = STAGES.index(start) if start else 0
    j = STAGES.index(until) + 1 if until else len(STAGES)
    if i >= j:
        raise ConfigError(f"--from {start} comes after --until {until}")
    return list(STAGES[:j]), list(STAGES[i:j])


def run_build(
    cfg: BuildConfig,
    run_dir: str | Path,
    start: str | None = None,
    until: str | None = None,
    force: bool = False,
    on_result: Callable[[StageResult], None] | None = None,
) -> list[StageResult]:
    """Run every stage up to `until`; stages from `start` on (or all with force) are redone."""
    cfg = resolve_engines(cfg)
    needed, redo = select_stages(start, until)
    redo = set(needed if force else (redo if start else []))
    run = RunDir(run_dir)
    results: list[StageResult] = []
    fps: dict[str, str] = {}
    ranks.start()
    with _releasing_followers(), run.locked():
        preflight(cfg, run, needed, redo)
        for stage in needed:
            upstream = {d: fps[d] for d in upstream_of(stage)}
            key = work_key(cfg, stage, upstream)
            fp = stage_fingerprint(key, input_files(cfg, stage))
            why = "forced" if stage in redo else run.check_stage(stage, fp)
            if why is None:
                m = run.manifest(stage) or {}
                res = StageResult(stage, "cached", 0.0, m.get("metrics", {}).get("headline", ""), m.get("reason", ""))
            else:
                try:
                    res = _run_stage(cfg, run, stage, fp, key, upstream, why)
                except BaseException as e:
                    full = disk_full(e, run.path, stage)
                    results.append(StageResult(stage, "failed", 0.0, "", format_exception_line(full or e)))
                    if on_result:
                        on_result(results[-1])
                    if full:
                        raise full from e
                    raise
            # downstream stages key on what this stage actually wrote, not only on how it was asked
            fps[stage] = output_fingerprint({**(run.manifest(stage) or {}), "fingerprint": fp})
            results.append(res)
            if on_result:
                on_result(res)
    return results


def check_build(cfg: BuildConfig, run_dir: str | Path, start: str | None = None, until: str | None = None,
                force: bool = False) -> list[str]:
    """Everything a build checks before its first stage (the config, the files and model it reads, the settings only
    the model's config can judge), running no stage and writing nothing to the run directory. Returns the stages the build would run."""
    needed, redo = select_stages(start, until)
    redo = set(needed if force else (redo if start else []))
    run = RunDir(run_dir)
    preflight(cfg, run, needed, redo)
    return likely_to_run(cfg, run, needed, redo)


@contextmanager
def _releasing_followers() -> Iterator[None]:
    """The other ranks of a multi-process launch wait in `follow_build` until rank 0's build ends. Not when it ends
    inside a stage they run too: they are in that stage's collectives, and rank 0 exiting is what ends the launch
    (torchrun stops the others)."""
    try:
        yield
    except BaseException:
        if ranks.size() > 1 and not _followers_busy:
            ranks.broadcast(None)
            ranks.stop()
        raise
    ranks.broadcast(None)
    ranks.stop()


_followers_busy = False  # rank 0 is in a stage the other ranks run too


def follow_build(cfg: BuildConfig) -> None:
    """A rank other than 0 of a multi-process launch: run each stage rank 0 names (ALL_RANKS) with it, in rank 0's
    run directory and scratch, until rank 0's build ends. Writes nothing but what the stage's ranks share."""
    ranks.start()
    while (job := ranks.broadcast()) is not None:
        ctx = StageContext(cfg, RunDir(job["run"]), job["stage"], Path(job["out"]), Path(job["work"]),
                           {k: Path(v) for k, v in job["inputs"].items()}, job["manifests"], quiet=True)
        stage_module(job["stage"]).run(ctx)
    ranks.stop()


def run_with_followers(ctx: StageContext) -> dict:
    """Run a stage on rank 0; one of ALL_RANKS with the other ranks of a launch (told where it runs first)."""
    global _followers_busy
    if ranks.size() == 1 or not getattr(contract(ctx.stage), "ALL_RANKS", False):
        return stage_module(ctx.stage).run(ctx) or {}
    ranks.broadcast({"stage": ctx.stage, "run": str(ctx.run.path), "out": str(ctx.out), "work": str(ctx.work),
                     "inputs": {k: str(v) for k, v in ctx.inputs.items()}, "manifests": ctx.manifests})
    _followers_busy = True
    metrics = stage_module(ctx.stage).run(ctx) or {}
    _followers_busy = False
    return metrics


def likely_to_run(cfg: BuildConfig, run: RunDir, needed: list[str], redo: set[str]) -> list[str]:
    """The stages of `needed` that this build will run: redone, never finished, or whose config sections or an
    upstream stage's changed. Edited input files are missed here; the stages check again when they run."""
    changed: set[str] = set()
    for stage in needed:
        m = run.manifest(stage)
        if stage in redo or not m or m.get("status") != "done" or m.get("config") != _section_values(cfg, stage) or changed & set(upstream_of(stage)):
            changed.add(stage)
    return [s for s in needed if s in changed]


def resolve_engines(cfg: BuildConfig, log: Callable[[str], None] | None = None) -> BuildConfig:
    """`cfg` with data.answer_with and train.states_from `auto` made concrete before any stage keys on them: vllm
    where vLLM is installed and runs the target here (its build refusal for the answers, engine_states.refusal for
    the states) and the setting lets an engine compute them (model.train_on_quantized: only the HF target is
    quantized; train.mode online: the HF forward runs in every step); hf otherwise. In float32 both give the same
    answers and states; vLLM answers in less time (docs/results.md, "The data stage: who answers the prompts")."""
    answers, states = cfg.data.answer_with == "auto", cfg.train.states_from == "auto"
    if not (answers or states):
        return cfg
    from functools import cache

    from trtspec.engines import vllm as vllm_engine
    from trtspec.training.engine_states import refusal as states_refusal

    model_config = cache(lambda: load_model_config(cfg.model.source))

    def why_not(refusal: Callable[[Any], str | None]) -> str | None:
        if not vllm_engine.installed():
            return "vllm is not installed"
        if cfg.model.train_on_quantized:
            return "model.train_on_quantized: the quantized target runs in HF"
        return refusal(model_config())

    update, said = {}, []
    if answers:
        why = why_not(lambda config: vllm_engine.build_refusal(config, None))
        update["data"] = cfg.data.model_copy(update={"answer_with": "hf" if why else "vllm"})
        said.append(f"data.answer_with: auto -> {'hf (' + why + ')' if why else 'vllm'}")
    if states:
        why = ("train.mode: online runs the HF forward in every step" if cfg.train.mode == "online" else
               why_not(states_refusal))
        if why and cfg.train.mode == "streamed":
            raise ConfigError(f"train.states_from: auto found no engine to stream states from: {why}",
                              vllm_engine.INSTALL_HINT)
        update["train"] = cfg.train.model_copy(update={"states_from": "hf" if why else "vllm"})
        said.append(f"train.states_from: auto -> {'hf (' + why + ')' if why else 'vllm'}")
    (log or (lambda m: print(m, file=sys.stderr, flush=True)))("; ".join(said))
    out = cfg.model_copy(update=update)
    out._from_auto = tuple(k for k, asked in (("data.answer_with", answers), ("train.states_from", states)) if asked)
    return out


def load_model_config(source: str) -> Any:
    """The HF config of a config's model.source (the demo's GGUF is converted once, as the data stage would)."""
    from transformers import AutoConfig

    from trtspec.models import resolve_model
    from trtspec.targets import read_family

    path = resolve_model(source)
    read_family(path)  # a model no family declares, a multimodal or encoder-decoder one, one needing its own code
    return AutoConfig.from_pretrained(path)


def files_read(cfg: BuildConfig, stages: list[str]) -> list[InputFile]:
    """Every local text file the given stages will read, with the reader each stage reads it with."""
    return [f for s in stages for f in hook(s, "files_read")(cfg)]


def models_read(cfg: BuildConfig, stages: list[str]) -> list[tuple[str, str]]:
    """(config key, model source) of the models besides model.source that the given stages will load."""
    return [m for s in stages for m in hook(s, "models_read")(cfg)]


def check_inputs(cfg: BuildConfig, stages: list[str]) -> None:
    """Every file and model a stage of this build will read exists and is what it should be, before the first
    stage runs: a prompt file that validate reads and that holds no usable prompt must not cost the data stage's
    minutes first. Each file is read whole with its stage's own reader and must give at least one usable row."""
    from trtspec.chat import check_text_file, require_rows
    from trtspec.errors import ModelError
    from trtspec.models import resolve_model

    for f in files_read(cfg, stages):
        check_text_file(f.path, f.what, f"check {f.name} (relative to the YAML's folder)")
        skips: Counter = Counter()
        require_rows(f.read(f.path, skips), f.path, f.what, f.row, skips)
    for key, source in models_read(cfg, stages):
        local = cfg.resolve_path(source)
        if source.startswith((".", "/", "~")) or local.exists():
            try:
                resolve_model(str(local))
            except ModelError as e:
                raise ModelError(f"{key}: {e.message}", e.hint) from None


def preflight(cfg: BuildConfig, run: RunDir, needed: list[str], redo: set[str]) -> None:
    """Before the first stage runs: the files and models the stages will read (check_inputs), and settings that only
    the model's config can judge (convert's aux layers, quantize's lm_head...), after the draft family's rules of the
    recipe (draft_families.check_recipe). A bad one fails in seconds, not after the data stage's regeneration."""
    from trtspec.models import check_environment
    from trtspec.resources import few_rows_warning

    check_recipe(cfg)
    check_environment()
    stages = likely_to_run(cfg, run, needed, redo)
    check_inputs(cfg, stages)
    if "data" in stages and (warning := few_rows_warning(cfg)):
        print(warning, file=sys.stderr, flush=True)
    checks = [f for s in stages if (f := getattr(stage_module(s), "preflight", None))]
    if checks:
        model_config = load_model_config(cfg.model.source)
        for check in checks:
            check(cfg, model_config)


def _run_stage(cfg: BuildConfig, run: RunDir, stage: str, fp: str, key: str, upstream: dict[str, str], why: str) -> StageResult:
    inputs, manifests = {}, {}
    skipped_deps = [d for d in upstream_of(stage) if (run.manifest(d) or {}).get("status") == "skipped"]
    for dep in upstream_of(stage):
        if dep not in skipped_deps:
            inputs[dep], manifests[dep] = run.require(dep)
    run.invalidate(stage)  # never leave an outdated stage that a later run could trust
    print(f"[{stage}] running ({why})", file=sys.stderr, flush=True)
    peak_of = "stage" if reset_peak_rss() else "process"
    t0 = time.time()
    with run.staging(stage) as tmp:
        ctx = StageContext(cfg, run, stage, tmp, run.work_dir(stage, key), inputs, manifests)
        status, reason, metrics = "done", "", {}
        try:
            if skipped_deps:
                raise StageSkipped(f"upstream stage(s) {', '.join(skipped_deps)} skipped")
            metrics = run_with_followers(ctx)
        except StageSkipped as e:
            status, reason = "skipped", str(e)
            ctx.log(f"skipped: {reason}")
        seconds = time.time() - t0
        manifest = {
            "stage": stage,
            "kind": f"trtspec/{stage}",
            "status": status,
            "reason": reason,
            "fingerprint": fp,
            "config": _section_values(cfg, stage),
            "from_auto": [k for k in cfg._from_auto if {k, k.partition(".")[0]} & set(contract(stage).READS)],
            "inputs": upstream,
            **({"chat_template_sha256": template_stamp(cfg)}  # what its rows were rendered with, wherever the file is
               if "model" in contract(stage).READS and cfg.model.chat_template else {}),
            "versions": package_versions(),
            "wall_s": round(seconds, 2),
            "peak_rss_gib": peak_rss_gib(),
            "peak_rss_of": peak_of,  # "stage": this stage's own peak; "process": the build's so far (no reset here)
            "created": time.time(),
            "pid": os.getpid(),
            "metrics": metrics,
        }
        run.commit(stage, tmp, manifest)
    return StageResult(stage, status, seconds, str(metrics.get("headline", "")), reason)


NO_SPACE = ("no space left on device", "os error 28", "errno 28")
NEARLY_FULL = 1 << 20  # bytes free below which a write that failed is taken for a full disk


def disk_full(e: BaseException, run_path: Path, stage: str) -> DiskFull | None:
    """A stage's failure as the full disk it was, or None. Libraries report one in their own words (an OSError with
    ENOSPC, safetensors' "os error 28", torch.save's "file write failed" with no errno), so any failure but our own
    counts as one when its words say so or the run's disk has (nearly) nothing left."""
    if isinstance(e, (TrtspecError, KeyboardInterrupt)):
        return None
    chain = [x for x in (e, e.__cause__, e.__context__) if x is not None]
    said = any(w in str(x).lower() for x in chain for w in NO_SPACE) or any(getattr(x, "errno", None) == errno.ENOSPC for x in chain)
    free = shutil.disk_usage(run_path).free if run_path.is_dir() else None
    if not (said or (free is not None and free < NEARLY_FULL)):
        return None
    return DiskFull(stage, run_path)


def format_exception_line(e: BaseException) -> str:
    """What the summary table says about a failed stage: our errors' own message; for anything else the message
    (the class name only when there is none). `--debug` shows the traceback."""
    if isinstance(e, TrtspecError):
        return e.message
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
