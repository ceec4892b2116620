"""One decoding loop (gpt-fast style), batch 1, static KV caches: plain autoregressive steps, or speculative ones
when a drafter is given.

Speculative step (root = the last verified token, not yet in the target's cache, which holds L tokens):
  1. the drafter proposes a tree below the root (a chain is a tree);
  2. the target runs once on [root, drafted nodes] at positions L + depth with an ancestor mask, giving for every
     node the target distribution of its next token and the aux hidden states of its position;
  3. verification walks down from the root:
       greedy:   accept child x of the current node iff x = argmax p_target(. | path);
       sampling: accept draft x with probability min(1, p(x) / q(x)); on rejection sample from
                 normalize(max(0, p - q)).  This yields exactly p: P(x) = q(x) min(1, p/q) + P(reject) r(x)
                 = min(q, p)(x) + (1 - sum min(p, q)) (p - min(p, q))(x) / (1 - sum min(p, q)) = p(x);
     after the last accepted node the target's own next token (argmax, the residual sample, or a sample of p
     when every draft was accepted: the "bonus" token) ends the step;
  4. the accepted path's KV rows are moved next to the prefix (a no-op for chains), L += accepted + 1.
Every step costs one target forward and yields accepted + 1 tokens: acceptance length AL = mean(accepted + 1).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from trtspec.errors import DataError
from trtspec.runtime.drafters import DraftSpec, softmax_t
from trtspec.runtime.model import Transformer
from trtspec.runtime.native import move_rows
from trtspec.runtime.tree import Tree


@dataclass
class Stats:
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted per target forward
    drafted: list[int] = field(default_factory=list)  # depth of the proposed tree per target forward

    def merge(self, other: Stats) -> None:
        self.accepted += other.accepted
        self.drafted += other.drafted

    @property
    def steps(self) -> int:
        return len(self.accepted)

    def acceptance_length(self) -> float:
        """Tokens per target forward in the decode phase (1.0 = no speculation benefit)."""
        return 1.0 + sum(self.accepted) / max(1, self.steps)

    def histogram(self, k: int) -> list[int]:
        h = [0] * (k + 1)
        for a in self.accepted:
            h[min(a, k)] += 1
        return h

    def per_position(self, k: int) -> list[float]:
        """P(draft token j accepted | it was proposed), j = 1..k (position j needs positions < j accepted)."""
        out = []
        for j in range(1, k + 1):
            proposed = sum(1 for d in self.drafted if d >= j)
            out.append(sum(1 for a in self.accepted if a >= j) / proposed if proposed else 0.0)
        return out


def al_interval(per_prompt: list[tuple[int, int]], resamples: int = 1000, seed: int = 0) -> list[float]:
    """95% bootstrap interval of AL = sum(tokens) / sum(forwards) over prompts drawn again with replacement: how
    much the figure would move on another draw of held-out prompts (not on another training run)."""
    import torch

    counts = torch.tensor(per_prompt, dtype=torch.float64)  # [prompts, (tokens, forwards)]
    idx = torch.randint(len(counts), (resamples, len(counts)), generator=torch.Generator().manual_seed(seed))
    sums = counts[idx].sum(1)
    al = sums[:, 0] / sums[:, 1].clamp_min(1)
    return [round(float(q), 3) for q in torch.quantile(al, torch.tensor([0.025, 0.975], dtype=torch.float64))]


def al_ratio_interval(before: list[tuple[int, int]], after: list[tuple[int, int]], resamples: int = 1000,
                      seed: int = 0) -> list[float]:
    """95% paired bootstrap interval of AL(after) / AL(before) on the same prompts, drawn again with replacement (the
    same draw for both): whether a change is larger than what another draw of these prompts would give."""
    import torch

    a, b = (torch.tensor(x, dtype=torch.float64) for x in (after, before))  # [prompts, (tokens, forwards)]
    idx = torch.randint(len(a), (resamples, len(a)), generator=torch.Generator().manual_seed(seed))
    sa, sb = a[idx].sum(1), b[idx].sum(1)
    ratio = (sa[:, 0] / sa[:, 1].clamp_min(1)) / (sb[:, 0] / sb[:, 1].clamp_min(1)).clamp_min(1e-9)
    return [round(float(q), 4) for q in torch.quantile(ratio, torch.tensor([0.025, 0.975], dtype=torch.float64))]


@dataclass
class Generation:
    tokens: list[int]
    stats: Stats
    prefill_s: float = 0.0  # seconds of the prompt's prefill (and first token): the rest of the time is decode steps


# ---------------------------------------------------------------------------------------------- target steps


def prefill(target: Transformer, prompt: Tensor) -> tuple[Tensor, Tensor | None]:
    """Run the prompt into the empty cache -> (logits of the last position [V], aux hidden states [T, A])."""
    n = prompt.numel()
    idx = torch.arange(n)
    logits, aux = target(prompt, idx, idx, n, "causal", logits_from=n - 1)
    return logits[0], aux


def decode_one_token(target: Transformer, token: int, length: int) -> Tensor:
    pos = torch.tensor([length])
    return target.step(torch.tensor([token]), pos, pos, length + 1, None)[0][0]


def verify_tree(target: Transformer, tree: Tree, length: int) -> tuple[Tensor, Tensor | None]:
    """One target pass over the whole tree -> (logits [N, V], aux [N, A])."""
    n = len(tree)
    slots = torch.arange(length, length + n)
    positions = length + torch.tensor(tree.depth)
    if tree.is_chain():
        mask = torch.ones(n, length + n, dtype=torch.bool).tril(length) if n > 1 else None
    else:
        mask = torch.cat((torch.ones(n, length, dtype=torch.bool), tree.ancestor_mask()), dim=1)
    return target.step(torch.tensor(tree.tokens), positions, slots, length + n, mask)


@torch.inference_mode()
def warm_up_row_counts(target: Transformer, drafter, spec: DraftSpec) -> None:
    """Run the target's verify pass, and a model drafter's draft after 1..N newly verified tokens, once for every
    token count 1..N (N = spec.max_nodes()).

    The products' kernel is chosen per row count (kernels.few_rows_linear), so a compiled step holds one graph per
    run of counts that share a kernel, compiled the first time a count of that run occurs. Drafts of varying length
    (suffix matches) meet counts a fixed chain never does; without this, those compilations would land inside timed
    runs. Cache contents written here are scratch: every generation starts with a prefill."""
    max_rows = spec.max_nodes()
    prompt = torch.arange(1, 9)
    need = prompt.numel() + max_rows * (max_rows + 2) + 2
    if target.max_len < need:
        target.setup_cache(need)
    _, aux = prefill(target, prompt)
    for n in range(1, max_rows + 1):
        verify_tree(target, Tree(list(range(1, n + 1)), [-1, *range(n - 1)], list(range(n))), prompt.numel())
    if getattr(drafter, "net", None) is not None:  # a network drafter's pass reads the newly verified tokens, 1..max_rows at a time
        drafter.setup(need)
        drafter.start(prompt, 1, aux)
        drafter.draft(1, spec)  # a generation's first draft: what start() left waiting
        for m in range(1, max_rows + 1):
            # aux as a generation hands it over (contiguous rows): dynamo guards on strides, an expanded view's
            # graph would not serve the timed runs
            drafter.accepted(torch.ones(m, dtype=torch.long), None if aux is None else aux[-1:].repeat(m, 1))
            drafter.draft(1, spec)


def compact_cache(model: Transformer, length: int, path: list[int]) -> None:
    """Move the KV rows of the accepted path (tree node ids) to rows length, length + 1, ... (one native call for
    every layer's caches where the target's pass is native)."""
    if path == list(range(len(path))):
        return
    src = torch.tensor(path) + length
    if model.native_pass:
        move_rows([c for layer in model.layers for c in (layer.self_attn.k_cache, layer.self_attn.v_cache)], src, length)
        return
    for layer in model.layers:
        a = layer.self_attn
        a.k_cache[:, :, length : length + len(path)] = a.k_cache[:, :, src]
        a.v_cache[:, :, length : length + len(path)] = a.v_cache[:, :, src]


def sample(logits: Tensor, temperature: float, generator=None) -> int:
    if temperature <= 0:
        return int(logits.argmax())
    return int(torch.multinomial(softmax_t(logits, temperature), 1, generator=generator))


# ---------------------------------------------------------------------------------------------- verification


def verify_greedy(tree: Tree, target_logits: Tensor) -> tuple[list[int], int]:
    """Follow the target's argmax down the tree -> (accepted path of node ids from the root, next token)."""
    best = target_logits.argmax(-1).tolist()
    kids = tree.children()
    path = [0]
    while True:
        node = path[-1]
        nxt = next((c for c in kids[node] if tree.tokens[c] == best[node]), None)
        if nxt is None:
            return path, best[node]
        path.append(nxt)


def accept_probs(p: Tensor, q: Tensor) -> Tensor:
    """Probability of keeping a draft token x: min(1, p_target(x) / p_draft(x))."""
    return (p / q).clamp(max=1.0)


def verify_sampling(tree: Tree, target_logits: Tensor, q: Tensor, temperature: float, generator=None) -> tuple[list[int], int]:
    """Speculative sampling on a chain (lossless). q [k, V] holds the draft distributions the k tokens came from."""
    k = len(tree) - 1
    p = softmax_t(target_logits, temperature)  # p[j] = target distribution of the token after node j
    if k == 0:
        return [0], int(torch.multinomial(p[0], 1, generator=generator))
    drafted = torch.tensor(tree.tokens[1:])
    rows = torch.arange(k)
    if q is None:  # a deterministic drafter (n-gram): q is one-hot on its guess
        q = torch.nn.functional.one_hot(drafted, p.shape[-1]).float()
    keep = accept_probs(p[rows, drafted], q[rows, drafted])
    u = torch.rand(k, generator=generator)
    rejected = (u >= keep).tolist()
    a = rejected.index(True) if True in rejected else k
    if a == k:  # all accepted: the bonus token comes from the target's distribution after the last draft
        return list(range(k + 1)), int(torch.multinomial(p[k], 1, generator=generator))
    residual = (p[a] - q[a]).clamp(min=0)
    return list(range(a + 1)), int(torch.multinomial(residual / residual.sum(), 1, generator=generator))


# ---------------------------------------------------------------------------------------------- loops


def _check_room(target: Transformer, prompt: Tensor, max_new_tokens: int, spec: DraftSpec | None) -> int:
    need = prompt.numel() + max_new_tokens + (spec.max_nodes() if spec else 1) + 1
    if prompt.numel() == 0:
        raise DataError("empty prompt", "every prompt needs at least one token")
    if need - 1 > target.args.max_positions:
        raise DataError(
            f"prompt of {prompt.numel()} tokens + {max_new_tokens} new tokens exceeds the model's context of {target.args.max_positions}",
            "shorten the prompt or lower eval.max_new_tokens",
        )
    return need


def _finish(out: list[int], max_new_tokens: int, eos: set[int]) -> tuple[list[int], bool]:
    """Cut at the first eos (kept) or at max_new_tokens; True when generation is over."""
    for i, t in enumerate(out[:max_new_tokens]):
        if t in eos:
            return out[: i + 1], True
    return out[:max_new_tokens], len(out) >= max_new_tokens


def _begin(target: Transformer, prompt: Tensor, max_new_tokens: int, spec: DraftSpec | None, temperature: float,
           generator, first_token: int | None) -> tuple[list[int], Tensor | None, int]:
    """Reserve cache room, prefill the prompt, pick the first new token -> (out, aux of the prompt, cache rows)."""
    max_len = _check_room(target, prompt, max_new_tokens, spec)
    if target.max_len < max_len:
        target.setup_cache(max_len)
    logits, aux = prefill(target, prompt)
    return [sample(logits, temperature, generator) if first_token is None else first_token], aux, max_len


def plain_step(target: Transformer, root: int, length: int, temperature: float, generator) -> tuple[list[int], int]:
    """One decode step without a draft: the target's next token after root -> ([token], depth drafted = 0)."""
    return [sample(decode_one_token(target, root, length), temperature, generator)], 0


def speculative_step(target: Transformer, drafter, root: int, length: int, spec: DraftSpec, temperature: float,
                     generator) -> tuple[list[int], int]:
    """One speculative step (steps 1-4 above) -> (accepted draft tokens + the target's next token, depth drafted)."""
    tree, q = drafter.draft(root, spec, temperature, generator)
    logits, aux = verify_tree(target, tree, length)
    if temperature > 0:
        path, nxt = verify_sampling(tree, logits, q, temperature, generator)
    else:
        path, nxt = verify_greedy(tree, logits)
    compact_cache(target, length, path)
    new = [tree.tokens[n] for n in path[1:]] + [nxt]
    drafter.accepted(torch.tensor(new), None if aux is None else aux[path])
    return new, max(tree.depth)


@torch.inference_mode()
def decode(
    target: Transformer,
    prompt: Tensor,
    max_new_tokens: int,
    drafter=None,
    spec: DraftSpec | None = None,
    eos: set[int] | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    first_token: int | None = None,
) -> Generation:
    """Decode `prompt` with the static cache: plain autoregressive steps, or speculative ones when a drafter (and
    its DraftSpec) is given. With temperature 0 both give the same tokens; `first_token` replaces the prefill's
    sample (the sampling check starts every method from one token)."""
    if drafter is not None and spec is None:
        raise ValueError("a drafter needs a DraftSpec")
    spec = spec if drafter is not None else None  # without a drafter nothing is drafted: one cache row per step
    eos = eos or set()
    t0 = time.perf_counter()
    out, aux, max_len = _begin(target, prompt, max_new_tokens, spec, temperature, generator, first_token)
    if drafter is not None:
        drafter.setup(max_len + spec.max_nodes())
        drafter.start(prompt, out[0], aux)
    prefill_s = time.perf_counter() - t0
    length = prompt.numel()  # target cache rows; out[-1] (the root of the next step) is not in it yet
    stats = Stats()
    while True:
        out, done = _finish(out, max_new_tokens, eos)
        if done:
            return Generation(out, stats, prefill_s)
        if drafter is None:
            new, depth = plain_step(target, out[-1], length, temperature, generator)
        else:
            new, depth = speculative_step(target, drafter, out[-1], length, spec, temperature, generator)
        length += len(new)
        out += new
        stats.accepted.append(len(new) - 1)
        stats.drafted.append(depth)


def generate(target: Transformer, prompt: Tensor, max_new_tokens: int, eos: set[int] | None = None,
             temperature: float = 0.0, generator: torch.Generator | None = None, first_token: int | None = None) -> Generation:
    """Plain autoregressive decoding (the no-draft baseline): `decode` without a drafter."""
    return decode(target, prompt, max_new_tokens, None, None, eos, temperature, generator, first_token)


def speculative_decode(target: Transformer, drafter, prompt: Tensor, max_new_tokens: int, spec: DraftSpec,
                       eos: set[int] | None = None, temperature: float = 0.0, generator: torch.Generator | None = None,
                       first_token: int | None = None) -> Generation:
    """Speculative decoding: `decode` with a drafter; with temperature 0 the output equals `generate`'s token for
    token."""
    return decode(target, prompt, max_new_tokens, drafter, spec, eos, temperature, generator, first_token)


def speculative_on_prompts(target: Transformer, drafter, prompts: list[list[int]], max_new_tokens: int, spec: DraftSpec,
                           eos: set[int]) -> tuple[list[list[int]], Stats]:
    """Greedy speculative decoding of each prompt in turn -> (outputs, the steps' statistics pooled over prompts)."""
    outputs, stats = [], Stats()
    for p in prompts:
        g = speculative_decode(target, drafter, torch.tensor(p), max_new_tokens, spec, eos)
        outputs.append(g.tokens)
        stats.merge(g.stats)
    return outputs, stats
