"""Suffix drafting: propose what followed the longest earlier occurrence of the text's own suffix (the prompt and
the answer so far), alone, in front of a model drafter, or beside it as a second branch of one tree.

On copy-heavy work (editing code, answering about a given document, rewriting) the answer repeats long stretches
of its prompt, and a suffix match of many tokens predicts the next several exactly; a learned head guesses one
token at a time from hidden states and cannot beat a verbatim copy there. On free text matches are short and rare,
so the combination drafts with the suffix match only when it is long (`min_match` tokens), and with the model
drafter otherwise — the rule of TensorRT-LLM's EAGLE-3 with a suffix-automaton enhancer (`sa_config`).
"""

from __future__ import annotations

from dataclasses import replace

from torch import Tensor

from trtspec.errors import ModelError
from trtspec.runtime.drafters import DraftSpec
from trtspec.runtime.tree import Tree


class SuffixIndex:
    """The latest earlier end of every n-gram (n <= max_depth) of a growing token sequence.

    `match()` returns the longest suffix of the sequence that also ends at an earlier position, and that position:
    what a suffix automaton over the sequence answers, capped at `max_depth` tokens, with plain dicts (each new
    token adds max_depth keys; a query reads at most max_depth)."""

    def __init__(self, max_depth: int = 32):
        self.max_depth = max_depth
        self.tokens: list[int] = []
        self.last_end: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: list[int]) -> None:
        for t in tokens:
            # index the n-grams ending at the previous last token: a query must find ends before the current one
            i = len(self.tokens) - 1
            for n in range(1, min(self.max_depth, i + 1) + 1):
                self.last_end[tuple(self.tokens[i - n + 1 : i + 1])] = i
            self.tokens.append(t)

    def match(self, min_len: int = 1) -> tuple[int, int]:
        """(length, end) of the longest suffix (>= min_len tokens) seen ending earlier at `end`; (0, -1) if none."""
        best = (0, -1)
        for n in range(min_len, min(self.max_depth, len(self.tokens) - 1) + 1):
            end = self.last_end.get(tuple(self.tokens[-n:]))
            if end is None:
                break  # a longer suffix contains this one: it cannot have occurred either
            best = (n, end)
        return best

    def continuation(self, end: int, k: int) -> list[int]:
        return self.tokens[end + 1 : end + 1 + k]


class SuffixDrafter:
    """Suffix drafting alone: a chain of what followed the longest earlier match of the current suffix.

    The draft is as long as the match allows: min(spec.suffix_len, match length) tokens (a long match earns a long
    draft; a one-token match earns one guess), never longer than what followed the match. Deterministic: at
    temperature > 0 its q is one-hot, which keeps rejection sampling lossless (accept with probability p(x))."""

    name = "suffix"

    def __init__(self, max_depth: int = 32, min_match: int = 1):
        self.min_match = min_match
        self.index = SuffixIndex(max_depth)

    def setup(self, max_len: int) -> None:
        pass

    def start(self, prompt: Tensor, first: int, aux: Tensor | None) -> None:
        self.index = SuffixIndex(self.index.max_depth)
        self.index.extend(prompt.tolist() + [first])

    def accepted(self, tokens: Tensor, aux: Tensor | None) -> None:
        self.index.extend(tokens.tolist())

    def proposal(self, max_len: int) -> tuple[int, list[int]]:
        """(match length, at most max_len proposed tokens)."""
        n, end = self.index.match(self.min_match)
        return n, (self.index.continuation(end, min(max_len, n)) if n else [])

    def draft(self, root: int, spec: DraftSpec, temperature: float = 0.0, generator=None) -> tuple[Tree, Tensor | None]:
        return chain(root, self.proposal(spec.suffix_len or spec.k)[1]), None


class _SuffixWithModel:
    """A suffix drafter and a model drafter side by side: both see the prompt and every accepted token, so the
    model's cache stays in step with the target whichever of them drafted."""

    joiner = "+"

    def __init__(self, model, suffix: SuffixDrafter):
        self.model, self.suffix = model, suffix
        self.name = f"{model.name}{self.joiner}suffix"

    def setup(self, max_len: int) -> None:
        self.model.setup(max_len)

    def start(self, prompt: Tensor, first: int, aux: Tensor | None) -> None:
        self.model.start(prompt, first, aux)
        self.suffix.start(prompt, first, aux)

    def accepted(self, tokens: Tensor, aux: Tensor | None) -> None:
        self.model.accepted(tokens, aux)
        self.suffix.accepted(tokens, aux)


class SuffixThenModelDrafter(_SuffixWithModel):
    """A suffix match of at least `min_match` tokens drafts (spec.k tokens at most, the model drafter's own length);
    otherwise the model drafter does. This is TensorRT-LLM's rule for EAGLE-3 with `sa_config` (SADraftEnhancer:
    per request and step, all-or-nothing, threshold 4 by default)."""

    suffix_steps = 0

    def draft(self, root: int, spec: DraftSpec, temperature: float = 0.0, generator=None) -> tuple[Tree, Tensor | None]:
        n, tokens = self.suffix.proposal(spec.k)
        if tokens:
            self.suffix_steps += 1
            return chain(root, tokens), None
        return self.model.draft(root, spec, temperature, generator)


class SuffixBranchDrafter(_SuffixWithModel):
    """The model drafter's chain and, beside it in one tree, what followed the longest earlier match of the text's
    suffix (at least `min_match` tokens; spec.suffix_len tokens at most, spec.k where 0): the target's greedy walk
    takes whichever branch it agrees with. In front of the model (SuffixThenModelDrafter) a match must be long to be
    trusted over the model's guess; as a branch it needs no such trust, so a short match (a word of the prompt
    after the word before it) is verified too. What it buys: a head reading prompts unlike its training ones misses
    most of the words an answer copies from the prompt (docs/results.md, issue #68). Where both branches begin
    alike they share those nodes. Costs: up to k + suffix_len + 1 rows a verify pass (spec.shape chain_suffix
    reserves them). Greedy only: sampling verifies chains."""

    joiner = "|"
    branch_steps = 0  # steps whose tree held a suffix branch

    def draft(self, root: int, spec: DraftSpec, temperature: float = 0.0, generator=None) -> tuple[Tree, Tensor | None]:
        if temperature > 0:
            raise ModelError("sampling (temperature > 0) verifies chains only: a suffix branch beside the head is "
                             "greedy", "draft the suffix match in front of the head instead (SuffixThenModelDrafter)")
        if spec.shape != "chain_suffix":
            raise ValueError(f"a suffix branch needs DraftSpec(shape='chain_suffix') for its rows, not '{spec.shape}'")
        tree, _ = self.model.draft(root, replace(spec, shape="chain"), 0.0, generator)
        node, grew, children = 0, False, tree.children()
        for t in self.suffix.proposal(spec.suffix_len or spec.k)[1]:
            # the chain's nodes are shared while both agree; a node added past that has no children to share
            same = None if grew else next((c for c in children[node] if tree.tokens[c] == t), None)
            if same is None:
                same, grew = tree.add(t, node), True
            node = same
        self.branch_steps += grew
        return tree, None


def chain(root: int, tokens: list[int]) -> Tree:
    tree = Tree.root(root)
    for j, t in enumerate(tokens):
        tree.add(t, j)
    return tree
