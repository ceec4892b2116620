"""Generation helpers shared by every engine: batches, timing, and greedy agreement with a reference."""

from __future__ import annotations

import time
from collections.abc import Callable


def chunks(items: list, size: int) -> list[list]:
    """Consecutive batches of `size`, cycling the items so there is at least one full batch."""
    items = (items * (size // len(items) + 1))[: max(size, len(items))]
    return [items[i : i + size] for i in range(0, len(items), size)]


def tokens_per_s(generate: Callable[[list[list[int]]], list[list[int]]], prompts: list[list[int]], batch_size: int) -> float:
    """Generated tokens per second with `batch_size` requests submitted together (the engine batches them)."""
    n, t0 = 0, time.perf_counter()
    for batch in chunks(prompts, batch_size):
        n += sum(map(len, generate(batch)))
    return n / (time.perf_counter() - t0)


def compare(got: list[list[int]], want: list[list[int]]) -> dict:
    """Greedy agreement: exact sequences, and the mean length of the common prefix relative to the reference."""
    exact = sum(g == w for g, w in zip(got, want, strict=True))
    prefix = []
    for g, w in zip(got, want, strict=True):
        k = next((i for i, (a, b) in enumerate(zip(g, w, strict=False)) if a != b), min(len(g), len(w)))
        prefix.append(k / max(len(w), 1))
    return {"exact": exact, "total": len(want), "exact_fraction": round(exact / max(len(want), 1), 4),
            "mean_common_prefix": round(sum(prefix) / max(len(prefix), 1), 4)}
