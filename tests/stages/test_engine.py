"""Engine stage control flow with the test double of tensorrt_llm (tests/fake_trtllm) — no TensorRT-LLM runs here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from trtllm_helpers import CONTRACT, fake_trtllm, make_bundle, make_cfg, purge_trtllm  # noqa: F401 - fixture

from trtspec import engines
from trtspec.artifacts import RunDir
from trtspec.engines import trtllm
from trtspec.engines import vllm as vllm_engine
from trtspec.errors import ArtifactError
from trtspec.pipeline.stage import StageContext, StageSkipped
from trtspec.stages import engine


def ctx_for(tmp_path, cfg, bundle):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return StageContext(cfg, RunDir(tmp_path / "run"), "engine", out, tmp_path, {"export": bundle}, {})


@pytest.fixture
def gpu(monkeypatch):
    """Pretend a CUDA GPU is present (the fake runs on the CPU)."""
    monkeypatch.setattr(trtllm, "cuda_available", lambda: True)
    monkeypatch.setattr(trtllm, "gpu_memory_used_gib", lambda: 1.5)


def test_skipped_without_tensorrt_llm(tmp_path, monkeypatch):
    purge_trtllm()
    monkeypatch.setattr(trtllm, "installed", lambda: False)
    monkeypatch.setattr(trtllm, "cuda_available", lambda: True)
    cfg = make_cfg(tmp_path)
    with pytest.raises(StageSkipped, match=r"tensorrt_llm is not installed \(pip install trtspec\[trtllm\]"):
        engine.run(ctx_for(tmp_path, cfg, tmp_path))
    assert engine.environment_key() == {"tensorrt_llm": None, "vllm": vllm_engine.version(), "cuda": True}


def test_skipped_without_gpu_and_doctor_agrees(tmp_path, fake_trtllm, monkeypatch):  # noqa: F811
    fake_trtllm("1.2.0")
    monkeypatch.setattr(trtllm, "cuda_available", lambda: False)
    with pytest.raises(StageSkipped, match="no CUDA GPU"):
        engine.run(ctx_for(tmp_path, make_cfg(tmp_path), tmp_path))
    from trtspec.doctor import diagnose

    assert diagnose()["stages"]["engine (trtllm)"] == trtllm.availability() == (False, "no CUDA GPU")
    # a machine that gains TensorRT-LLM gets another fingerprint, so the stage is re-attempted
    assert engine.environment_key() == {"tensorrt_llm": "1.2.0", "vllm": vllm_engine.version(), "cuda": False}


def test_vllm_backend_skipped_without_vllm_and_doctor_agrees(tmp_path, monkeypatch):
    from trtspec.doctor import diagnose
    from trtspec.engines import vllm as vl

    monkeypatch.setattr(vl, "installed", lambda: False)
    cfg = make_cfg(tmp_path, engine={"backend": "vllm"})
    with pytest.raises(StageSkipped, match=r"vllm is not installed \(bash scripts/setup.sh --engines vllm"):
        engine.run(ctx_for(tmp_path, cfg, tmp_path))
    assert diagnose()["stages"]["engine (vllm)"] == vl.availability()


def test_auto_backend_takes_tensorrt_llm_with_a_gpu_else_vllm_else_skips(tmp_path, monkeypatch):
    """engine.backend: auto -- TensorRT-LLM where it and a GPU exist, vLLM where only vLLM is, a skip naming both."""
    for trt, cuda, vllm, want in ((True, True, True, "trtllm"), (True, False, True, "vllm"), (False, True, True, "vllm"),
                                  (True, True, False, "trtllm")):
        monkeypatch.setattr(trtllm, "installed", lambda trt=trt: trt)
        monkeypatch.setattr(trtllm, "version", lambda: "1.2.0")
        monkeypatch.setattr(trtllm, "cuda_available", lambda cuda=cuda: cuda)
        monkeypatch.setattr(vllm_engine, "installed", lambda vllm=vllm: vllm)
        assert engines.resolve("auto")[0].SHORT == want, (trt, cuda, vllm)
    # a named backend is never swapped for the other
    assert engines.resolve("vllm")[0] is None and engines.resolve("trtllm")[0] is trtllm
    monkeypatch.setattr(trtllm, "cuda_available", lambda: False)
    monkeypatch.setattr(vllm_engine, "installed", lambda: False)
    cfg = make_cfg(tmp_path, engine={"backend": "auto"})
    with pytest.raises(StageSkipped, match=r"no CUDA GPU; vllm is not installed"):
        engine.run(ctx_for(tmp_path, cfg, tmp_path))


def test_vllm_acceptance_from_its_counters():
    """10 verify steps drafting 3 each; 12 draft tokens accepted: 6 at position 1, 4 at 2, 2 at 3."""
    from trtspec.engines.vllm import acceptance

    before = {"drafts": 5, "draft_tokens": 15, "accepted": 3, "accepted_per_pos": [2, 1, 0]}
    after = {"drafts": 15, "draft_tokens": 45, "accepted": 15, "accepted_per_pos": [8, 5, 2]}
    acc = acceptance(before, after)
    assert acc["acceptance_length"] == 2.2 and acc["per_position"] == [0.6, 0.4, 0.2]
    assert acc["drafts"] == 10 and acc["draft_tokens"] == 30 and acc["accepted_draft_tokens"] == 12


def test_crossover_says_where_speculation_stops_paying():
    spec = {"tokens_per_s": {1: 44.1, 32: 110.0}, "latency_ms": {1: {"ttft_ms": 90.0, "itl_ms": 21.0}, 32: {"ttft_ms": 700.0, "itl_ms": 140.0}}}
    speed = engine.speed_table(spec, {"tokens_per_s": {1: 27.0, 32: 172.0}}, {1: 20.0, 32: 100.0}, "vllm")
    assert speed["1"]["speedup_vs_vllm"] == 1.633 and speed["32"]["speedup_vs_vllm"] == 0.64
    assert (speed["32"]["ttft_ms"], speed["32"]["itl_ms"]) == (700.0, 140.0) and "vllm_base_ttft_ms" not in speed["32"]
    assert engine.crossover(speed, "vllm") == "pays at 1 concurrent request(s); costs at 32 (0.64x)"


@pytest.mark.parametrize("version", ["1.0.0", "1.3.0.dev"])
def test_llm_api_run_with_fake(tmp_path, fake_trtllm, gpu, tiny_model_dir, version):  # noqa: F811
    fake_trtllm(version)
    from tensorrt_llm.llmapi.llm import CALLS

    CALLS.clear()
    cfg = make_cfg(tmp_path, model=str(tiny_model_dir), eval={"num_prompts": 2, "max_new_tokens": 8}, engine={"batch_sizes": [1, 2]},
                   draft={"length": 4})
    bundle = make_bundle(tmp_path / "bundle", cfg, target_from=tiny_model_dir)
    m = engine.run(ctx_for(tmp_path, cfg, bundle))

    spec_call, base_call = CALLS[0], CALLS[-1]
    assert set(k for k, v in spec_call.items() if v is not None) <= set(CONTRACT["llm_kwargs"]["fields"])
    assert type(spec_call["speculative_config"]).__name__ == ("EagleDecodingConfig" if version == "1.0.0" else "Eagle3DecodingConfig")
    assert spec_call["model"] == str(bundle / "target")
    assert base_call["speculative_config"] is None
    # the fake decodes with HF on the same weights: agreement must be exact, the counters consistent
    assert m["greedy_vs_hf"]["exact"] == m["greedy_vs_hf"]["total"] == 2
    assert m["greedy_vs_trtllm_base"]["exact_fraction"] == 1.0
    # fake: each step accepts max_draft_len // 2 = 2 tokens, so AL = 1 + 2 = 3 when no step is cut short
    assert 1.0 < m["acceptance_length"] <= 3.0
    assert m["accepted_draft_tokens"] <= m["draft_tokens"]
    assert set(m["speed"]) == {"1", "2"} and m["speed"]["1"]["tokens_per_s"] > 0
    assert m["gpu_memory_gib"] == 1.5 and m["versions"]["tensorrt_llm"] == version
    assert "AL" in m["headline"] and "2/2" in m["headline"]


def test_stale_bundle_options_refused(tmp_path, fake_trtllm, gpu):  # noqa: F811
    fake_trtllm("1.2.0")
    bundle = make_bundle(tmp_path / "bundle", make_cfg(tmp_path, draft={"length": 3}))
    with pytest.raises(ArtifactError, match="other engine settings"):
        engine.run(ctx_for(tmp_path, make_cfg(tmp_path, draft={"length": 5}), bundle))


def test_ngram_runs_on_the_llm_api(tmp_path, fake_trtllm, gpu, tiny_model_dir):  # noqa: F811
    """Draft-target and n-gram drafting are served on the LLM API's PyTorch backend (the engine backend is gone)."""
    fake_trtllm("1.3.0.dev")
    from tensorrt_llm.llmapi.llm import CALLS

    CALLS.clear()
    cfg = make_cfg(tmp_path, model=str(tiny_model_dir), serve={"decoding": "ngram"}, eval={"num_prompts": 1, "max_new_tokens": 4},
                   engine={"batch_sizes": [1]})
    bundle = make_bundle(tmp_path / "bundle", cfg, target_from=tiny_model_dir)
    m = engine.run(ctx_for(tmp_path, cfg, bundle))
    assert type(CALLS[0]["speculative_config"]).__name__ == "NGramDecodingConfig"
    assert m["greedy_vs_hf"]["exact"] == m["greedy_vs_hf"]["total"] == 1


def test_acceptance_math():
    def out(accepted, drafted):
        spec = SimpleNamespace(total_accepted_draft_tokens=accepted, total_draft_tokens=drafted)
        return SimpleNamespace(outputs=[SimpleNamespace(request_perf_metrics=SimpleNamespace(speculative_decoding=spec))])

    # 10 steps of 4 drafted tokens with 20 accepted: 3 tokens per step
    acc = trtllm.acceptance([out(12, 24), out(8, 16)], 4)
    assert acc["acceptance_length"] == 3.0 and acc["acceptance_rate"] == 0.5
    no_metrics = SimpleNamespace(outputs=[SimpleNamespace(request_perf_metrics=None)])
    assert trtllm.acceptance([no_metrics], 4)["acceptance_length"] is None


def test_engine_command_exits_3_when_skipped(tmp_path, monkeypatch):
    from trtspec.cli import main
    from trtspec.pipeline import runner as pipeline

    def fake_build(cfg, out, start=None, until=None, force=False, on_result=None):
        on_result(pipeline.StageResult("engine", "skipped", 0.0, "", "tensorrt_llm is not installed (pip install trtspec[trtllm])"))

    monkeypatch.setattr(pipeline, "run_build", fake_build)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data:\n  sources:\n    - {kind: jsonl, path: x.jsonl}\n")
    r = CliRunner().invoke(main, ["engine", str(cfg), "--out", str(tmp_path / "run")])
    assert r.exit_code == 3
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: engine skipped: tensorrt_llm is not installed (pip install trtspec[trtllm])"]


def test_a_sweep_runs_in_the_groups_the_free_memory_holds_and_is_refused_below_two_engines(tmp_path, monkeypatch, tiny_model_dir):
    """engine.sweep loads its draft lengths' engines together: each its weights (the checkpoint's size), KV cache and
    vLLM's own ~1 GiB. All four where the memory holds them (0: no groups); in groups of what it holds (each beside no
    draft: sweep.groups_of); refused in one line naming the sizes where it cannot hold no draft and one length."""
    from trtspec.errors import ConfigError
    from trtspec.runtime import kernels

    cfg = make_cfg(tmp_path, model=str(tiny_model_dir), engine={"backend": "vllm", "sweep": [1, 4]}, draft={"length": 3})
    monkeypatch.setattr(kernels, "available_memory_mb", lambda: 64 * 1024.0)
    assert engine.engines_that_fit(cfg) == 0
    engine.check_sweep_memory(cfg)
    monkeypatch.setattr(kernels, "available_memory_mb", lambda: 3 * 1024.0)
    assert engine.engines_that_fit(cfg) == 2  # 4 engines of ~1.1 GiB: two at a time, [0, 1], [0, 2], [0, 3]
    engine.check_sweep_memory(cfg)
    monkeypatch.setattr(kernels, "available_memory_mb", lambda: 1.5 * 1024.0)
    with pytest.raises(ConfigError, match=r"engine.sweep compares each draft length with no draft, two vLLM engines of the "
                                          r"target at once, about [\d.]+ GiB .* more than the memory free here holds"):
        engine.check_sweep_memory(cfg)


def test_free_ports_are_chosen_where_no_other_socket_is_handed_one():
    """free_port chooses below the kernel's ephemeral range (where bind(0) and connect() never hand a port out), free
    when chosen, not by the random module's seed (two test workers seeded alike would choose alike)."""
    import random
    import socket

    from trtspec.engines.vllm.sweep import LOWEST_PORT, ephemeral_ports, free_port

    random.seed(0)
    ports = [free_port() for _ in range(20)]
    random.seed(0)
    assert [free_port() for _ in range(20)] != ports
    span = ephemeral_ports()
    if span and span[0] > LOWEST_PORT + 1000:  # Linux's default range (32768-60999) or one like it
        assert all(LOWEST_PORT <= p < span[0] for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))
