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
    drafts, or that vLLM does not run on this machine."""
    from trtspec.engines import vllm as vllm_engine
    from trtspec.targets import family_of

    return vllm_engine.build_refusal(family_of(model_config).name, "eagle3")


def check_engine_states(model_config: Any) -> None:
    """train.states_from: vllm refused in one line before any stage spends minutes: vLLM missing (exit 3), a
    family it cannot extract from (exit 2)."""
    require_vllm()
    if why := refusal(model_config):
        raise ConfigError(f"train.states_from: vllm cannot extract this target's states: {why}",
                          "set train.states_from: hf (the HF forward in the training process)")


class VllmStates:
    """States of token-id rows from vLLM (in this process), as fp16 numpy rows like HFStates'.

    `folder` holds vLLM's per-request files only until each is read (a window at a time); `final_norm` is the
    target's final norm (a torch module) that turns the last layer's output into the post-norm state."""

    name = "vllm"
    batch_rows = 128  # rows cache_states hands over at once: vLLM schedules them itself, and each call has a fixed cost

    def __init__(self, model_dir: Path, aux_layers: list[int], num_layers: int, final_norm: Any, folder: Path,
                 dtype: str, max_len: int, kv_cache_gib: float = 1.0, max_num_seqs: int = 16,
                 engine_args: dict | None = None):
        require_vllm()
        if bad := [a for a in aux_layers if not 0 <= a < num_layers - 1]:
            raise ConfigError(f"aux layers {bad} are not inside the target's {num_layers} layers (0..{num_layers - 2})",
                              "fix convert.aux_layers")
        self.ids = extraction_ids(aux_layers, num_layers)
        self.aux_at = [self.ids.index(a + 1) for a in aux_layers]
        self.last_at = self.ids.index(num_layers)
        self.final_norm = final_norm
        self.folder = Path(folder)
        self.engine_args = dict(model=str(model_dir), dtype=dtype, max_model_len=max_len, max_num_seqs=max_num_seqs,
                                kv_cache_gib=kv_cache_gib)
        self.extra = dict(engine_args or {})  # train.states_engine: vLLM's parallelism
        self.llm: Any = None  # loaded on the first extract: a cache already complete loads no engine
        self.peak_disk = 0

    def load(self) -> Any:
        import torch

        from trtspec.engines import vllm as vllm_engine

        a = self.engine_args
        shutil.rmtree(self.folder, ignore_errors=True)  # files of a killed run: never read as this run's
        try:
            self.folder.mkdir(parents=True)
        except OSError as e:
            raise ConfigError(f"cannot write vLLM's hidden states to '{self.folder}': {e.strerror}",
                              "point TRTSPEC_CACHE or the run directory at a writable disk") from e
        kv = vllm_engine.prepare_environment(a["kv_cache_gib"])
        gpu = torch.cuda.is_available()
        connector = ({"kv_connector": GPU_CONNECTOR} if gpu else
                     {"kv_connector": CPU_CONNECTOR[0], "kv_connector_module_path": CPU_CONNECTOR[1]})
        from vllm import LLM

        return LLM(
            model=a["model"], dtype=a["dtype"], max_model_len=a["max_model_len"], max_num_seqs=a["max_num_seqs"],
            enforce_eager=not gpu, seed=0, **kv, **self.extra,
            speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": self.ids}}},
            kv_transfer_config={**connector, "kv_role": "kv_producer",
                                "kv_connector_extra_config": {"shared_storage_path": str(self.folder),
                                                              "use_synchronization_lock": False}})

    def extract(self, rows: list[Any]) -> list[tuple[Any, Any]]:
        """[(aux [n, A*H], last [n, H]) as fp16 numpy] for each row of token ids; each file is deleted once read."""
        from vllm import SamplingParams

        if self.llm is None:
            self.llm = self.load()
        outs = self.llm.generate([{"prompt_token_ids": [int(t) for t in r]} for r in rows], SamplingParams(max_tokens=1),
                                 use_tqdm=False)
        paths = [Path(o.kv_transfer_params["hidden_states_path"]) for o in outs]
        self.flush(paths)
        self.peak_disk = max(self.peak_disk, sum(p.stat().st_size for p in self.folder.glob("*.safetensors")))
        return [self.read(p, r) for p, r in zip(paths, rows, strict=True)]

    def flush(self, paths: list[Path]) -> None:
        """In one process, vLLM writes a finished request's states on its next scheduler step: step it until every
        file is there."""
        for _ in range(8):
            if all(p.is_file() for p in paths):
                return
            self.llm.llm_engine.step()
        missing = [p.name for p in paths if not p.is_file()]
        raise ArtifactError(f"vLLM wrote no hidden states for {len(missing)} requests ({missing[0]}, ...)",
                            "check that the KV-transfer connector loaded (vLLM's log), or set train.states_from: hf")

    def read(self, path: Path, row: Any) -> tuple[Any, Any]:
        import torch
        from safetensors.torch import load_file

        data = load_file(str(path))
        path.unlink()
        Path(str(path) + ".lock").unlink(missing_ok=True)
        if data["token_ids"].tolist() != [int(t) for t in row]:
            raise DataError(f"vLLM's hidden states in {path.name} are of other token ids than the data stage's row",
                            "the target vLLM loaded is not the one trained on: rebuild the data stage or set "
                            "train.states_from: hf")
        hs = data["hidden_states"].float()
        aux = torch.cat([hs[:, i] for i in self.aux_at], dim=-1)
        with torch.no_grad():
            weight = next(self.final_norm.parameters(), None)
            last = self.final_norm(hs[:, self.last_at].to(weight.dtype if weight is not None else hs.dtype)).float()
        return aux.to(torch.float16).numpy(), last.to(torch.float16).numpy()

    def close(self) -> None:
        import gc

        from trtspec.engines import vllm as vllm_engine

        if self.llm is not None:
            vllm_engine.shutdown(self.llm)
            self.llm = None
            gc.collect()
        shutil.rmtree(self.folder, ignore_errors=True)


class EngineTarget:
    """The target as the trainer sees it when the engine that serves it computes every state (train.states_from:
    vllm): greedy answers from vLLM's offline engine (trtspec.answering) and their states from the extraction
    (`source`, a VllmStates), in the shape build_eval_set's HF path gives. The trainer then holds no decoder layer of
    the target (models.load_model layers=False)."""

    def __init__(self, model_dir: Path, dtype: str, source: Any, eos: set[int]):
        self.model_dir, self.dtype, self.source, self.eos = Path(model_dir), dtype, source, eos

    def greedy_answers(self, tok: Any, rows: list[dict], max_new_tokens: int, batch_size: int = 16) -> list[dict]:
        """{input_ids: prompt + answer, start, category} per prompt row, as acceptance.greedy_answers."""
        import torch

        from trtspec.answering import answer_vllm
        from trtspec.chat import encode_prompt

        prompts = [encode_prompt(tok, r["messages"]) for r in rows]
        answers = dict(answer_vllm(self.model_dir, self.dtype, prompts, max_new_tokens, self.eos, 0.0))
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
