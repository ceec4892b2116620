"""Draft trees: node 0 is the root (the last verified token, not yet in the target's cache); every other node is a
drafted token with a parent. A chain is the tree whose parents are 0, 1, 2, ...

The target verifies the whole tree in one pass: node i sits at position (cache length + depth[i]) and attends to
the cached prefix plus its own ancestors (ancestor-or-self mask), so each node sees exactly the sequence it would
see if its path were the only one.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class Tree:
    tokens: list[int]
    parents: list[int]  # parents[0] = -1
    depth: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # cumulative draft log-prob (dynamic trees)

    @classmethod
    def root(cls, token: int) -> Tree:
        return cls([token], [-1], [0], [0.0])

    def add(self, token: int, parent: int, score: float = 0.0) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depth.append(self.depth[parent] + 1)
        self.scores.append(score)
        return len(self.tokens) - 1

    def __len__(self) -> int:
        return len(self.tokens)

    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in self.tokens]
        for i, p in enumerate(self.parents[1:], start=1):
            kids[p].append(i)
        return kids

    def ancestor_mask(self) -> Tensor:
        """[N, N] bool: mask[i, j] = node j is node i or one of its ancestors."""
        n = len(self)
        mask = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):
            mask[i] |= mask[self.parents[i]]
        return mask

    def best(self, total: int) -> Tree:
        """The subtree of the `total` best-scored nodes (a dynamic tree's: a child never outscores its parent, so
        they are closed under ancestors)."""
        return self.subtree(sorted(range(1, len(self)), key=lambda n: -self.scores[n])[:total])

    def subtree(self, keep: list[int]) -> Tree:
        """The tree restricted to `keep` (closed under ancestors, root included), renumbered in order."""
        closed = {0}
        for n in keep:
            while n not in closed:
                closed.add(n)
                n = self.parents[n]
        keep = sorted(closed)
        new = {old: i for i, old in enumerate(keep)}
        t = Tree.root(self.tokens[0])
        for old in keep[1:]:
            t.add(self.tokens[old], new[self.parents[old]], self.scores[old])
        return t


def static_tree(topk: int, total: int, max_depth: int) -> list[tuple[int, ...]]:
    """A fixed tree as rank paths (like EAGLE's `choices`): the `total` most likely paths under a prior where the
    draft's rank-r guess is right with probability ~ 0.65 * 0.35^r, best-first, at most max_depth deep.

    (0,) is the draft's top guess after the root, (0, 1) the second guess after that, and so on.
    """
    def p(rank: int) -> float:
        return 0.65 * 0.35**rank

    paths: list[tuple[int, ...]] = []
    heap = [(-p(r), (r,)) for r in range(topk)]
    heapq.heapify(heap)
    while heap and len(paths) < total:
        neg, path = heapq.heappop(heap)
        paths.append(path)
        if len(path) < max_depth:
            for r in range(topk):
                heapq.heappush(heap, (neg * p(r), path + (r,)))
    return sorted(paths, key=lambda x: (len(x), x))


def tree_levels(choices: list[tuple[int, ...]]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Rank paths (`static_tree`'s form) -> the nodes of each depth as (parent: its index among the nodes one level
    up, 0 for the root; rank), each depth in the paths' order: Eagle3Draft.static_tree's plan. Nodes are numbered in
    that order (the root 0, then depth 1, depth 2, ...), as draft_static_tree numbers them."""
    by_depth: dict[int, list[tuple[int, ...]]] = {}
    for c in choices:
        by_depth.setdefault(len(c), []).append(tuple(c))
    if sorted(by_depth) != list(range(1, len(by_depth) + 1)):
        raise ValueError(f"tree paths skip a depth: depths {sorted(by_depth)}")
    levels, above = [], {(): 0}
    for d in range(1, len(by_depth) + 1):
        missing = [c for c in by_depth[d] if c[:-1] not in above]
        if missing:
            raise ValueError(f"tree path {missing[0]} has no parent path {missing[0][:-1]}")
        levels.append(tuple((above[c[:-1]], c[-1]) for c in by_depth[d]))
        above = {c: i for i, c in enumerate(by_depth[d])}
    return tuple(levels)
