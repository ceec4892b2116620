"""Drafters behind one interface: the model drafters' shared walk (ModelDrafter: chains and trees over a network with
its own KV cache), draft-target (a small LM with the same tokenizer), n-gram. Each draft family's own drafter is in its
package (trtspec.eagle.runtime, trtspec.dflash.runtime, trtspec.dflash2.runtime).

    start(prompt, first, aux)   the prompt and the target's first token are verified
    draft(root, spec, T, gen)   propose a Tree below `root` (the last verified token) and, when sampling a chain,
                                the draft distribution q of every drafted token over the target vocab [N-1, V]
    accepted(tokens, aux)       the target accepted `tokens` (accepted drafts + its own next token); aux are the
                                target's aux hidden states at the positions *before* each of those tokens

Model drafters keep their own static KV cache: `length` rows are verified; a draft tree is written after them
and simply forgotten (length unchanged) once the target has judged it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from trtspec.errors import ModelError
from trtspec.runtime.settings import DEFAULT as DEFAULT_SETTINGS
from trtspec.runtime.settings import RuntimeSettings
from trtspec.runtime.tree import Tree, static_tree


@dataclass
class DraftSpec:
    shape: str = "chain"  # chain | tree | dynamic_tree | chain_suffix (runtime/suffix.py's SuffixBranchDrafter)
    k: int = 3  # chain length / tree depth
    topk: int = 4  # branching of trees
    total: int = 16  # drafted nodes in a tree (root excluded)
    choices: list[tuple[int, ...]] = field(default_factory=list)  # static tree as rank paths (default: static_tree)
    suffix_len: int = 0  # longest chain a suffix match may draft (0 = k); runtime/suffix.py

    def tree_choices(self) -> list[tuple[int, ...]]:
        return self.choices or static_tree(self.topk, self.total, self.k)

    def max_nodes(self) -> int:
        """Upper bound on tree size including the root (cache room to reserve)."""
        suffix = self.suffix_len + 1
        if self.shape == "chain_suffix":  # the model's chain and a suffix match's branch beside it
            return self.k + (self.suffix_len or self.k) + 1
        if self.shape == "chain":
            return max(self.k + 1, suffix)
        if self.shape == "tree":
            return max(len(self.tree_choices()) + 1, suffix)
        return max(self.total, self.topk, self.suffix_len) + 1


def softmax_t(logits: Tensor, temperature: float) -> Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


class ModelDrafter:
    """Shared bookkeeping of drafters that run a network with a KV cache (EAGLE-3 and draft-target)."""

    name = "model"

    def __init__(self, vocab_ids: Tensor | None, vocab_size: int):
        self.vocab_ids = vocab_ids  # draft vocab index -> target id (None: identical vocabularies)
        self.vocab_size = vocab_size
        self.length = 0
        self.root_logits: Tensor | None = None
        self.root_hidden: Tensor | None = None

    def drafts_token(self, token: int) -> bool:
        """Whether the draft's vocabulary holds target token `token` (a compressed one holds only some)."""
        return self.vocab_ids is None or bool((self.vocab_ids == token).any())

    # subclasses: _forward(tokens, hidden, positions, slots, length, mask) -> (logits [T, Vd], hidden_out [T, H] | None)
    def _forward(self, tokens, hidden, positions, slots, length, mask):
        raise NotImplementedError

    def _verified_hidden(self, aux: Tensor | None) -> Tensor | None:
        return None

    def setup(self, max_len: int) -> None:
        raise NotImplementedError

    def _catch_up(self, tokens: Tensor, aux: Tensor | None, forward=None) -> None:
        """Append verified tokens to the cache; keep the last row's logits/hidden (the root's children). `forward`
        replaces `_forward` (e.g. an eager pass, for a row count the compiled pass holds no graph for)."""
        m, L = tokens.numel(), self.length
        mask = "causal" if L == 0 else (None if m == 1 else torch.ones(m, L + m, dtype=torch.bool).tril(L))
        idx = torch.arange(L, L + m)
        logits, hidden = (forward or self._forward)(tokens, self._verified_hidden(aux), idx, idx, L + m, mask)
        self.root_logits = logits[-1]
        self.root_hidden = None if hidden is None else hidden[-1]
        self.length = L + m
        self._slot: dict[int, int] = {}  # tree node -> cache row of its query
        self._hidden: dict[int, Tensor] = {}

    def expand(self, tree: Tree, nodes: list[int]) -> Tensor:
        """Run the draft on tree nodes whose parents were expanded already -> logits of their children [m, Vd]."""
        L, first = self.length, self.length + len(self._slot)
        slots = list(range(first, first + len(nodes)))
        for n, s in zip(nodes, slots, strict=True):
            self._slot[n] = s
        used = first + len(nodes)
        mask = torch.zeros(len(nodes), used, dtype=torch.bool)
        mask[:, :L] = True
        for row, n in enumerate(nodes):
            while n > 0:  # ancestors-or-self, the root's query is already among the verified rows
                mask[row, self._slot[n]] = True
                n = tree.parents[n]
        tokens = torch.tensor([tree.tokens[n] for n in nodes])
        # the root's query sits at position L - 1, a node at depth d at L - 1 + d
        positions = torch.tensor([L - 1 + tree.depth[n] for n in nodes])
        hidden = None
        if self.root_hidden is not None:
            hidden = torch.stack([self._hidden.get(tree.parents[n], self.root_hidden) for n in nodes])
        logits, out = self._forward(tokens, hidden, positions, torch.tensor(slots), used, mask)
        if out is not None:
            for n, h in zip(nodes, out, strict=True):
                self._hidden[n] = h
        return logits

    def passes_per_step(self, spec: DraftSpec) -> int:
        """Passes of the network one draft makes: one per guess of a chain (the first with the newly verified
        rows), one per level of a tree."""
        return spec.k

    def to_target(self, ids: Tensor) -> Tensor:
        return ids if self.vocab_ids is None else self.vocab_ids[ids]

    def full_probs(self, probs: Tensor) -> Tensor:
        """Draft-vocab probabilities -> target-vocab probabilities (zero outside the draft vocab)."""
        if self.vocab_ids is None:
            return probs
        return torch.zeros(*probs.shape[:-1], self.vocab_size).index_copy_(-1, self.vocab_ids, probs)

    def draft(self, root: int, spec: DraftSpec, temperature: float = 0.0, generator=None) -> tuple[Tree, Tensor | None]:
        if spec.shape == "chain":
            return draft_chain(self, root, spec.k, temperature, generator)
        if temperature > 0:
            raise ModelError("sampling (temperature > 0) verifies chains only", "use draft_shape: chain")
        if spec.shape == "tree":
            return draft_static_tree(self, root, spec.tree_choices()), None
        return draft_dynamic_tree(self, root, spec.k, spec.topk, spec.total), None


def draft_chain(d: ModelDrafter, root: int, k: int, temperature: float, generator) -> tuple[Tree, Tensor | None]:
    tree, qs = Tree.root(root), []
    logits = d.root_logits
    for j in range(k):
        if temperature > 0:
            probs = softmax_t(logits, temperature)
            i = torch.multinomial(probs, 1, generator=generator)
            qs.append(d.full_probs(probs))
        else:
            i = logits.argmax(-1, keepdim=True)
        node = tree.add(int(d.to_target(i)), j)
        if j + 1 < k:
            logits = d.expand(tree, [node])[0]
    return tree, torch.stack(qs) if qs else None


def draft_static_tree(d: ModelDrafter, root: int, choices: list[tuple[int, ...]]) -> Tree:
    """Fixed shape: node `path + (r,)` is the rank-r draft guess after `path`. One draft pass per depth."""
    tree = Tree.root(root)
    node_of: dict[tuple[int, ...], int] = {(): 0}
    ranked = {(): d.to_target(d.root_logits.topk(1 + max(c[0] for c in choices)).indices).tolist()}
    for depth in range(1, max(map(len, choices)) + 1):
        level = [c for c in choices if len(c) == depth]
        for c in level:
            node_of[c] = tree.add(ranked[c[:-1]][c[-1]], node_of[c[:-1]])
        parents = sorted({c for c in level if any(len(x) == depth + 1 and x[:-1] == c for x in choices)}, key=node_of.get)
        if parents:
            width = 1 + max(x[-1] for x in choices if len(x) == depth + 1)
            top = d.to_target(d.expand(tree, [node_of[c] for c in parents]).topk(width).indices).tolist()
            ranked.update(zip(parents, top, strict=True))
    return tree


def draft_dynamic_tree(d: ModelDrafter, root: int, depth: int, topk: int, total: int) -> Tree:
    """EAGLE-2: grow the tree by expanding the top-k nodes by cumulative draft log-prob, then keep the best `total`.

    score(node) = sum of log q along its path, so a child never outscores its parent: the best `total` nodes
    form a tree (closed under ancestors).
    """
    tree = Tree.root(root)
    logp = torch.log_softmax(d.root_logits.float(), -1)
    top = logp.topk(topk)
    frontier = [tree.add(t, 0, s) for t, s in zip(d.to_target(top.indices).tolist(), top.values.tolist(), strict=True)]
    for _ in range(depth - 1):
        logp = torch.log_softmax(d.expand(tree, frontier).float(), -1)
        top = logp.topk(topk)  # [k, k]
        scores = top.values + torch.tensor([tree.scores[n] for n in frontier])[:, None]
        best = scores.flatten().topk(topk).indices.tolist()
        ids = d.to_target(top.indices).tolist()
        added = {}
        for r, parent in enumerate(frontier):  # every candidate joins the tree; only the best k are expanded
            for c in range(topk):
                added[r * topk + c] = tree.add(ids[r][c], parent, float(scores[r, c]))
        frontier = [added[b] for b in best]
    return tree.best(total)


class LMDrafter(ModelDrafter):
    """Classic draft-target: a smaller causal LM with the target's tokenizer proposes tokens."""

    name = "draft_target"

    def __init__(self, model):
        super().__init__(None, model.args.vocab_size)
        self.net = model

    def setup(self, max_len: int) -> None:
        if self.net.max_len < max_len:
            self.net.setup_cache(max_len)

    def _forward(self, tokens, hidden, positions, slots, length, mask):
        return self.net.step(tokens, positions, slots, length, mask)[0], None

    def start(self, prompt: Tensor, first: int, aux: Tensor | None) -> None:
        self.length = 0
        self._catch_up(torch.cat((prompt, torch.tensor([first]))), None)

    def accepted(self, tokens: Tensor, aux: Tensor | None) -> None:
        self._catch_up(tokens, None)


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens and propose what followed it."""

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.history: list[int] = []

    def setup(self, max_len: int) -> None:
        pass

    def start(self, prompt: Tensor, first: int, aux: Tensor | None) -> None:
        self.history = prompt.tolist() + [first]

    def accepted(self, tokens: Tensor, aux: Tensor | None) -> None:
        self.history.extend(tokens.tolist())

    def lookup(self, k: int) -> list[int]:
        h = self.history
        for n in range(min(self.max_ngram, len(h) - 1), self.min_ngram - 1, -1):
            tail = h[-n:]
            for start in range(len(h) - n - 1, -1, -1):
                if h[start : start + n] == tail:
                    return h[start + n : start + n + k]
        return []

    def draft(self, root: int, spec: DraftSpec, temperature: float = 0.0, generator=None) -> tuple[Tree, Tensor | None]:
        tree = Tree.root(root)
        for j, t in enumerate(self.lookup(spec.k)):
            tree.add(t, j)
        # a deterministic guess is a one-hot q: accepting with prob min(1, p(x)/1) = p(x) stays lossless
        return tree, None


# ---------------------------------------------------------------------------------------------- loading


def same_tokenizer(a: Path, b: Path) -> bool:
    from trtspec.models import load_tokenizer

    ta, tb = load_tokenizer(a), load_tokenizer(b)
    return ta.get_vocab() == tb.get_vocab() and ta.eos_token_id == tb.eos_token_id


def load_draft_target(draft_dir: Path, target_dir: Path, dtype=torch.float32,
                      settings: RuntimeSettings = DEFAULT_SETTINGS) -> LMDrafter:
    """A draft LM for draft-target decoding; refuses a model with another tokenizer."""
    from trtspec.runtime.model import load_transformer

    if not same_tokenizer(Path(draft_dir), Path(target_dir)):
        raise ModelError(
            f"draft model '{draft_dir}' has a different tokenizer than the target '{target_dir}'",
            "draft-target decoding needs the same vocabulary; pick a draft from the target's model family",
        )
    model, _ = load_transformer(draft_dir, dtype, settings=settings)
    return LMDrafter(model)
