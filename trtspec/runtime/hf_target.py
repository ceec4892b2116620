"""Any HF decoder as the decode loop's target: the model's own forward and KV cache (trtspec.targets' "hf" path).

The native runtime (runtime/model.py) serves Llama-style decoders; every other family (mixture of experts,
sliding-window layers, MLA, scaled embeddings, post-norms, NoPE layers, attention sinks) runs here, through the very
modules HF generate runs, so validate's exactness gate holds for any decoder transformers implements.

The loop's contract is runtime/model.py's: `target(tokens, positions, slots, length, mask)` -> (logits, aux).
The cache holds exactly the verified prefix between steps: a pass's `slots[0]` is that prefix's length, and rows a
previous verification wrote past it (the rejected drafts) are cut (`DynamicCache.crop`) before the pass runs.
The cache is a plain DynamicCache: every layer keeps all its rows, sliding-window layers included (their window
is applied by the model's mask, as in HF generate), so cutting rows never loses a row a window still needs.
Chains only: a tree's ancestor mask is not something every family's attention takes, so trees are refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from trtspec.errors import ArtifactError, DataError
from trtspec.runtime.settings import DEFAULT as DEFAULT_SETTINGS
from trtspec.runtime.settings import RuntimeSettings


@dataclass
class HFArgs:
    """The sizes the loop, the drafters and the reports read from a target (runtime/model.py's ModelArgs' subset)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    max_positions: int


class HFTarget(nn.Module):
    """An HF causal LM behind the runtime target's interface, with a DynamicCache cut back to the verified prefix."""

    native_pass = False
    compiled = None  # the model's own forward runs eagerly (compile_steps is for runtime/model.py's passes)
    PASSES: tuple[str, ...] = ()
    path = "hf"

    def __init__(self, model: Any, aux_layers: tuple[int, ...] = ()):
        super().__init__()
        text = getattr(model.config, "text_config", None) or model.config
        self.model = model
        self.args = HFArgs(text.vocab_size, text.hidden_size, text.num_hidden_layers, text.max_position_embeddings)
        self.aux_layers = tuple(aux_layers)
        self.embed_tokens = model.get_input_embeddings()  # the drafters embed with the target's own module
        self.lm_head = model.get_output_embeddings()
        self.kernel_choice = {"by_rows": [], "note": "the model's own HF forward (no native kernels)"}
        self.cache = None
        self.max_len = 0

    def setup_cache(self, max_len: int) -> None:
        """Positions the caller will use at most (the cache itself grows with the rows written)."""
        self.max_len = max_len

    def _pass(self, tokens: Tensor, positions: Tensor) -> tuple[Tensor, Tensor | None]:
        out = self.model(input_ids=tokens[None], position_ids=positions[None], past_key_values=self.cache, use_cache=True,
                         output_hidden_states=bool(self.aux_layers))
        self.cache = out.past_key_values
        # hidden_states[0] is the embeddings' output, hidden_states[i + 1] layer i's (the residual stream before the
        # final norm): the states EAGLE-3 and DFlash drafts read, as trtspec.training.states takes them in training
        aux = torch.cat([out.hidden_states[i + 1][0] for i in self.aux_layers], dim=-1) if self.aux_layers else None
        return out.logits[0].float(), None if aux is None else aux.float()

    def forward(self, tokens: Tensor, positions: Tensor, slots: Tensor, length: int, mask: Tensor | str | None,
                logits_from: int = 0) -> tuple[Tensor, Tensor | None]:
        """tokens/positions/slots [T] -> (logits [T - logits_from, V], aux [T, A] or None); slots must follow the
        verified prefix (a chain), which is all the cache keeps."""
        from transformers import DynamicCache

        start = int(slots[0])
        if start == 0:
            self.cache = DynamicCache()  # a prefill: a new sequence
        elif self.cache is None:
            raise DataError("a pass after the first needs the prefill's cache")
        elif (extra := self.cache.get_seq_length() - start) > 0:
            self.cache.crop(-extra)  # drop the rows of rejected drafts
        if not isinstance(mask, str) and mask is not None and not _is_causal(mask, start):
            raise DataError("the HF runtime path verifies chains only", "set draft.shape: chain for this target family")
        if not torch.equal(slots, torch.arange(start, start + slots.numel())):
            raise DataError("the HF runtime path writes rows right after the verified prefix")
        logits, aux = self._pass(tokens, positions)
        return logits[logits_from:], aux

    def step(self, *args) -> tuple[Tensor, Tensor | None]:
        return self.forward(*args)


def _is_causal(mask: Tensor, start: int) -> bool:
    n = mask.shape[0]
    return bool(torch.equal(mask[:, start:], torch.ones(n, n, dtype=torch.bool).tril()) and mask[:, :start].all())


def dequantized_model(folder: Path, dtype: torch.dtype) -> tuple[Any, list[str]]:
    """A modelopt-quantized HF folder as transformers runs it with the weights dequantized (model.dequantize:
    weight * weight_scale) -> (model, notes). The dequantized weights are written beside a config without its
    quantization and read back by from_pretrained, whose key conversions turn an export's per-expert MoE weights into
    the fused experts transformers 5 builds."""
    import tempfile

    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from trtspec.runtime.model import dequantize, read_config, read_safetensors

    config = {k: v for k, v in read_config(folder).items() if k != "quantization_config"}
    state, notes = dequantize(read_safetensors(folder), dtype)
    with tempfile.TemporaryDirectory(prefix="trtspec-dequantized-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        save_file({k: v.contiguous() for k, v in state.items()}, str(Path(tmp) / "model.safetensors"))
        try:
            model = AutoModelForCausalLM.from_pretrained(tmp, dtype=dtype)
        except Exception as e:  # transformers raises many types for weights that do not fit
            raise ArtifactError(f"'{folder}': the dequantized weights do not fit its config: {e.__class__.__name__}: "
                                f"{str(e)[:200]}") from None
    return model.eval().requires_grad_(False), notes


def load_hf_target(folder: Path, aux_layers: tuple[int, ...] = (), dtype: torch.dtype = torch.float32) -> tuple[HFTarget, list[str]]:
    """The HF folder as an HFTarget (float32 on the CPU), a quantized one with its weights dequantized ->
    (target, dequantization notes)."""
    from trtspec.models import load_model

    notes: list[str] = []
    if (Path(folder) / "hf_quant_config.json").is_file():
        model, notes = dequantized_model(Path(folder), dtype)
    else:
        model = load_model(Path(folder), str(dtype).removeprefix("torch."), "cpu")
    target = HFTarget(model, aux_layers)
    bad = [i for i in aux_layers if not 0 <= i < target.args.num_layers]
    if bad:
        raise ArtifactError(f"aux hidden state layers {bad} do not exist in a {target.args.num_layers}-layer target")
    return target, notes


def load_target(folder: Path, dtype: torch.dtype = torch.float32, settings: RuntimeSettings = DEFAULT_SETTINGS
                ) -> tuple[Any, list[str]]:
    """The bundle's target on the path its family declares (trtspec.targets): the native runtime for the families
    it serves (run as `settings` say), else the model's own HF forward -> (target, dequantization notes); the
    target's `path` says which ("native" | "hf")."""
    from trtspec.runtime.model import load_transformer
    from trtspec.targets import read_family

    if read_family(folder).runtime == "native":
        return load_transformer(folder, dtype, settings=settings)
    return load_hf_target(folder, dtype=dtype)
