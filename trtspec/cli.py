"""The `trtspec` command: a thin Click layer over trtspec.pipeline.runner and the stages.

Results go to stdout (tables, or JSON with --json); progress and status go to stderr.
Errors raised on purpose (trtspec.errors) become one `Error: ...` line and their exit code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from trtspec.config import DRAFTING, STAGES
from trtspec.errors import exit_with_one_line
from trtspec.traffic import FORMATS

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}
EXIT_CODES_HELP = "Exit codes: 0 ok, 1 validation gate missed, 2 bad input, 3 missing dependency, 4 run dir locked, 5 out of memory or disk."


class Group(click.Group):
    """Turns our exceptions into one line (the traceback only with --debug)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except SystemExit:
            raise
        except BaseException as e:  # noqa: BLE001 - the CLI boundary: everything becomes one line
            exit_with_one_line(e, bool(ctx.obj and ctx.obj.get("debug")))


@click.group(cls=Group, context_settings=CONTEXT, epilog=EXIT_CODES_HELP)
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="trtspec")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """trtspec: a Hugging Face causal LM in, a validated EAGLE-3 speculative-decoding bundle for TensorRT-LLM out.

    \b
    Examples:
      trtspec build build_configs/smollm2-135m-eagle3.yaml --out runs/demo
      trtspec inspect runs/demo
      trtspec doctor
    """
    ctx.obj = {"debug": debug}


def _print_summary(results, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in results], indent=2))
        return
    click.echo(f"{'stage':<10} {'status':<8} {'time':>8}  headline")
    for r in results:
        text = r.headline or r.reason
        click.echo(f"{r.stage:<10} {r.status:<8} {r.seconds:>7.1f}s  {text}")


def _build(config, out, overrides, start, until, force, as_json, stage_command: bool = False, check: bool = False) -> None:
    from trtspec import ranks
    from trtspec.config import load_config
    from trtspec.pipeline.runner import check_build, follow_build, resolve_engines, run_build

    cfg = resolve_engines(load_config(config, overrides))
    if check:
        from trtspec import resources

        stages = check_build(cfg, out, start=start, until=until, force=force)
        est = resources.estimate(cfg, Path(out), stages)
        click.echo(json.dumps({"ok": True, "would_run": stages, "resources": est}) if as_json else
                   "\n".join([f"config, inputs and model checked; would run: {', '.join(stages) or 'nothing (all finished)'}",
                              *resources.lines(est)]))
        return
    if not ranks.is_main():  # a multi-process launch: rank 0 runs the build, this rank joins its training
        follow_build(cfg)
        return
    done = []
    try:
        run_build(cfg, out, start=start, until=until, force=force, on_result=done.append)
    finally:
        if done:
            click.echo("", err=True)
            _print_summary(done, as_json)
    if any(r.status == "failed" for r in done):
        sys.exit(1)
    if stage_command:
        _exit_if_skipped(done, until, out)


def _exit_if_skipped(done, stage: str, out) -> None:
    """`trtspec <stage>` whose stage was skipped (no GPU, no tensorrt_llm): one line and exit code 3."""
    from trtspec.artifacts import RunDir
    from trtspec.errors import MissingDependency

    r = next((r for r in done if r.stage == stage), None)
    if r is None:
        return
    skipped = r.status == "skipped" or (r.status == "cached" and (RunDir(out).manifest(stage) or {}).get("status") == "skipped")
    if skipped:
        click.echo(f"Error: {stage} skipped: {r.reason}", err=True)
        sys.exit(MissingDependency.exit_code)


def _common_build_options(f):
    f = click.option("--json", "as_json", is_flag=True, help="Print the stage summary as JSON.")(f)
    f = click.option("--force", is_flag=True, help="Redo the stages even if their manifests match.")(f)
    f = click.option(
        "--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config value (repeatable)."
    )(f)
    f = click.option("--out", "-o", type=click.Path(file_okay=False), default="runs/default", show_default=True,
                     help="Run directory (created; resumed when it exists).")(f)
    f = click.argument("config", type=click.Path(dir_okay=False))(f)
    return f


@main.command(context_settings=CONTEXT)
@_common_build_options
@click.option("--from", "start", metavar="STAGE", help=f"Redo from this stage on ({', '.join(STAGES)}).")
@click.option("--until", metavar="STAGE", help="Stop after this stage.")
@click.option("--check", is_flag=True, help="Check the config, the files and model it names and the run directory, "
              "as the build does before its first stage; run no stage.")
def build(config, out, overrides, force, as_json, start, until, check):
    """Run the whole pipeline: data, convert, train, quantize, export, engine, validate.

    Finished stages whose config and inputs did not change are skipped; a killed run resumes.

    \b
    Examples:
      trtspec build build_configs/smollm2-135m-eagle3.yaml --out runs/demo
      trtspec build build_configs/smollm2-135m-eagle3.yaml --out runs/demo --set train.epochs=2
      trtspec build build_configs/smollm2-135m-eagle3.yaml --out runs/demo --from train --until export
      trtspec build build_configs/smollm2-135m-eagle3.yaml --out runs/demo --check --set data.seq_len=512
    """
    _build(config, out, overrides, start, until, force, as_json, check=check)


def _stage_command(stage: str, doc: str):
    def command(config, out, overrides, force, as_json):
        # a stage command runs what it needs upstream (skipping finished stages), then the stage
        _build(config, out, overrides, stage if force else None, stage, False, as_json, stage_command=True)

    command.__doc__ = (
        f"{doc}\n\n    Runs missing upstream stages first; --force redoes this stage.\n\n    \b\n    Example:\n"
        f"      trtspec {stage} build_configs/smollm2-135m-eagle3.yaml --out runs/demo\n"
    )
    return main.command(name=stage, context_settings=CONTEXT)(_common_build_options(command))


_stage_command("data", "Build the training conversations (regenerated by the target, or read from files).")
_stage_command("convert", "Attach an EAGLE-3 head to the base model with modelopt (mtsp.convert).")
_stage_command("train", "Train the EAGLE-3 draft head with the base frozen (HF Trainer).")
_stage_command("quantize", "Post-training quantization of the base model with modelopt (mtq).")
_stage_command("export", "Export target + draft checkpoints, ONNX of the head, and the deployment bundle.")
_stage_command("engine", "Run the bundle in a serving engine and measure it: TensorRT-LLM (a GPU), or vLLM (engine.backend=vllm).")
_validate = _stage_command("validate", "Check outputs equal the PyTorch model's, and measure acceptance and speedup.")
# gates (and the prompt file) map onto validate.* config keys, so build and validate share one code path
for _flag, _key, _type in (
    ("--require-exact", "require_exact", None),
    ("--min-speedup", "min_speedup", float),
    ("--min-acceptance-length", "min_acceptance_length", float),
    ("--prompts", "prompts", click.Path(dir_okay=False)),
):
    _validate.params.append(
        click.Option([_flag], is_flag=_type is None, default=None, type=_type,
                     help=(f"Sets validate.{_key} (exit 1 when missed)." if _key != "prompts" else "Sets eval.prompts: JSONL (prompt or chat turns) or text.")))


def _validate_callback(config, out, overrides, force, as_json, require_exact, min_speedup, min_acceptance_length, prompts):
    sets = list(overrides)
    for key, value in (("require_exact", require_exact), ("min_speedup", min_speedup),
                       ("min_acceptance_length", min_acceptance_length)):
        if value:
            sets.append(f"validate.{key}={str(value).lower() if isinstance(value, bool) else value}")
    if prompts:
        sets.append(f"eval.prompts={Path(prompts).resolve()}")
    _build(config, out, sets, "validate" if force else None, "validate", False, as_json, stage_command=True)


_validate.callback = _validate_callback


@main.command(context_settings=CONTEXT)
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--prompts", "prompts", required=True, type=click.Path(dir_okay=False),
              help="Prompts the service received: chat JSONL or a JSON array (messages, prompt, a dataset's "
              "conversations or a Responses API request; category), an OpenAI batch file, a vLLM request log "
              "(--enable-log-requests --log-level DEBUG), an SGLang one (--log-requests --log-requests-level 3 "
              "--log-requests-format json) or a Triton trace (--trace-config level=TENSORS; FILE or the "
              "FILE.0, FILE.1, ... of its log-frequency); gzip, bzip2 or xz-compressed or not.")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="The new run directory.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="auto",
              show_default=True, help="The --prompts file's format.")
@click.option("--category", help="Category of the prompts that name none (default: traffic).")
@click.option("--epochs", type=click.FloatRange(min=0.01, max=1000), default=2.0, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True, max=1), default=3e-4, show_default=True,
              help="Learning rate (the earlier draft's is usually higher: this is a fine-tune).")
@click.option("--replay", type=click.FloatRange(min=0, max=1000), default=10.0, show_default=True,
              help="Earlier training rows trained on again per traffic training row, as many as the earlier run "
              "has (what keeps old categories from falling).")
@click.option("--holdout", type=click.FloatRange(min=0.01, max=0.9), default=0.2, show_default=True,
              help="Share of the traffic's prompts held out and measured, never trained on.")
@click.option("--grow-vocab", type=click.IntRange(min=0, max=65536), default=None,
              help="Tokens added to the draft's vocabulary: the traffic answers' most frequent ones it cannot draft "
              "(draft.grow_vocab). Default: 1024 for an EAGLE-3 draft with a compressed vocabulary, else 0.")
@click.option("--step-back", "step_back", default="0.75,0.5,0.25", show_default=True, metavar="SHARES",
              help="When a category falls: drafts these shares of the way from the earlier draft to the fine-tune "
              "are measured in turn, the first that passes kept (draft.step_back); 'none' = refuse at once.")
@click.option("--tolerance", type=click.FloatRange(min=0, max=1), default=None,
              help="Relative held-out AL drop per category that refuses the adapted draft (default: the earlier "
              "run's validate.baseline_tolerance).")
@click.option("--until", metavar="STAGE", default="export", show_default=True, help="Stop after this stage.")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config value.")
@click.option("--json", "as_json", is_flag=True, help="Print the stage summary as JSON.")
def adapt(run_dir, prompts, out, fmt, category, epochs, lr, replay, holdout, grow_vocab, step_back, tolerance, until, overrides,
          as_json):
    """Adapt a run's draft to the prompts its service received: answered again by the target, trained on from
    the run's draft (a warm start), every category measured before and after on held-out rows; a draft that falls
    behind on any category is refused, so no bundle is written from it.

    The new run's config is written to OUT/adapt/adapt.yaml (rerun the command, or `trtspec build` on it, to resume).

    \b
    Examples:
      trtspec adapt runs/demo --prompts traffic.jsonl --out runs/demo-adapted
      trtspec adapt runs/demo --prompts vllm.log --format vllm-log --category support --out runs/demo-support
      trtspec adapt runs/demo --prompts sglang.log --out runs/demo-sglang     # SGLang's JSON request log
      trtspec adapt runs/demo --prompts /tmp/trace.json --out runs/demo-triton    # tritonserver's TENSORS trace
      trtspec adapt runs/demo --prompts batch.jsonl --out runs/a2 --epochs 1 --until validate
    """
    from trtspec.adapt import AdaptOptions, prepare, shares

    o = AdaptOptions(fmt=fmt, category=category, epochs=epochs, lr=lr, replay=replay, holdout=holdout,
                     grow_vocab=grow_vocab, step_back=shares(step_back), tolerance=tolerance)
    config, summary = prepare(Path(run_dir), Path(prompts), Path(out), o, overrides)
    click.echo(f"{summary['prompts']} prompts ({summary['format']}; categories {', '.join(summary['categories'])})"
               + (f", skipped: {summary['skipped']}" if summary["skipped"] else "") + f"; config {config}", err=True)
    _build(config, out, (), None, until, False, as_json)


@main.command(name="states-server", context_settings=CONTEXT)
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="The run directory (convert done).")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config value.")
@click.option("--json", "as_json", is_flag=True, help="Print the launch line and where it writes as JSON.")
def states_server(config, out, overrides, as_json):
    """Print the launch line of the states server (vLLM's OpenAI server) a build with train.states_from: endpoint reads: the
    target with vLLM's extraction of the layers the run's draft reads (known once its convert stage ran), writing
    each request's states into train.states_endpoint.folder, on the port of train.states_endpoint.url. Start it
    where the target fits (its GPUs; train.states_engine's parallelism is in the line), then run the build.

    \b
    Examples:
      trtspec build build_configs/smollm2-135m-demo.yaml --out runs/demo --until convert \\
          --set train.states_from=endpoint --set train.mode=streamed --set train.states_endpoint.folder=/shared/states
      trtspec states-server build_configs/smollm2-135m-demo.yaml --out runs/demo --set train.states_from=endpoint ...
    """
    from trtspec.artifacts import RunDir
    from trtspec.config import load_config
    from trtspec.draft_families import check_recipe, family
    from trtspec.models import resolve_model
    from trtspec.targets import read_family, text_config
    from trtspec.training.engine_states import server_launch_line

    cfg = load_config(config, overrides)
    check_recipe(cfg, str(config))
    model_path = resolve_model(cfg.model.source)
    read_family(model_path)
    convert, _ = RunDir(Path(out)).require("convert", verify=True)
    fam = family(cfg.draft.method)
    aux = fam.state_layers(fam.read_config(convert))
    from transformers import AutoConfig

    layers = text_config(AutoConfig.from_pretrained(model_path)).num_hidden_layers
    line = server_launch_line(cfg, model_path, aux, layers)
    if as_json:
        click.echo(json.dumps({"launch": line, "url": cfg.train.states_endpoint.url,
                               "folder": cfg.train.states_endpoint.folder, "aux_layers": aux}, indent=2))
    else:
        click.echo(line)


@main.command(context_settings=CONTEXT)
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the manifests as JSON.")
def inspect(run_dir, as_json):
    """Show what each stage of a run produced: status, time, headline metrics, versions.

    A stage whose manifest is unreadable or whose files differ from it is shown as corrupted, and the command then
    exits 2 naming the file.

    \b
    Example:
      trtspec inspect runs/demo --json
    """
    from trtspec.inspect import damage, inspect_run

    info = inspect_run(Path(run_dir))
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
    else:
        click.echo(f"run directory: {run_dir}")
        click.echo(f"{'stage':<10} {'status':<10} {'time':>8}  headline")
        for row in info["stages"]:
            click.echo(f"{row['stage']:<10} {row['status']:<10} {row.get('wall_s', 0):>7.1f}s  {row.get('headline', '')}")
        if info.get("versions"):
            click.echo("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    if error := damage(info):
        raise error


@main.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def doctor(as_json):
    """Report package/CUDA/GPU versions and which stages can run on this machine, and why not.

    \b
    Example:
      trtspec doctor --json
    """
    from trtspec.doctor import diagnose

    info = diagnose()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    for k, v in info["versions"].items():
        click.echo(f"{k:<16} {v}")
    click.echo("")
    for stage, (ok, why) in info["stages"].items():
        click.echo(f"{stage:<16} {'yes' if ok else 'no ':<4} {why}")


@main.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print the families as JSON.")
def families(as_json):
    """List the decoder families trtspec drafts for: the runtime path validate serves each with, and which engines
    serve an EAGLE-3 or DFlash draft for it (vLLM, SGLang and TensorRT-LLM by their sources: trtspec.engines). `model.source: tiny:FAMILY` builds a
    tiny random model of one in code.

    \b
    Examples:
      trtspec families
      trtspec families --json
      trtspec build build_configs/tiny-families.yaml --out runs/gemma3 --set model.source=tiny:gemma3
    """
    from trtspec.engines import matrix_rows

    rows = matrix_rows()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    yes = lambda ok: "yes" if ok else "no"  # noqa: E731
    click.echo(f"{'family':<12} {'runtime':<8} {'vLLM EAGLE-3':<13} {'vLLM DFlash':<12} {'vLLM CPU':<9} {'vLLM states':<12} "
               f"{'SGLang EAGLE-3':<15} TensorRT-LLM EAGLE-3")
    for r in rows:
        click.echo(f"{r['family']:<12} {r['runtime']:<8} {yes(r['vllm_eagle3']):<13} {yes(r['vllm_dflash']):<12} "
                   f"{yes(r['vllm_cpu']):<9} {yes(r['vllm_states']):<12} {yes(r['sglang_eagle3']):<15} "
                   f"{r['trtllm_eagle3'] or 'not served'}")


@main.group(cls=Group, context_settings=CONTEXT)
def deploy():
    """Write serving files for a finished run (Triton model repository)."""


@deploy.command(name="triton", context_settings=CONTEXT)
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--out", "-o", "out", type=click.Path(file_okay=False), required=True, help="Model repository to write.")
@click.option("--drafting", type=click.Choice(("auto", *DRAFTING)), default="auto", show_default=True,
              help="auto: the drafting validate measured fastest on this bundle (EAGLE-3, suffix, or suffix in front of "
                   "EAGLE-3; the bundle's own without a comparison), with the draft length per batch size a serving "
                   "sweep measured on it (engine.sweep, scripts/bench_serving.py); or name one (fixed length).")
@click.option("--measured-schedule", "measured", is_flag=True,
              help="Serve plain EAGLE-3 with the draft length per batch size the engine stage's sweep (engine.sweep) "
                   "or a bench script measured on this bundle, even where validate found another method fastest "
                   "at one request; refused in one line when none was measured.")
@click.option("--schedule-from", "schedule_from", type=click.Choice(("vllm/cpu", "vllm/gpu", "trtllm/cpu")),
              help="Also serve a draft-length schedule measured on this engine/device (a sweep records where it ran); "
                   "by default only one measured in TensorRT-LLM on a GPU is served, as Triton serves it there.")
@click.option("--streaming", is_flag=True,
              help="A decoupled model (model.yaml triton_config): answers stream step by step through gRPC streams and "
                   "HTTP generate_stream; plain HTTP/gRPC infer then refuse it.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def deploy_triton(run_dir, out, drafting, measured, schedule_from, streaming, as_json):
    """Write a Triton model repository (TensorRT-LLM LLM-API backend) for RUN_DIR's bundle.

    \b
    Examples:
      trtspec deploy triton runs/demo --out model_repo
      trtspec deploy triton runs/demo --out model_repo --drafting suffix
      trtspec deploy triton runs/demo --out model_repo --measured-schedule
      trtspec deploy triton runs/demo --out model_repo --measured-schedule --schedule-from vllm/cpu
      trtspec deploy triton runs/demo --out model_repo --streaming
    """
    from trtspec.deploy.serving import write_triton_repo

    info = write_triton_repo(Path(run_dir), Path(out), drafting, streaming, measured, schedule_from)
    d = info["drafting"]
    click.echo(json.dumps(info, indent=2) if as_json else "\n".join(
        [f"wrote {p}" for p in info["files"]] + [f"drafting: {d['method']} ({d['decoding_type']}"
                                                  f"{' + sa_config' if d['sa_config'] else ''}): {d['why']}"]))


if __name__ == "__main__":
    main()
