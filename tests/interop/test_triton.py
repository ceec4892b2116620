"""A real Triton Inference Server loads the repository `trtspec deploy triton` writes, as written, with a stand-in for
NVIDIA's LLM-API model.py (triton_standin/model.py: the same inputs, outputs and transaction policy, answered by
trtspec's runtime); scripts/triton_client.py talks to it over HTTP and gRPC, streaming and not."""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from triton_harness import (
    ROOT,
    ServerError,
    binary,
    free_port,
    group_alive,
    kill,
    missing,
    running,
    stage_repository,
    start,
    stop,
)

from trtspec.deploy.serving import LAUNCH_SH, TRITON_INPUTS, TRITON_OUTPUTS

if missing():
    pytest.skip(missing(), allow_module_level=True)

MAX_NEW = 48
K = 3


def load_client():
    spec = importlib.util.spec_from_file_location("triton_client", ROOT / "scripts" / "triton_client.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["triton_client"] = module
    spec.loader.exec_module(module)
    return module


client = load_client()


def deploy(run: Path, out: Path, *flags: str) -> Path:
    """`trtspec deploy triton RUN --out OUT` through the CLI."""
    from click.testing import CliRunner

    from trtspec.cli import main

    result = CliRunner().invoke(main, ["deploy", "triton", str(run), "--out", str(out), *flags])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def deployments(ci_run, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("triton")
    return {"plain": deploy(ci_run, root / "plain"), "streaming": deploy(ci_run, root / "streaming", "--streaming")}


def serve(deployment: Path, tmp: Path, *args: str):
    return running(stage_repository(deployment / "model_repo", tmp / "repo"), deployment, tmp / "server.log", args=args)


def tracing(trace: Path) -> tuple[str, ...]:
    """The request trace launch.sh's comment shows in TRITON_ARGS (the input tensors of every request), into `trace`,
    a file a request (trace.json.0, .1, ...) so that a test reads it while the server runs."""
    documented = re.search(r'TRITON_ARGS="([^"]+)"', LAUNCH_SH).group(1)
    return (*documented.replace("/deploy/trace.json", str(trace)).split(), "--trace-config", "triton,log-frequency=1")


@pytest.fixture(scope="module")
def server(deployments, tmp_path_factory):
    """The plain repository's server, tracing its requests' tensors into `server.trace` (what `trtspec adapt` reads)."""
    tmp = tmp_path_factory.mktemp("plain-server")
    with serve(deployments["plain"], tmp, *tracing(tmp / "trace.json")) as s:
        s.trace = tmp / "trace.json"
        yield s


@pytest.fixture(scope="module")
def streaming_server(deployments, tmp_path_factory):
    with serve(deployments["streaming"], tmp_path_factory.mktemp("streaming-server")) as s:
        yield s


@pytest.fixture(scope="module")
def prompts(ci_run) -> list[str]:
    """Four of the head's training prompts, chat-formatted as text (the llmapi model applies no template)."""
    from trtspec.models import load_tokenizer

    tok = load_tokenizer(ci_run / "bundle" / "target")
    rows = [json.loads(line) for line in (ci_run / "data" / "train.jsonl").read_text().splitlines() if line.strip()]
    return [tok.apply_chat_template(r["messages"][:-1], tokenize=False, add_generation_prompt=True) for r in rows[:4]]


@pytest.fixture(scope="module")
def reference(ci_run, prompts) -> dict[str, list]:
    """HF generate's greedy answers on the original model (as text) and trtspec's runtime's draft counters in this
    process, on the token ids the model tokenizes the prompt texts to."""
    import torch

    from trtspec.eagle.runtime import load_eagle3_drafter
    from trtspec.generation import eos_ids, hf_greedy
    from trtspec.models import load_model, load_tokenizer, resolve_model
    from trtspec.runtime import DraftSpec, load_transformer, speculative_decode

    bundle = ci_run / "bundle"
    tok = load_tokenizer(bundle / "target")
    eos = eos_ids(bundle / "target", tok)
    ids = [tok(p)["input_ids"] for p in prompts]
    model = load_model(resolve_model("demo:smollm2-135m-instruct"), "float32", "cpu")
    texts = [tok.decode(hf_greedy(model, [p], MAX_NEW, eos)[0], skip_special_tokens=True) for p in ids]
    target, _ = load_transformer(bundle / "target")
    drafter = load_eagle3_drafter(bundle / "draft", target)
    counts = []
    for p in ids:
        g = speculative_decode(target, drafter, torch.tensor(p), MAX_NEW, DraftSpec(shape="chain", k=K), eos)
        counts.append((sum(g.stats.accepted), sum(g.stats.drafted)))
    return {"texts": texts, "counts": counts}


def ask(s, prompt: str, protocol: str = "http", stream: bool = False, **kw):
    return client.ask(s.grpc_url if protocol == "grpc" else s.http_url, prompt, protocol, max_tokens=MAX_NEW,
                      stream=stream, timeout_s=120, **kw)


# --- the repository as written ---------------------------------------------------------------------


def test_the_repository_loads_as_written(server, streaming_server, deployments):
    """The server's own view of the model: the written inputs and outputs, and model.yaml's transaction policy."""
    meta = json.loads(server.get("/v2"))
    assert meta["name"] == "triton" and meta["version"] == "2.51.0"
    for s, name in ((server, "plain"), (streaming_server, "streaming")):
        config = json.loads(s.get("/v2/models/tensorrt_llm/config"))
        assert [i["name"] for i in config["input"]] == [row[0] for row in TRITON_INPUTS]
        assert [o["name"] for o in config["output"]] == [row[0] for row in TRITON_OUTPUTS]
        written = yaml.safe_load((deployments[name] / "model_repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())
        assert config["model_transaction_policy"]["decoupled"] is written["triton_config"]["decoupled"] is (name == "streaming")
        assert config["max_batch_size"] == written["triton_config"]["max_batch_size"]
    print(f"tritonserver {meta['version']}: repository ready in {server.load_s:.1f} s (plain), "
          f"{streaming_server.load_s:.1f} s (streaming)")


# --- answers -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_greedy_answers_equal_hf_generate_with_the_draft_counters(server, prompts, reference, protocol):
    """Each prompt alone: the text of HF generate's greedy tokens, and the request's draft counters as trtspec's
    runtime counts them on the same prompt (TensorRT-LLM's accepted/drafted totals)."""
    answers = [ask(server, p, protocol) for p in prompts]
    assert [a.text for a in answers] == reference["texts"]
    for a, (accepted, drafted) in zip(answers, reference["counts"], strict=True):
        assert a.responses == 1 and a.finish_reason in ("stop", "length")
        assert (a.counters["total_accepted_draft_tokens"], a.counters["total_draft_tokens"]) == (accepted, drafted)
        assert a.counters["acceptance_rate"] == pytest.approx(accepted / drafted, rel=1e-6)
    accepted, drafted = (sum(c) for c in zip(*reference["counts"], strict=True))
    assert accepted > 0  # a head that drafts: the counters are not zeros passed through
    tokens_s = [a.seconds for a in answers]
    print(f"{protocol}: {len(answers)}/{len(prompts)} equal to HF; AL {1 + accepted / (drafted / K):.2f}; "
          f"seconds per answer {min(tokens_s):.2f}-{max(tokens_s):.2f}")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_streaming_sends_the_answer_step_by_step(streaming_server, prompts, reference, protocol):
    """A decoupled repository: one response per decoding step (the text so far), the last equal to HF's."""
    answers = [ask(streaming_server, p, protocol, stream=True) for p in prompts[:2]]
    assert [a.text for a in answers] == reference["texts"][:2]
    for a, (accepted, drafted) in zip(answers, reference["counts"], strict=False):
        assert 1 < a.responses <= drafted // K + 1  # several steps, no more than the runtime took
        assert a.first_response_s < a.seconds
        assert (a.counters["total_accepted_draft_tokens"], a.counters["total_draft_tokens"]) == (accepted, drafted)
    print(f"{protocol} stream: responses {[a.responses for a in answers]}, first after "
          f"{[round(a.first_response_s, 3) for a in answers]} s of {[round(a.seconds, 2) for a in answers]} s")


# --- errors the server reports, and stays up ------------------------------------------------------


def test_malformed_requests_get_tritons_error_and_the_server_stays_up(server, streaming_server, prompts, reference):
    import numpy as np
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    def infer(inputs):
        with pytest.raises(InferenceServerException) as e:
            httpclient.InferenceServerClient(server.http_url).infer("tensorrt_llm", inputs)
        return e.value.message()

    wrong_type = httpclient.InferInput("text_input", [1], "INT32")
    wrong_type.set_data_from_numpy(np.array([7], dtype=np.int32))
    assert "input 'text_input' data-type is 'INT32', but model 'tensorrt_llm' expects 'BYTES'" in infer([wrong_type])
    no_text = client.infer_inputs(httpclient, {"sampling_param_max_tokens": (8, np.int32)})
    assert "text_input" in infer(no_text)
    # the model's own refusal, sent through the response sender as NVIDIA's model.py sends it
    with pytest.raises(client.ClientError, match="Streaming is only supported in decoupled mode"):
        ask(server, prompts[0], "grpc", stream=True)
    # a decoupled model is refused on plain /infer by Triton itself
    with pytest.raises(client.ClientError, match="decoupled"):
        ask(streaming_server, prompts[0], "http")
    assert server.ready() and streaming_server.ready()
    assert ask(server, prompts[0]).text == reference["texts"][0]


def metric(text: str, name: str) -> float:
    """The sum of a Prometheus metric's samples for the tensorrt_llm model."""
    return sum(float(v) for v in re.findall(rf'^{name}{{[^}}]*model="tensorrt_llm"[^}}]*}} (\S+)$', text, re.M))


def test_prometheus_metrics_count_the_requests(server, prompts):
    """Triton's metrics port, per model: a request the model answers adds one success and its inference time. So
    does one the model refuses through its response sender (as the llmapi model.py sends its errors): Triton counts
    the execution, not the answer, so nv_inference_request_failure does not show the model's own errors. A
    decoupled model's request is counted when the model releases it, which can come just after the client has its
    last response, so the scrape waits (up to 10 s) for the count to move; for the same reason the count before is
    taken once it has stopped moving (an earlier test's request may still be on its way out)."""
    def scrape() -> str:
        return server.get("/metrics", server.metrics).decode()

    def settled() -> str:
        deadline, text = time.monotonic() + 10, scrape()
        while time.monotonic() < deadline:
            time.sleep(0.5)
            again = scrape()
            if metric(again, "nv_inference_request_success") == metric(text, "nv_inference_request_success"):
                return again
            text = again
        return text

    def scrape_after(before: str) -> str:
        deadline = time.monotonic() + 10
        while True:
            text = scrape()
            moved = metric(text, "nv_inference_request_success") > metric(before, "nv_inference_request_success")
            if moved or time.monotonic() > deadline:
                return text
            time.sleep(0.1)

    before = settled()
    ask(server, prompts[1])
    mid = scrape_after(before)
    assert metric(mid, "nv_inference_request_success") == metric(before, "nv_inference_request_success") + 1, \
        [ln for ln in (before + mid).splitlines() if ln.startswith("nv_inference_request")]
    assert metric(mid, "nv_inference_count") == metric(before, "nv_inference_count") + 1
    assert metric(mid, "nv_inference_request_duration_us") > metric(before, "nv_inference_request_duration_us")
    with pytest.raises(client.ClientError, match="decoupled"):
        ask(server, prompts[1], "grpc", stream=True)
    after = scrape_after(mid)
    assert metric(after, "nv_inference_request_success") == metric(mid, "nv_inference_request_success") + 1
    assert metric(after, "nv_inference_request_failure") == metric(mid, "nv_inference_request_failure")
    assert re.search(r"^nv_cpu_utilization \S+$", after, re.M)


def test_adapt_reads_the_prompts_back_from_the_servers_trace(server, ci_run, prompts, tmp_path):
    """Triton's own request trace (level TENSORS) as `trtspec adapt --prompts`: each chat-formatted text_input read
    back into the turns it was rendered from with the run's chat template; a raw-text request skipped, counted."""
    from trtspec.adapt import AdaptOptions, prepare

    rows = [json.loads(x) for x in (ci_run / "data" / "train.jsonl").read_text().splitlines() if x.strip()]
    sent = [r["messages"][:-1] for r in rows[:2]]  # what the prompts fixture rendered prompts[0] and [1] from
    ask(server, prompts[0])
    ask(server, prompts[1], "grpc")
    ask(server, "no chat template around this text")
    deadline = time.monotonic() + 10  # a trace is written when Triton releases its request, just after the answer
    while sum(f.read_text(errors="replace").count("no chat template around") for f in server.trace.parent.glob("trace.json.*")) < 1:
        assert time.monotonic() < deadline, "the trace of the last request was not written within 10 s"
        time.sleep(0.2)
    config, summary = prepare(ci_run, server.trace, tmp_path / "new", AdaptOptions(category="triton"))
    assert summary["format"] == "triton-trace" and summary["categories"] == ["triton"], summary
    assert summary["skipped"]["text_input the chat template did not write (raw text)"] >= 1, summary
    traffic = [json.loads(x) for x in (config.parent / "traffic.jsonl").read_text().splitlines()]
    assert all(turns in [r["messages"] for r in traffic] for turns in sent), (sent, traffic)


# --- bad inputs: one clear line each, the server always stopped -------------------------------------


def test_wrong_model_name_is_one_line(server):
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "triton_client.py"), "--url", server.http_url,
                          "--model", "tensorrt_lm", "--prompt", "hi"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("Error: ") and "tensorrt_lm" in run.stderr, run.stderr
    print(run.stderr.strip())


def test_a_folder_that_is_not_a_repository_is_one_line(deployments, tmp_path):
    """The deploy folder itself (weights, launch.sh, model_repo/) instead of its model_repo/: Triton takes its
    folders for models and fails to load them."""
    with pytest.raises(ServerError) as e:
        start(deployments["plain"], deployments["plain"], tmp_path / "server.log", timeout_s=120)
    assert "\n" not in str(e.value) and re.search(r"exited \(\d+\): .*(draft|target|model_repo)", str(e.value)), e.value
    assert not group_alive(e.value.pid)
    print(e.value)


def test_a_port_in_use_is_one_line(tmp_path):
    """Another process holds the HTTP port (an empty repository: Triton binds its ports after loading models)."""
    (tmp_path / "repo").mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        ports = (busy.getsockname()[1], free_port(), free_port())
        with pytest.raises(ServerError) as e:
            start(tmp_path / "repo", tmp_path, tmp_path / "server.log", ports=ports, timeout_s=120)
    assert "\n" not in str(e.value) and f"127.0.0.1:{ports[0]}' already in use" in str(e.value), e.value
    assert not group_alive(e.value.pid)
    print(e.value)


def test_ports_taken_after_they_were_chosen_are_chosen_again(tmp_path, monkeypatch):
    """Another process binds a free port before Triton does (a vLLM engine in the other test worker): the harness
    starts Triton again on new ports instead of failing the tests that share its server."""
    import triton_harness

    (tmp_path / "repo").mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        chosen = iter([taken])
        monkeypatch.setattr(triton_harness, "free_port", lambda: next(chosen, None) or free_port())
        server = start(tmp_path / "repo", tmp_path, tmp_path / "server.log", timeout_s=120)
    try:
        assert server.ready() and server.http != taken
    finally:
        stop(server)


def test_a_server_that_dies_mid_request_is_one_line(deployments, ci_run, tmp_path):
    """The client waiting on a long answer when the server is killed while answering it: exit 1 and one Error line."""
    from trtspec.models import load_tokenizer

    long_prompt = load_tokenizer(ci_run / "bundle" / "target").apply_chat_template(
        [{"role": "user", "content": "Count from 1 to 1000, one number per line."}], tokenize=False,
        add_generation_prompt=True)
    repo = stage_repository(deployments["plain"] / "model_repo", tmp_path / "repo")
    started = tmp_path / "request-started"
    s = start(repo, deployments["plain"], tmp_path / "server.log", env={"TRTSPEC_STANDIN_STARTED": str(started)})
    try:
        proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "triton_client.py"), "--url", s.http_url,
                                 "--max-tokens", "2000", "--prompt", long_prompt], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while not started.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the request never reached the model"
        kill(s)
        out, err = proc.communicate(timeout=300)
    finally:
        stop(s)
    assert not group_alive(s.proc.pid)
    assert proc.returncode == 1 and out == "" and err.count("\n") == 1 and err.startswith("Error: "), err
    print(err.strip())


# --- launch.sh ------------------------------------------------------------------------------------


def help_options() -> set[str]:
    """The long options `tritonserver --help` lists (it prints them on stderr)."""
    run = subprocess.run([str(binary()), "--help"], capture_output=True, text=True, timeout=60)
    return set(re.findall(r"^  (--[a-z0-9-]+)", run.stdout + run.stderr, re.M))


def tritonserver_flags(script: str) -> list[str]:
    """The flags launch.sh passes to tritonserver."""
    line = next(ln for ln in script.splitlines() if re.search(r"\btritonserver\s+--", ln))
    return re.findall(r"(--[a-z0-9-]+)", line.split("tritonserver", 1)[1])


def test_launch_sh_passes_only_options_the_real_tritonserver_has(deployments, ci_bundle):
    """Exact names: the binary (getopt) would also take an unambiguous prefix such as --model-repo, which another
    release may no longer resolve."""
    options = help_options()
    assert len(options) > 50 and "--model-repository" in options
    for script in (deployments["plain"] / "launch.sh", ci_bundle / "triton" / "launch.sh"):
        flags = tritonserver_flags(script.read_text())
        assert flags and set(flags) <= options, (script, set(flags) - options)
    # the check itself: a misspelt option is caught here, and the binary refuses it too
    bad = LAUNCH_SH.replace("tritonserver --model-repository", "tritonserver --model-repositry")
    assert set(tritonserver_flags(bad)) - options == {"--model-repositry"}
    run = subprocess.run([str(binary()), "--model-repositry=/tmp"], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "unrecognized option '--model-repositry" in run.stderr


def test_server_is_stopped_after_a_failed_start(deployments, tmp_path):
    """start() that fails leaves no process behind (the fixture's guarantee on failure)."""
    repo = stage_repository(deployments["plain"] / "model_repo", tmp_path / "repo")
    (repo / "tensorrt_llm" / "1" / "model.yaml").write_text("triton_config: {decoupled: false, max_batch_size: 0}\n")
    t0 = time.perf_counter()
    with pytest.raises(ServerError) as e:
        start(repo, deployments["plain"], tmp_path / "server.log", timeout_s=120)
    assert "\n" not in str(e.value) and "tensorrt_llm" in str(e.value) and "model" in str(e.value), e.value
    assert time.perf_counter() - t0 < 120 and not group_alive(e.value.pid)
    print(e.value)
