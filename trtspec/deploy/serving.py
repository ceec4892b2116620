"""Serving files for a bundle: the LLM-API options (one source of truth), trtllm-serve, Triton, vLLM and SGLang.

The options dict below is written once as `llm_api_options.yaml`; `trtllm-serve --config`, the Triton
`model.yaml` and the engine stage's `LLM(...)` call all read that same content. Paths in the bundle are
relative to the bundle folder (the scripts `cd` there first), so the bundle can be copied anywhere.
Facts about the file formats, with the upstream source files they were read from: tests/contracts/trtllm_api.json.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from trtspec.deploy.compat import ENGINES_CHECKED, vllm_aux_ids
from trtspec.draft_schedule import (
    SWEEP_FILE,
    schedule_problem,
    with_schedule_trtllm,
)
from trtspec.engines import OPTIONS_FILE, read_options
from trtspec.engines import vllm as vllm_engine
from trtspec.engines.measured import provenance
from trtspec.errors import ArtifactError

if TYPE_CHECKING:
    from trtspec.draft_family import ExportableDraft

TRITON_MARKER = "trtspec-triton.json"
TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3"  # any tag whose TensorRT-LLM is >= 1.0

# Triton model `tensorrt_llm` (LLM-API Python backend), as in TensorRT-LLM's
# triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt: (name, data_type, dims, optional)
TRITON_INPUTS = [
    ("text_input", "TYPE_STRING", [-1], False),
    ("streaming", "TYPE_BOOL", [1], True),
    ("sampling_param_best_of", "TYPE_INT32", [1], True),
    ("sampling_param_temperature", "TYPE_FP32", [1], True),
    ("sampling_param_top_k", "TYPE_INT32", [1], True),
    ("sampling_param_top_p", "TYPE_FP32", [1], True),
    ("sampling_param_frequency_penalty", "TYPE_FP32", [1], True),
    ("sampling_param_presence_penalty", "TYPE_FP32", [1], True),
    ("sampling_param_max_tokens", "TYPE_INT32", [1], True),
    ("sampling_param_stop", "TYPE_STRING", [-1], True),
    ("sampling_param_seed", "TYPE_UINT64", [1], True),
    ("sampling_param_exclude_input_from_output", "TYPE_BOOL", [1], True),
    ("sampling_param_return_perf_metrics", "TYPE_BOOL", [1], True),
    ("return_finish_reason", "TYPE_BOOL", [1], True),
    ("return_stop_reason", "TYPE_BOOL", [1], True),
    ("return_cumulative_logprob", "TYPE_BOOL", [1], True),
    ("stop", "TYPE_BOOL", [1], True),
]
# every output the container's model.py may send (it sends the perf ones when return_perf_metrics is set)
TRITON_OUTPUTS = [
    ("text_output", "TYPE_STRING", [-1]),
    ("finish_reason", "TYPE_STRING", [-1]),
    ("stop_reason", "TYPE_STRING", [-1]),
    ("cumulative_logprob", "TYPE_FP32", [-1]),
    ("kv_cache_reused_block", "TYPE_INT32", [-1]),
    ("kv_cache_missed_block", "TYPE_INT32", [-1]),
    ("kv_cache_alloc_new_blocks", "TYPE_INT32", [-1]),
    ("kv_cache_alloc_total_blocks", "TYPE_INT32", [-1]),
    ("kv_cache_hit_rate", "TYPE_FP32", [-1]),
    ("arrival_time_ns", "TYPE_INT64", [1]),
    ("first_scheduled_time_ns", "TYPE_INT64", [1]),
    ("first_token_time_ns", "TYPE_INT64", [1]),
    ("last_token_time_ns", "TYPE_INT64", [1]),
    ("acceptance_rate", "TYPE_FP32", [1]),
    ("total_accepted_draft_tokens", "TYPE_INT32", [1]),
    ("total_draft_tokens", "TYPE_INT32", [1]),
]


def speculative_options(cfg, draft_rel: str = "./draft", decoding: str | None = None,
                        aux_layers: list[int] | None = None, draft_family: ExportableDraft | None = None) -> dict[str, Any]:
    """`speculative_config` for the LLM API (field names of TensorRT-LLM 1.2/main; see trtllm.py for older ones):
    n-gram, draft-target and suffix decoding here, the bundle's own draft by its family (`draft_family.trtllm_spec`;
    `aux_layers`: the target layers an EAGLE-3 head was trained on)."""
    s, d = cfg.serve, cfg.draft
    decoding = decoding or s.decoding
    if decoding == "ngram":
        return {"decoding_type": "NGram", "max_draft_len": d.length, "max_matching_ngram_size": s.ngram_max_matching}
    if decoding == "draft_target":
        return {"decoding_type": "DraftTarget", "max_draft_len": d.length, "speculative_model": draft_rel}
    if decoding == "suffix":
        return speculative_options_sa(d.suffix_len or d.length)
    if draft_family is None:
        raise ValueError("speculative_options: serving the bundle's own draft needs its draft family")
    return draft_family.trtllm_spec(cfg, draft_rel, aux_layers)


def dtypes_differ(info: dict | None) -> bool:
    """Target and draft run in different dtypes (a quantized target counts): KV block reuse is then advised off."""
    if not info:
        return False
    return info.get("target_dtype") != info.get("draft_dtype") or info.get("quant_format", "none") != "none"


def llm_api_options(cfg, draft_rel: str = "./draft", info: dict | None = None, decoding: str | None = None,
                    draft_family: ExportableDraft | None = None) -> dict:
    """The LLM-API options the bundle is served with (trtllm-serve --config, Triton model.yaml, engine stage);
    `draft_family` serves the bundle's own draft (serve.decoding: draft)."""
    s = cfg.serve
    return {
        "speculative_config": speculative_options(cfg, draft_rel, decoding, (info or {}).get("aux_layers"), draft_family),
        "kv_cache_config": {
            "enable_block_reuse": bool(s.block_reuse and not dtypes_differ(info)),
            "free_gpu_memory_fraction": s.gpu_memory_fraction,
        },
        "tensor_parallel_size": s.tensor_parallel_size,
        "max_batch_size": s.max_batch_size,
    }


# --- file writers ---------------------------------------------------------------------------------

OPTIONS_HEADER = """\
# TensorRT-LLM LLM-API options for this bundle (PyTorch backend, EAGLE-3). Paths are relative to this folder.
# Used by: serve.sh (trtllm-serve --config), triton/tensorrt_llm/1/model.yaml, and `trtspec engine`.
# TensorRT-LLM releases before Eagle3DecodingConfig/speculative_model: use `decoding_type: Eagle` and
# `speculative_model_dir:` instead (the newer releases accept both spellings as aliases).
"""

SERVE_SH = """\
#!/usr/bin/env bash
# OpenAI-compatible server for this bundle: TensorRT-LLM PyTorch backend with the EAGLE-3 draft.
#   ./serve.sh                      # http://0.0.0.0:8000/v1
#   PORT=9000 ./serve.sh --log_level info
# Multi-GPU: tensor_parallel_size is in llm_api_options.yaml; trtllm-serve starts its own workers.
# On a Slurm/multi-node cluster: srun ... trtllm-llmapi-launch ./serve.sh  (or mpirun -n N trtllm-llmapi-launch ...)
set -euo pipefail
cd "$(dirname "$0")"
flag=--config
# releases before 1.1 only know --extra_llm_api_options (newer ones accept both)
trtllm-serve serve --help 2>/dev/null | grep -q -- "--config" || flag=--extra_llm_api_options
exec trtllm-serve {target} "$flag" {options} --host "${{HOST:-0.0.0.0}}" --port "${{PORT:-8000}}" "$@"
"""

VLLM_SH = """\
#!/usr/bin/env bash
# vLLM serving the target with this EAGLE-3 draft: OpenAI API on http://${{HOST:-127.0.0.1}}:${{PORT:-8000}}/v1.
#   GPU: pip install vllm        CPU: vLLM's CPU build (trtspec: bash scripts/setup.sh --engines vllm), then e.g.
#        VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND=0-1 ./snippets/vllm.sh   (2 cores: bind both)
# vLLM reads the aux layers from draft/config.json's top-level eagle_aux_hidden_state_layer_ids (its numbering).
# --dtype: the target's own (vLLM's "auto" downcasts a float32 model to bf16/fp16, another model than the validated).
# python -m ...api_server rather than `vllm serve`: the CLI entry point needs the distribution to be named `vllm`,
# and the CPU build's is `vllm-cpu`. Checked with: {checked}
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m vllm.entrypoints.openai.api_server --model ./target --dtype {dtype} --tensor-parallel-size {tp} \\
  --speculative-config '{spec}' --host "${{HOST:-127.0.0.1}}" --port "${{PORT:-8000}}" "$@"
"""




SPECULATORS_SH = """\
#!/usr/bin/env bash
# The draft in speculators' format (what vLLM users keep on the hub), written to ./draft-speculators.
# pip install speculators. Its converter reads no aux layers from the draft: they are passed here, in vLLM's
# numbering; it keeps d2t only because the draft also carries t2d. Checked with: {checked}
set -euo pipefail
cd "$(dirname "$0")/.."
exec speculators convert ./draft --algorithm eagle3 --verifier ./target --output-path ./draft-speculators \\
  --algorithm-kwargs '{kwargs}' "$@"
"""

LAUNCH_SH = """\
#!/usr/bin/env bash
# Triton Inference Server with TensorRT-LLM's LLM-API Python backend, in NVIDIA's container.
#   ./launch.sh                 # HTTP on :8000, gRPC on :8001, metrics on :8002
#   TRITON_IMAGE=nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3 ./launch.sh
#   TRITON_ARGS="--trace-config triton,file=/deploy/trace.json --trace-config level=TENSORS --trace-config rate=1" \\
#     ./launch.sh               # more tritonserver options: this one writes each request's prompt to trace.json in
#                               # the folder mounted as /deploy, for `trtspec adapt RUN --prompts trace.json`
# Then: python scripts/triton_client.py --url localhost:8000 --prompt "Name three colors."
# model.py/helpers.py of the `tensorrt_llm` model ship in the container (all_models/llmapi); they are
# copied next to model.yaml at start. Paths in model.yaml are relative to this folder (the server's cwd).
set -euo pipefail
here="$(cd "$(dirname "$0")/{up}" && pwd)"
image="${{TRITON_IMAGE:-{image}}}"
exec docker run --rm --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 \\
  -e TRTLLM_LLMAPI_MODEL_DIR -e TRITON_ARGS -p 8000:8000 -p 8001:8001 -p 8002:8002 -v "$here":/deploy -w /deploy "$image" bash -c '
    set -e
    src="${{TRTLLM_LLMAPI_MODEL_DIR:-$(dirname "$(find / -path "*all_models/llmapi/tensorrt_llm/1/model.py" -print -quit 2>/dev/null)")}}"
    [ -f "$src/model.py" ] || {{ echo "no all_models/llmapi/tensorrt_llm/1/model.py in this image; set TRTLLM_LLMAPI_MODEL_DIR" >&2; exit 3; }}
    rm -rf /tmp/repo && cp -r {repo} /tmp/repo && cp "$src"/*.py /tmp/repo/tensorrt_llm/1/
    exec tritonserver --model-repository=/tmp/repo $TRITON_ARGS'
"""


def _pbtxt() -> str:
    def block(name: str, dtype: str, dims: list[int], optional: bool = False) -> str:
        opt = "\n    optional: true" if optional else ""
        return f'  {{\n    name: "{name}"\n    data_type: {dtype}\n    dims: [ {", ".join(map(str, dims))} ]{opt}\n  }}'

    inputs = ",\n".join(block(*row) for row in TRITON_INPUTS)
    outputs = ",\n".join(block(*row) for row in TRITON_OUTPUTS)
    return (
        "# TensorRT-LLM LLM-API model for Triton (Python backend). max_batch_size and decoupled live in\n"
        "# 1/model.yaml (triton_config); model.py/helpers.py come from NVIDIA's TensorRT-LLM Triton container.\n"
        'name: "tensorrt_llm"\nbackend: "python"\n\n'
        "instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]\n\n"
        f"input [\n{inputs}\n]\n\noutput [\n{outputs}\n]\n"
    )


def triton_model_yaml(options: dict, model_rel: str = "./target", decoupled: bool = False) -> dict:
    """model.yaml: the LLM arguments (same options as llm_api_options.yaml) plus triton_config.

    decoupled: the model may send several responses per request, which the llmapi model.py needs to stream (its
    `streaming` input); Triton then serves it through gRPC streams and HTTP generate_stream only, not /infer."""
    return {
        "model": model_rel,
        "backend": "pytorch",
        **options,
        # Triton-level batching: the llmapi model takes one prompt per request (max_batch_size 0, as in
        # TensorRT-LLM's template); the LLM engine still batches concurrent requests up to max_batch_size.
        "triton_config": {"max_batch_size": 0, "decoupled": decoupled},
    }


def write_model_repo(repo: Path, options: dict, decoupled: bool = False) -> list[Path]:
    """A Triton model repository with one model `tensorrt_llm` (config.pbtxt + 1/model.yaml)."""
    model_dir = repo / "tensorrt_llm"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(_pbtxt())
    (model_dir / "1" / "model.yaml").write_text(
        "# LLM arguments for TensorRT-LLM's llmapi Triton model; paths are relative to the server's working dir.\n"
        + yaml.safe_dump(triton_model_yaml(options, decoupled=decoupled), sort_keys=False)
    )
    return [model_dir / "config.pbtxt", model_dir / "1" / "model.yaml"]


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def write_snippets(folder: Path, options: dict, draft_family: ExportableDraft, dtype: str = "auto",
                   skip: set[str] = frozenset(), variant: dict | None = None) -> list[Path]:
    """vllm.sh, sglang.sh and speculators.sh for the bundle's `draft_family` draft, less those of the engines in `skip`
    (which cannot load the draft). `variant`: the draft's EAGLE-3.1 switches (fc_norm, norm_output) that are on, which
    speculators' converter takes as arguments (vLLM reads them from the draft's config.json)."""
    spec = options["speculative_config"]
    k, tp = spec["max_draft_len"], options.get("tensor_parallel_size", 1)
    aux = spec.get("eagle3_layers_to_capture")
    kwargs = json.dumps({**({"eagle_aux_hidden_state_layer_ids": vllm_aux_ids(aux)} if aux else {}), **(variant or {})})
    fam, kind = draft_family, spec["decoding_type"]
    vllm_sh = VLLM_SH.format(tp=tp, dtype=dtype, spec=json.dumps(vllm_engine.from_options(options)), checked=ENGINES_CHECKED["vLLM"])
    vllm_sh = vllm_sh.replace("set -euo pipefail", fam.vllm_note(kind) + "set -euo pipefail", 1)
    scripts = {
        "vLLM": ("vllm.sh", vllm_sh),
        "SGLang": ("sglang.sh", fam.sglang_script(kind, tp, k)),
        "speculators": ("speculators.sh", SPECULATORS_SH.format(kwargs=kwargs, checked=ENGINES_CHECKED["speculators"])),
    }
    return [_script(folder / name, text) for engine, (name, text) in scripts.items() if engine not in skip]


def write_serving_files(bundle_dir: Path, cfg, info: dict, draft_family: ExportableDraft,
                        skip: set[str] = frozenset()) -> list[str]:
    """Write llm_api_options.yaml, serve.sh, triton/ and snippets/ for the bundle's `draft_family` draft into the
    bundle; returns relative paths."""
    bundle_dir = Path(bundle_dir)
    options = llm_api_options(cfg, "./draft", info, decoding="draft", draft_family=draft_family)
    (bundle_dir / OPTIONS_FILE).write_text(OPTIONS_HEADER + yaml.safe_dump(options, sort_keys=False))
    written = [bundle_dir / OPTIONS_FILE, _script(bundle_dir / "serve.sh", SERVE_SH.format(target="./target", options=OPTIONS_FILE))]
    written += write_model_repo(bundle_dir / "triton", options)
    written.append(_script(bundle_dir / "triton" / "launch.sh", LAUNCH_SH.format(image=TRITON_IMAGE, repo="triton", up="..")))
    variant = {key: True for key in ("fc_norm", "norm_output") if info.get(key)}
    written += write_snippets(bundle_dir / "snippets", options, draft_family, info.get("target_dtype", "auto"), skip, variant)
    return [p.relative_to(bundle_dir).as_posix() for p in written]


# --- trtspec deploy triton ------------------------------------------------------------------------


def _link_or_copy(src: str, dst: str) -> None:
    """Hard link when on the same filesystem (no extra disk), else copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ArtifactError(f"'{out}' is a file", "choose another --out folder")
    if out.is_dir() and any(out.iterdir()) and not (out / TRITON_MARKER).is_file():
        raise ArtifactError(
            f"'{out}' exists, is not empty and is not a trtspec Triton repository; refusing to write into it",
            "choose an empty or new --out folder",
        )


REPORT_NAMES = {"speculative": "eagle3", "suffix": "suffix", "eagle3_suffix": "eagle3_suffix"}  # validate's -> ours


def drafting_options(options: dict, method: str, serves: list[str], suffix_len: int | None = None) -> dict:
    """The bundle's LLM-API options serving one drafting method: the EAGLE-3 head alone, suffix-automaton drafting
    alone (SADecodingConfig), or a suffix match in front of the head (EAGLE-3 with sa_config). `serves`: the methods
    the bundle's draft family serves besides suffix drafting alone (DraftFamily.drafting, in the export's manifest)."""
    spec = dict(options["speculative_config"])
    if method == "suffix":  # suffix-automaton drafting alone serves with any bundle
        return {**options, "speculative_config": speculative_options_sa(suffix_len or spec["max_draft_len"])}
    if method not in serves:
        raise ArtifactError(f"the bundle serves {spec.get('decoding_type')} drafting; --drafting {method} needs another "
                            f"bundle (this one serves {', '.join((*serves, 'suffix'))})", "leave --drafting at auto")
    if method == "eagle3_suffix" and "sa_config" not in spec:
        raise ArtifactError("the bundle was exported without suffix drafting in front of the head",
                            "set draft.suffix_len > 0 and re-run export and validate")
    if method == "eagle3":
        spec.pop("sa_config", None)
    return {**options, "speculative_config": spec}


def speculative_options_sa(max_draft_len: int) -> dict:
    # SADecodingConfig; -1: the longest suffix match, not a fixed n-gram size
    return {"decoding_type": "SA", "max_draft_len": max_draft_len, "max_matching_ngram_size": -1}


def measured_drafting(run: Any) -> tuple[str | None, int | None, str]:
    """(the fastest drafting validate measured on this bundle, its suffix length, why) -- (None, None, why) when
    validate did not compare methods or its report is older than the bundle."""
    from trtspec.artifacts import output_fingerprint, read_json

    m, export = run.manifest("validate"), run.manifest("export")
    if not m or m.get("status") != "done" or not export:
        return None, None, "no finished validate stage: the bundle's own drafting"
    if m.get("inputs", {}).get("export") != output_fingerprint(export):
        return None, None, "validate measured an older bundle: the bundle's own drafting"
    folder, _ = run.require("validate", verify=True)  # an edited report is refused by name, never served
    report = read_json(folder / "report.json")
    drafting = report.get("drafting")
    if not drafting:
        return None, None, "validate compared no drafting methods (draft.suffix_len: 0): the bundle's own drafting"
    own = report.get("draft_method", "eagle3")  # "speculative" is the bundle's own draft: EAGLE-3 or DFlash
    names = {**REPORT_NAMES, "speculative": own}
    fastest = names[drafting["fastest"]]
    speeds = ", ".join(f"{names[k]} {v['tokens_per_s']:.1f}" for k, v in drafting["methods"].items())
    if fastest == "eagle3_suffix" and own != "eagle3":
        return None, None, (f"validate measured suffix matching in front of the {own} draft fastest ({speeds}), which "
                            "the engines do not serve together: the bundle's own drafting")
    return fastest, drafting.get("suffix_len"), f"the fastest validate measured (tokens/s: {speeds})"


def verified_sweep_folders(run: Any) -> list[Path]:
    """The folders holding a sweep.json that their manifest vouches for: the engine stage's and RUN/bench (written by
    the bench scripts, trtspec.engines.vllm.sweep.save_sweep). An edited, added or unmanifested sweep is refused by name."""
    from trtspec.artifacts import read_json, sha256_file

    folders = []
    if (m := run.manifest("engine")) and m.get("status") == "done" and (run.stage_dir("engine") / SWEEP_FILE).is_file():
        folders.append(run.require("engine", verify=True)[0])
    bench = run.path / "bench"
    if (bench / SWEEP_FILE).is_file():
        if not (bench / "manifest.json").is_file():
            raise ArtifactError(f"'{bench / SWEEP_FILE}' has no manifest (bench/manifest.json) vouching for it",
                                "measure it again with the bench script (it writes both), or delete it")
        want = (read_json(bench / "manifest.json").get("files") or {}).get(SWEEP_FILE) or {}
        if sha256_file(bench / SWEEP_FILE) != want.get("sha256"):
            raise ArtifactError(f"'{bench / SWEEP_FILE}' no longer matches what the bench script wrote (checksum "
                                "differs)", "measure it again, or delete it")
        folders.append(bench)
    return folders


TRITON_SERVES = "trtllm/gpu"  # the engine and device class a Triton repository's schedule is served on


def measured_schedule(run: Any, options: dict, schedule_from: str | None = None) -> tuple[dict[int, int] | None, str]:
    """(the draft length per batch size a serving sweep measured on this very bundle, why): the engine stage's
    (engine.sweep) or scripts/bench_serving.py's (RUN/bench), the newer of those that measured this export. (None,
    why) when there is none, only of another bundle, the bundle has a schedule of its own, it does not draft
    EAGLE-3, or the sweep ran on another engine or device class than Triton's TensorRT-LLM on a GPU (where
    speculation stops paying depends on both) and `schedule_from` does not name exactly where it ran."""
    from trtspec.artifacts import output_fingerprint, read_json

    spec = options["speculative_config"]
    if spec.get("decoding_type") != "Eagle3" or spec.get("draft_len_schedule"):
        return None, ""
    paths = [folder / SWEEP_FILE for folder in verified_sweep_folders(run)]
    if not paths:
        return None, ""
    bundle = output_fingerprint(run.manifest("export"))
    sweeps = sorted(((p.stat().st_mtime, p, read_json(p)) for p in paths), key=lambda t: t[0], reverse=True)
    current = [(p, s) for _, p, s in sweeps if s.get("bundle") == bundle]
    if not current:
        return None, f"; {sweeps[0][1]} measured an older bundle: no schedule"
    path, sweep = current[0]
    if not sweep.get("schedule"):
        return None, f"; {path}: {sweep.get('decided', 'no schedule')}"
    where = sweep.get("measured_on")
    if provenance(where) not in (TRITON_SERVES, schedule_from):
        place = f"in {where['engine']} {where['version']} on {where['device_name']}" if where else "where it does not say"
        return None, (f"; {path}'s schedule was measured {place}, and Triton serves TensorRT-LLM on a GPU: not served "
                      f"(--schedule-from {provenance(where)} serves it there anyway)")
    schedule = {int(b): int(k) for b, k in sweep["schedule"].items()}
    if why := schedule_problem(schedule, schedule.get(1, 0)):
        raise ArtifactError(f"'{path}' holds a schedule the engines refuse: {why}", "measure the sweep again")
    return schedule, f"; draft length by batch size {schedule} from {path} ({sweep.get('decided', '')})"


def write_triton_repo(run_dir: Path, out: Path, drafting: str = "auto", streaming: bool = False,
                      measured: bool = False, schedule_from: str | None = None) -> dict:
    """A self-contained Triton deployment of RUN_DIR's bundle: weights, model_repo/, launch.sh.

    drafting: auto = the method validate measured fastest on this bundle (else the bundle's own), with the draft
    length per batch size a sweep measured on it where that method is plain EAGLE-3; or one of eagle3, suffix,
    eagle3_suffix, at the bundle's fixed length. measured: plain EAGLE-3 with the measured draft length per batch
    size, whichever method validate found fastest. streaming: a decoupled model (see triton_model_yaml).
    schedule_from: where a measured schedule may come from besides TensorRT-LLM on a GPU ('vllm/cpu'), asked for by
    name."""
    from trtspec.artifacts import RunDir, write_json

    if measured and drafting not in ("auto", "eagle3"):
        raise ArtifactError(f"--measured-schedule serves EAGLE-3's measured draft lengths; --drafting {drafting} drafts "
                            "another way", "leave --drafting at auto or eagle3")
    run = RunDir(run_dir)
    if not run.is_run():
        raise ArtifactError(f"'{run_dir}' is not a trtspec run directory", "pass the --out folder of `trtspec build`")
    bundle, manifest = run.require("export", verify=True)  # never serve a hand-edited bundle
    if no_engine := manifest.get("metrics", {}).get("no_engine"):
        raise ArtifactError(no_engine)
    for part in ("target/config.json", "draft/config.json", OPTIONS_FILE):
        if not (bundle / part).is_file():
            raise ArtifactError(f"the bundle in '{bundle}' has no {part}", f"re-run `trtspec export CONFIG --out {run_dir} --force`")
    options = read_options(bundle)
    method, suffix_len, why = measured_drafting(run)
    if measured:
        method, why = "eagle3", "--measured-schedule"
    elif drafting != "auto":
        method, why = drafting, "--drafting"
    if method:
        if (serves := manifest.get("metrics", {}).get("drafting")) is None:
            raise ArtifactError(f"the bundle in '{bundle}' does not say which drafting methods it serves (an export of "
                                "an earlier trtspec)", f"re-run `trtspec export CONFIG --out {run_dir} --force`")
        options = drafting_options(options, method, serves, suffix_len)
    if drafting == "auto" or measured:
        schedule, sweep_why = measured_schedule(run, options, schedule_from)
        if measured and not schedule:
            raise ArtifactError(f"--measured-schedule: no draft length per batch size was measured on this bundle where Triton "
                                f"serves it{sweep_why}", f"run `trtspec engine CONFIG --out {run_dir} --set 'engine.sweep=[1, 4, "
                                "16, 32]'` first, or name where a sweep ran with --schedule-from")
        if schedule and method not in (None, "eagle3"):  # EAGLE-3's draft lengths: said, not served with another method
            why += (f"; the measured draft length by batch size {schedule} is EAGLE-3's alone (measured in vLLM, which "
                    f"serves no suffix matching in front of EAGLE-3): not served with {method} (--measured-schedule "
                    "serves it with EAGLE-3 alone)")
        else:
            why += sweep_why
            if schedule:
                options = {**options, "speculative_config": with_schedule_trtllm(options["speculative_config"], schedule,
                                                                                        options["max_batch_size"])}
    out = Path(out)
    _check_out(out)
    for name in ("target", "draft", "model_repo"):
        shutil.rmtree(out / name, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("target", "draft"):
        shutil.copytree(bundle / name, out / name, copy_function=_link_or_copy)
    files = write_model_repo(out / "model_repo", options, decoupled=streaming)
    files.append(_script(out / "launch.sh", LAUNCH_SH.format(image=TRITON_IMAGE, repo="model_repo", up=".")))
    served = options["speculative_config"]
    write_json(out / TRITON_MARKER, {"kind": "trtspec-triton", "bundle": str(bundle.resolve()), "format": 1,
                                     "drafting": method or "bundle", "why": why, "decoupled": streaming})
    usage = (
        f"{out / 'launch.sh'}   # starts tritonserver in {TRITON_IMAGE}\n"
        + ("python scripts/triton_client.py --url localhost:8001 --protocol grpc --stream --prompt 'Name three colors.'"
           if streaming else "python scripts/triton_client.py --url localhost:8000 --prompt 'Name three colors.'")
    )
    return {
        "out": str(out),
        "files": [str(p) for p in [out / "target", out / "draft", *files, out / TRITON_MARKER]],
        "image": TRITON_IMAGE,
        "drafting": {"method": method or "bundle", "decoding_type": served.get("decoding_type"),
                     "sa_config": "sa_config" in served, "draft_len_schedule": served.get("draft_len_schedule"),
                     "why": why},
        "usage": usage,
    }
