"""The DFlash2 draft as exported in bundle/draft (DFlash2DraftModel, the files vLLM's qwen3_dflash2 loads), drafting
a chain from one pass of the block as trtspec's runtime DFlash does (dflash/runtime.py), with its two additions:

    each layer:  h, c = conv_a(norm(x));  x += conv_a.finish(attend(h), c);  h, c = conv_m(norm(x));
                 x += conv_m.finish(mlp(h), c)
    conv:        out_j = sum_{t <= j} (base_t + delta_jt) * y_{j-t},   [delta_j for prepare | for finish] =
                 kernel_projection(its input row j), one coefficient per group of channels (block rows only)
    selector:    row j's candidates C_j = top-k of its logits u_j, scored from the guess before it (the root for the
                 first): s_j(p, c) = u_j[c] + <P[p] * W_h hid_j, S[c]>;  guess_j = argmax_c s_j(guess_{j-1}, c)

(vLLM 0.32's `_grouped_conv` and `_score_edges` / `_selector_walk_kernel`, the same sums; at temperature > 0 guess j
is drawn from softmax(s_j / T) over C_j, which is its q: zero outside C_j.)
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from trtspec.dflash.runtime import DFlashDrafter, DFlashLayer, load_dflash, load_weights, share_target
from trtspec.dflash2 import ARCHITECTURE, SELECTOR_KEY
from trtspec.errors import ArtifactError
from trtspec.runtime.drafters import softmax_t
from trtspec.runtime.model import Linear, ModelArgs, read_config, rms_norm
from trtspec.runtime.settings import RuntimeSettings


def grouped_conv(y: Tensor, delta: Tensor, base: Tensor) -> Tensor:
    """One block's rows y [B, H] through the causal convolution: base [taps, H], delta [B, taps, G] (row j's own)."""
    taps, groups = delta.shape[1], delta.shape[2]
    coef = base[None] + delta.repeat_interleave(y.shape[1] // groups, dim=-1)  # [B, taps, H]
    out = coef[:, 0] * y
    for t in range(1, min(taps, y.shape[0])):
        out[t:] += coef[t:, t] * y[:-t]
    return out


class GroupedConv(nn.Module):
    def __init__(self, hidden: int, taps: int, group: int):
        super().__init__()
        self.taps, self.groups = taps, hidden // group
        self.base_kernel = nn.Parameter(torch.empty(2, taps, hidden))
        self.kernel_projection = Linear(hidden, 2 * taps * self.groups, bias=False)

    def prepare(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """The sublayer's input convolved, and the kernel its output will be (both from h's rows)."""
        delta = self.kernel_projection(h).view(h.shape[0], 2, self.taps, self.groups)
        return grouped_conv(h, delta[:, 0], self.base_kernel[0]), delta[:, 1]

    def finish(self, y: Tensor, delta: Tensor) -> Tensor:
        return grouped_conv(y, delta, self.base_kernel[1])


class DFlash2Layer(DFlashLayer):
    def __init__(self, args: ModelArgs, taps: int, group: int):
        super().__init__(args)
        self.attention_conv = GroupedConv(args.hidden_size, taps, group)
        self.mlp_conv = GroupedConv(args.hidden_size, taps, group)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, length: int, mask: Tensor | None) -> Tensor:
        eps = self.args.norm_eps
        h, delta = self.attention_conv.prepare(rms_norm(x, self.input_layernorm, eps))
        x = x + self.attention_conv.finish(self.attend(h, cos, sin, length, mask), delta)
        h, delta = self.mlp_conv.prepare(rms_norm(x, self.post_attention_layernorm, eps))
        return x + self.mlp_conv.finish(self.mlp(h), delta)


class CandidateSelector(nn.Module):
    def __init__(self, vocab: int, hidden: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab, rank))
        self.hidden_projection = Linear(hidden, rank, bias=False)

    def walk(self, root: int, logits: Tensor, rows: Tensor, temperature: float,
             generator=None) -> tuple[list[int], Tensor | None]:
        """The chain's guesses from the rows' logits [k, V] and normed states [k, H], one after another."""
        unary, candidates = logits.topk(self.top_k, dim=-1)  # [k, top_k]
        context = self.hidden_projection(rows)  # [k, r]
        successors = self.successor_codebook[candidates]  # [k, top_k, r]
        prev, ids, qs = root, [], []
        for j in range(logits.shape[0]):
            scores = unary[j] + successors[j] @ (self.predecessor_codebook[prev] * context[j])
            if temperature <= 0:
                pick = int(scores.argmax())
            else:
                q = softmax_t(scores[None], temperature)[0]
                pick = int(torch.multinomial(q, 1, generator=generator))
                qs.append(torch.zeros(logits.shape[1], dtype=q.dtype).index_copy_(0, candidates[j], q))
            prev = int(candidates[j, pick])
            ids.append(prev)
        return ids, torch.stack(qs) if qs else None


class DFlash2Drafter(DFlashDrafter):
    """DFlash's drafter (one block pass a step, the context cached), the guesses chosen by the selector."""

    name = "dflash2"

    def __init__(self, net, embed, info, selector: CandidateSelector):
        super().__init__(net, embed, info)
        self.selector = selector

    def guesses(self, root: int, logits: Tensor, rows: Tensor, temperature: float, generator=None) -> tuple[list[int], Tensor | None]:
        return self.selector.walk(root, logits, rows, temperature, generator)


def load_dflash2_drafter(draft_dir: Path, target, dtype=torch.float32, weights: str = "auto",
                         settings: RuntimeSettings | None = None) -> DFlash2Drafter:
    """The exported DFlash2 draft, sharing the target's embedding and lm_head (dflash.runtime.share_target)."""
    dc = read_config(draft_dir).get("dflash_config") or {}
    keys = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
    if missing := [k for k in keys if k not in dc]:
        raise ArtifactError(f"'{draft_dir}/config.json' lacks dflash_config.{missing[0]}, which a DFlash2 draft needs")
    taps, group = int(dc["conv_kernel_size"]), int(dc["conv_group_size"])
    net, info, _, own = load_dflash(draft_dir, target.args.hidden_size, target.args.num_layers, dtype,
                                    architecture=ARCHITECTURE, layer=lambda a: DFlash2Layer(a, taps, group),
                                    own=(SELECTOR_KEY,))
    with torch.device("meta"):
        selector = CandidateSelector(target.args.vocab_size, target.args.hidden_size, int(dc["selector_rank"]),
                                     int(dc["selector_top_k"]))
    load_weights(selector, {k.removeprefix(SELECTOR_KEY): v for k, v in own.items()}, Path(draft_dir))
    selector.eval().requires_grad_(False)
    share_target(net, info, target, list(selector.modules()), weights, settings)
    return DFlash2Drafter(net, target.embed_tokens, info, selector)
