"""ONNX export of the EAGLE-3 draft head, read back from the exported draft checkpoint by the runtime's own loader
and exported from the runtime's own draft step (eagle/runtime.py), checked with onnxruntime.

The graph is one draft step without a KV cache (TensorRT-LLM / vLLM semantics, see trtspec/eagle/head.py):

    h      = fc(aux_hidden_states)                                   # [B, S, A*H] -> [B, S, H]
    x      = cat(input_layernorm(input_embeds), hidden_norm(h))      # [B, S, 2H] into layer 0's q/k/v
    out    = h + attn(x);  out = out + mlp(post_attention_layernorm(out))   # causal over S
    logits = lm_head(norm(out))                                      # [B, S, DV]; target id = i + d2t[i]

Outputs: `logits` and `hidden_states` (= out, pre-norm: what the next draft step feeds back as h).
Batch and sequence axes are dynamic. The graph is exported in float32 (onnxruntime's CPU kernels lack bf16).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtspec.errors import ArtifactError

INPUTS = ("aux_hidden_states", "input_embeds", "position_ids")
OUTPUTS = ("logits", "hidden_states")
OPSET = 18
# max |onnxruntime - PyTorch| per output as a share of its scale (max |PyTorch|): fp32 rounding is ~1e-6
TOLERANCE = 1e-3


def draft_step_module(net: Any) -> Any:
    """The runtime's EAGLE-3 draft (eagle/runtime.py) as the ONNX graph's module: no KV cache, batch and sequence
    axes free, rope from position ids. The step itself is `Eagle3Draft.draft_step`, the one implementation."""
    import torch
    from torch import nn

    from trtspec.runtime.model import rope_inv_freq

    class _DraftStep(nn.Module):
        def __init__(self, net: Any):
            super().__init__()
            self.net = net
            inv, self.rope_scale = rope_inv_freq(net.args)
            self.register_buffer("inv_freq", inv, persistent=False)

        def forward(self, aux_hidden_states, input_embeds, position_ids):
            freqs = position_ids[:, None, :, None].float() * self.inv_freq  # [B, 1, S, D/2]
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos() * self.rope_scale, emb.sin() * self.rope_scale
            return self.net.draft_step(input_embeds, self.net.project(aux_hidden_states), cos, sin, None, 0, "causal")

    return _DraftStep(net).eval()


def load_draft_head(draft_dir: str | Path):
    """The draft checkpoint (config.json + model.safetensors), read by the runtime's loader, as the float32 module
    the ONNX graph is exported from: head(aux_hidden_states, input_embeds, position_ids) -> (logits, hidden_states)."""
    import torch

    from trtspec.eagle.runtime import load_eagle3

    draft_dir = Path(draft_dir)
    cfg = json.loads((draft_dir / "config.json").read_text())
    net, _ = load_eagle3(draft_dir, None, None, torch.float32)
    return draft_step_module(net), cfg


def sample_inputs(cfg: dict, batch: int, seq: int, seed: int = 0) -> tuple:
    """Deterministic inputs of the right shapes (aux states at the scale of real hidden states)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    H = cfg["hidden_size"]
    aux = len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    return (
        torch.randn(batch, seq, aux * H, generator=g),
        torch.randn(batch, seq, H, generator=g) * 0.05,
        torch.arange(seq).repeat(batch, 1) + torch.randint(0, 50, (batch, 1), generator=g),
    )


def export_onnx(draft_dir: str | Path, out_dir: str | Path, tolerance: float = TOLERANCE) -> dict:
    """Export the draft head to out_dir/draft_head.onnx, run it with onnxruntime, compare with PyTorch.

    Returns {"file", "opset", "max_abs_diff", "max_rel_diff", "ok": {output: ...}, "top1_agree"};
    raises one ArtifactError listing every output that fails check_outputs.
    """
    import torch

    head, cfg = load_draft_head(draft_dir)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "draft_head.onnx"
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    dynamic = {name: {0: batch, 1: seq} for name in ("aux_hidden_states", "input_embeds", "position_ids")}
    with torch.no_grad():
        torch.onnx.export(head, sample_inputs(cfg, 2, 5), str(path), input_names=list(INPUTS), output_names=list(OUTPUTS),
                          dynamic_shapes=dynamic, opset_version=OPSET, dynamo=True, verbose=False)
    # check at a batch and length other than the traced ones: the axes must really be dynamic
    got, want = run_both(head, path, sample_inputs(cfg, 2, 9, seed=1))
    result = {"file": path.name, "opset": OPSET, "dtype": "float32", "tolerance": tolerance,
              **check_outputs(got, want, tolerance)}
    failed = [f"{name}: {why}" for name, why in result.pop("why").items()]
    if failed:
        raise ArtifactError("the ONNX draft head disagrees with PyTorch: " + "; ".join(failed),
                            "set export.onnx: false to ship the bundle without the ONNX draft step")
    return result


def run_both(head: Any, path: Path, inputs: tuple) -> tuple[dict[str, Any], dict[str, Any]]:
    """({output: onnxruntime's tensor}, {output: PyTorch's tensor}) on the same inputs."""
    import onnxruntime as ort
    import torch

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {name: t.numpy() for name, t in zip(INPUTS, inputs, strict=True)}
    got = sess.run(list(OUTPUTS), feed)
    with torch.no_grad():
        want = head(*inputs)
    return {n: torch.from_numpy(g) for n, g in zip(OUTPUTS, got, strict=True)}, dict(zip(OUTPUTS, want, strict=True))


def check_outputs(got: dict[str, Any], want: dict[str, Any], tolerance: float) -> dict:
    """Two runs of one graph compared so that float rounding never fails a sound export: every output's max
    |got - want| relative to its scale (max |want|) must be <= tolerance. Un-normalised hidden states reach values
    in the hundreds, where an absolute bound fails on fp32's last bits.

    The draft's top tokens are reported too (`top1_agree`): within the bound they can only differ where PyTorch's own
    top two are within 2 x the difference of each other, a tie that rounding breaks either way.
    Returns {"max_abs_diff", "max_rel_diff", "ok": {output: ...}, "top1_agree": fraction, "why": {failed: reason}}.
    """
    abs_diff, rel_diff, ok, why = {}, {}, {}, {}
    for name in OUTPUTS:
        g, w = got[name].float(), want[name].float()
        abs_diff[name] = float((g - w).abs().max())
        rel_diff[name] = abs_diff[name] / max(float(w.abs().max()), 1e-30)
        ok[name] = rel_diff[name] <= tolerance
        if not ok[name]:
            why[name] = f"max diff {abs_diff[name]:.3g} is {rel_diff[name]:.3g} of the output's scale > {tolerance:g}"
    agree = (got["logits"].argmax(-1) == want["logits"].argmax(-1)).float().mean()
    return {"max_abs_diff": abs_diff, "max_rel_diff": rel_diff, "ok": ok, "top1_agree": round(float(agree), 4), "why": why}


def format_onnx_check(result: dict) -> str:
    """'logits 2.1e-06 ✓, hidden_states 9.5e-07 ✓ (max abs diff; relative tolerance 0.001; top token 100%)'"""
    parts = [f"{n} {result['max_abs_diff'][n]:.2g} {'✓' if result['ok'][n] else '✗'}" for n in OUTPUTS]
    return ", ".join(parts) + f" (max abs diff; relative tolerance {result['tolerance']:g}; top token {result['top1_agree']:.0%})"
