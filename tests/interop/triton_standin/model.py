"""Test stand-in for TensorRT-LLM's LLM-API Triton model (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py,
which ships only in NVIDIA's container): the same contract with the repository `trtspec deploy triton` writes,
answered by trtspec's own runtime (EAGLE-3 chain drafts, greedy) instead of TensorRT-LLM.

Kept from NVIDIA's model.py: model.yaml's triton_config sets `decoupled` and `max_batch_size` at load
(auto_complete_config); `model` and `speculative_config` say what to load, relative to the server's working folder;
the prompt is text, tokenized with the tokenizer's special tokens; every answer goes through the request's response
sender (one final response, or one per decoding step when `streaming` is set on a decoupled model, each carrying the
text so far); `streaming` on a non-decoupled model is refused with their message; `sampling_param_return_perf_metrics`
adds the request's draft counters. Not kept: sampling (temperature > 0 is refused), stop strings, cancellation.

Triton's Python backend stub embeds libpython and ignores PYTHONPATH: the test names the folders to import from in
TRTSPEC_STANDIN_SYS_PATH (os.pathsep-separated), put first on sys.path before anything else is imported. Where
TRTSPEC_STANDIN_STARTED names a file, the stand-in creates it when a request starts (the test's signal that the
server is busy answering).
"""

import os
import sys

sys.path[:0] = [p for p in os.environ.get("TRTSPEC_STANDIN_SYS_PATH", "").split(os.pathsep) if p]

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402
import yaml  # noqa: E402

MODEL_DIR = Path(__file__).resolve().parent
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
MAX_TOKENS = 32  # TensorRT-LLM's SamplingParams default


def model_yaml() -> dict:
    return yaml.safe_load((MODEL_DIR / os.environ.get("LLM_CONFIG_PATH", "model.yaml")).read_text())


def scalar(request, name: str, default=None):
    """A [1]-shaped optional input as a Python value (NVIDIA's get_input_scalar_by_name)."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy()
    if value.size != 1:
        raise pb_utils.TritonModelException(f"Expected a scalar tensor for tensor {name}")
    return value.item(0)


def prompt_text(request) -> str:
    tensor = pb_utils.get_input_tensor_by_name(request, "text_input")
    if tensor is None:
        raise pb_utils.TritonModelException("text_input is missing from the request")
    value = tensor.as_numpy()
    if value.ndim > 1:
        raise pb_utils.TritonModelException("The current implementation only supports text_input being a 1D tensor.")
    text = value[0]
    return text.decode("utf-8") if isinstance(text, bytes) else str(text)


def cut(tokens: list[int], max_tokens: int, eos: set[int]) -> list[int]:
    """The answer so far as the runtime returns it: up to the first eos (kept) and at most max_tokens."""
    for i, t in enumerate(tokens[:max_tokens]):
        if t in eos:
            return tokens[: i + 1]
    return tokens[:max_tokens]


class StepTap:
    """The drafter, with each decoding step's new tokens handed to `on_tokens` (the runtime gives them to the drafter
    first: the prompt's first token at start, then every step's accepted drafts and the target's own token)."""

    def __init__(self, drafter, on_tokens):
        self._drafter, self._on_tokens = drafter, on_tokens

    def __getattr__(self, name):
        return getattr(self._drafter, name)

    def start(self, prompt, first, aux):
        self._on_tokens([int(first)])
        return self._drafter.start(prompt, first, aux)

    def accepted(self, new, aux):
        self._on_tokens([int(t) for t in new])
        return self._drafter.accepted(new, aux)


class TritonPythonModel:
    @classmethod
    def auto_complete_config(cls, config):
        triton_config = model_yaml()["triton_config"]
        config.set_model_transaction_policy(dict(decoupled=bool(triton_config["decoupled"])))
        config.set_max_batch_size(int(triton_config["max_batch_size"]))
        return config

    def initialize(self, args):
        from trtspec.eagle.runtime import load_eagle3_drafter
        from trtspec.generation import eos_ids
        from trtspec.models import load_tokenizer
        from trtspec.runtime import DraftSpec, load_transformer

        llm = model_yaml()
        self.decoupled = bool(llm["triton_config"]["decoupled"])
        spec = llm["speculative_config"]
        if spec.get("decoding_type") != "Eagle3" or spec.get("use_dynamic_tree") or spec.get("sa_config"):
            raise pb_utils.TritonModelException(f"the stand-in serves linear EAGLE-3 drafts only, not {spec}")
        target = Path(llm["model"])
        self.target, _ = load_transformer(target)
        self.drafter = load_eagle3_drafter(Path(spec["speculative_model"]), self.target)
        self.spec = DraftSpec(shape="chain", k=int(spec["max_draft_len"]))
        self.tokenizer = load_tokenizer(target)
        self.eos = eos_ids(target, self.tokenizer)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self.answer(request, sender)
            except Exception as e:  # the request's error goes back to the client, as NVIDIA's model.py sends it
                text = pb_utils.Tensor("text_output", np.asarray(["N/A"], dtype=np.object_))
                sender.send(pb_utils.InferenceResponse(output_tensors=[text],
                                                       error=pb_utils.TritonError(f"Error generating request: {e}")),
                            flags=FINAL)
        return None

    def answer(self, request, sender) -> None:
        import torch

        from trtspec.runtime import speculative_decode

        if scalar(request, "stop"):
            raise pb_utils.TritonModelException("the stand-in cancels no requests")
        prompt = prompt_text(request)
        if os.environ.get("TRTSPEC_STANDIN_STARTED"):
            Path(os.environ["TRTSPEC_STANDIN_STARTED"]).touch()
        streaming = bool(scalar(request, "streaming", False))
        if streaming and not self.decoupled:
            raise pb_utils.TritonModelException("Streaming is only supported in decoupled mode.")
        if scalar(request, "sampling_param_temperature", 0.0):
            raise pb_utils.TritonModelException("the stand-in answers greedily only (sampling_param_temperature 0)")
        max_tokens = int(scalar(request, "sampling_param_max_tokens", MAX_TOKENS))
        ids = self.tokenizer(prompt)["input_ids"]
        drafter = self.drafter
        if streaming:
            drafter = StepTap(self.drafter, self.streamer(sender, max_tokens))
        g = speculative_decode(self.target, drafter, torch.tensor(ids), max_tokens, self.spec, self.eos)
        tensors = [self.text(g.tokens)]
        if scalar(request, "return_finish_reason", False):
            reason = "stop" if g.tokens and g.tokens[-1] in self.eos else "length"
            tensors.append(pb_utils.Tensor("finish_reason", np.asarray([reason], dtype=np.object_)))
        if scalar(request, "sampling_param_return_perf_metrics", False):
            tensors += self.draft_counters(sum(g.stats.accepted), sum(g.stats.drafted))
        sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=FINAL)

    def streamer(self, sender, max_tokens: int):
        """A callback sending the text so far after each step that added tokens, short of the last (which the final
        response carries)."""
        seen: list[int] = []
        sent = [0]

        def on_tokens(new: list[int]) -> None:
            seen.extend(new)
            answer = cut(seen, max_tokens, self.eos)
            finished = len(answer) >= max_tokens or (answer and answer[-1] in self.eos)
            if len(answer) > sent[0] and not finished:
                sender.send(pb_utils.InferenceResponse(output_tensors=[self.text(answer)]), flags=0)
                sent[0] = len(answer)

        return on_tokens

    def text(self, tokens: list[int]):
        answer = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return pb_utils.Tensor("text_output", np.asarray([answer.encode("utf-8")], dtype=np.object_))

    @staticmethod
    def draft_counters(accepted: int, drafted: int) -> list:
        """The request's speculative-decoding counters, in the types config.pbtxt declares."""
        return [
            pb_utils.Tensor("acceptance_rate", np.asarray([accepted / drafted if drafted else 0.0], dtype=np.float32)),
            pb_utils.Tensor("total_accepted_draft_tokens", np.asarray([accepted], dtype=np.int32)),
            pb_utils.Tensor("total_draft_tokens", np.asarray([drafted], dtype=np.int32)),
        ]
