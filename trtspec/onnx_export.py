"""ONNX export of the EAGLE-3 draft head, read back from the exported draft checkpoint, checked with onnxruntime.

The graph is one draft step without a KV cache (TensorRT-LLM / vLLM semantics, see trtspec/eagle.py):

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


def _rms(x: Any, weight: Any, eps: float) -> Any:
    import torch

    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * weight


def _rotate(x: Any, cos: Any, sin: Any) -> Any:
    import torch

    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _draft_modules(cfg: dict):
    """nn.Modules named exactly like the checkpoint's tensors (so load_state_dict checks every key)."""
    import torch
    from torch import nn

    H, I = cfg["hidden_size"], cfg["intermediate_size"]  # noqa: E741
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    D = cfg.get("head_dim") or H // heads
    bias = bool(cfg.get("attention_bias", False))
    aux = len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])

    def norm() -> nn.Module:
        m = nn.Module()
        m.weight = nn.Parameter(torch.ones(H))
        return m

    layers = nn.ModuleList()
    for i in range(cfg.get("num_hidden_layers", 1)):
        width = 2 * H if i == 0 else H
        layer = nn.Module()
        layer.self_attn = nn.Module()
        layer.self_attn.q_proj = nn.Linear(width, heads * D, bias=bias)
        layer.self_attn.k_proj = nn.Linear(width, kv_heads * D, bias=bias)
        layer.self_attn.v_proj = nn.Linear(width, kv_heads * D, bias=bias)
        layer.self_attn.o_proj = nn.Linear(heads * D, H, bias=bias)
        layer.mlp = nn.Module()
        layer.mlp.gate_proj = nn.Linear(H, I, bias=False)
        layer.mlp.up_proj = nn.Linear(H, I, bias=False)
        layer.mlp.down_proj = nn.Linear(I, H, bias=False)
        layer.input_layernorm = norm()
        layer.post_attention_layernorm = norm()
        if i == 0:
            layer.hidden_norm = norm()
        layers.append(layer)
    fc = nn.Linear(aux * H, H, bias=False)
    lm_head = nn.Linear(H, cfg.get("draft_vocab_size") or cfg["vocab_size"], bias=False)
    return fc, layers, norm(), lm_head, (heads, kv_heads, D)


def _draft_head_class():
    import torch
    from torch import nn

    class DraftHead(nn.Module):
        """One EAGLE-3 draft step (no KV cache), weights from an exported draft checkpoint."""

        def __init__(self, cfg: dict, tensors: dict):
            super().__init__()
            self.fc, self.layers, self.norm, self.lm_head, (self.heads, self.kv_heads, self.head_dim) = _draft_modules(cfg)
            self.eps = float(cfg.get("rms_norm_eps", 1e-5))
            self.register_buffer("inv_freq", _inv_freq(cfg), persistent=False)
            self.rope_scale = _rope_attention_scaling(cfg)
            weights = {k: v.float() for k, v in tensors.items() if k not in ("d2t", "t2d")}  # vocab maps: not weights
            missing, unexpected = self.load_state_dict(weights, strict=False)
            if missing or unexpected:
                raise ArtifactError(f"draft weights do not fit the head: missing {missing[:4]}, unexpected {unexpected[:4]}")

        def attention(self, attn, x, cos, sin):
            B, S, _ = x.shape
            q = attn.q_proj(x).view(B, S, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(B, S, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(B, S, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            groups = self.heads // self.kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            scores = q @ k.transpose(-1, -2) / self.head_dim**0.5
            causal = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
            out = scores.softmax(-1) @ v
            return attn.o_proj(out.transpose(1, 2).reshape(B, S, self.heads * self.head_dim))

        def forward(self, aux_hidden_states, input_embeds, position_ids):
            freqs = position_ids[:, None, :, None].float() * self.inv_freq[None, None, None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos() * self.rope_scale, emb.sin() * self.rope_scale
            h = self.fc(aux_hidden_states)
            for i, layer in enumerate(self.layers):
                if i == 0:
                    x = torch.cat((_rms(input_embeds, layer.input_layernorm.weight, self.eps),
                                   _rms(h, layer.hidden_norm.weight, self.eps)), dim=-1)
                else:
                    x = _rms(h, layer.input_layernorm.weight, self.eps)
                h = h + self.attention(layer.self_attn, x, cos, sin)
                m = _rms(h, layer.post_attention_layernorm.weight, self.eps)
                h = h + layer.mlp.down_proj(torch.nn.functional.silu(layer.mlp.gate_proj(m)) * layer.mlp.up_proj(m))
            return self.lm_head(_rms(h, self.norm.weight, self.eps)), h

    return DraftHead


def _rope_config(cfg: dict):
    from transformers import LlamaConfig

    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings")
    rope = dict(cfg.get("rope_scaling") or {})
    rope.setdefault("rope_type", rope.pop("type", "default"))
    rope.setdefault("rope_theta", cfg.get("rope_theta") or 10000.0)
    return LlamaConfig(**{k: cfg[k] for k in keys if cfg.get(k) is not None}, rope_parameters=rope)


def _inv_freq(cfg: dict):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding(_rope_config(cfg)).inv_freq.float().clone()


def _rope_attention_scaling(cfg: dict) -> float:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return float(LlamaRotaryEmbedding(_rope_config(cfg)).attention_scaling)


def load_draft_head(draft_dir: str | Path):
    """The draft checkpoint (config.json + model.safetensors) as a float32 DraftHead module in eval mode."""
    from safetensors.torch import load_file

    draft_dir = Path(draft_dir)
    cfg = json.loads((draft_dir / "config.json").read_text())
    if "lm_head.weight" not in load_file(str(draft_dir / "model.safetensors")):
        raise ArtifactError(f"'{draft_dir}' has no lm_head.weight; the ONNX head needs one")
    head = _draft_head_class()(cfg, load_file(str(draft_dir / "model.safetensors")))
    return head.eval().requires_grad_(False), cfg


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


def export_onnx(draft_dir: str | Path, out_dir: str | Path, tolerance: float) -> dict:
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
                            "raise export.onnx_tolerance if the difference is rounding, or set export.onnx: false")
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
