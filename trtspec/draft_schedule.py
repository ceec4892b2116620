"""The draft length per batch size: chosen from a concurrency sweep, written in each engine's own form.

Speculation pays at one request and costs at many (the target's pass is memory-bound alone and compute-bound in a
full batch, so the drafted tokens that get rejected stop being free). Both engines take a draft length per batch size:

    TensorRT-LLM  speculative_config.draft_len_schedule: {the last batch size of a tier: its draft length}, e.g.
                  {4: 3, 8: 2} = 1-4 requests draft 3, 5-8 draft 2, 9 and more draft nothing (llmapi/llm_args.py,
                  DecodingBaseConfig.draft_len_schedule; _torch/speculative/utils.py get_draft_len_for_batch_size:
                  the first key >= the batch size, none: 0). Keys >= 1, lengths >= 0, the smallest key's length
                  equals max_draft_len and none exceeds it (validate_draft_len_schedule_and_sort). Releases before
                  March 2026 read the keys as thresholds ("from this batch size on") and required key 1.
    vLLM 0.32     speculative_config.num_speculative_tokens_per_batch_size: [[first, last, k], ...] inclusive,
                  sorted, non-overlapping ranges starting at 1; k >= 0, capped at num_speculative_tokens; batch sizes
                  past the last range keep its k (v1/spec_decode/dynamic/utils.py).

trtspec keeps a schedule as thresholds, {from batch size: draft length} (`serve.draft_len_schedule`, the sweep's
choice), and writes each engine's form from it: trtllm_tiers, vllm_ranges.
"""

from __future__ import annotations

import math
from typing import Any

Schedule = dict[int, int]  # batch size threshold -> draft length from there on (TensorRT-LLM's form)
SWEEP_FILE = "sweep.json"  # a serving sweep's rows and schedule (RUN/engine/, RUN/bench/): trtspec.engines.vllm.sweep


def schedule_problem(schedule: Schedule, max_draft_len: int) -> str | None:
    """Why TensorRT-LLM's or vLLM's config would refuse this schedule (None: both take it)."""
    if not schedule:
        return "it is empty"
    if bad := [b for b in schedule if b < 1]:
        return f"batch size {bad[0]} is below 1"
    if bad := [k for k in schedule.values() if k < 0]:
        return f"draft length {bad[0]} is negative"
    if 1 not in schedule:
        return "it has no entry for batch size 1 (both engines need every batch size covered from 1)"
    if schedule[1] != max_draft_len:
        return (f"batch size 1 drafts {schedule[1]} tokens, not draft.length {max_draft_len} (TensorRT-LLM: "
                "schedule[1] must equal max_draft_len)")
    if bad := [(b, k) for b, k in schedule.items() if k > max_draft_len]:
        return f"batch size {bad[0][0]} drafts {bad[0][1]} tokens, more than draft.length {max_draft_len}"
    return None


def vllm_ranges(schedule: Schedule) -> list[list[int]]:
    """vLLM's num_speculative_tokens_per_batch_size: each threshold's k up to the next threshold - 1; the last
    range ends at the threshold itself, and vLLM carries its k on to max_num_seqs."""
    sizes = sorted(schedule)
    ends = [nxt - 1 for nxt in sizes[1:]] + [sizes[-1]]
    return [[start, end, schedule[start]] for start, end in zip(sizes, ends, strict=True)]


def best_lengths(tokens_per_s: dict[int, dict[int, float | None]]) -> dict[int, int]:
    """{concurrency: the draft length with the most output tokens/s there}; tokens_per_s is {k: {concurrency:
    tokens/s}} with k = 0 meaning no draft. A level no k measured is left out."""
    levels = sorted({c for row in tokens_per_s.values() for c in row})
    best = {}
    for c in levels:
        measured = {k: row[c] for k, row in tokens_per_s.items() if row.get(c)}
        if measured:
            best[c] = max(measured, key=lambda k: (measured[k], -k))  # a tie goes to the shorter draft
    return best


def schedule_from_sweep(tokens_per_s: dict[int, dict[int, float | None]]) -> tuple[Schedule | None, str]:
    """The schedule a sweep implies, and what was decided: the fastest k at each measured concurrency, switched at
    the geometric midpoint between two measured levels (the first from batch size 1). A server at concurrency c
    runs batches of c requests only in its steady state and fewer while requests arrive and finish, so a switch
    placed at c itself would leave most of that level's steps on the length before it (measured: {1: 3, 4: 2,
    16: 0} at concurrency 16 kept drafting, 0.68x no draft). TensorRT-LLM takes no k above the one at batch size
    1, so a longer draft measured fastest further up is capped there, said in the note. None when no draft is
    fastest even at the lowest concurrency."""
    best = best_lengths(tokens_per_s)
    if not best:
        return None, "the sweep measured nothing"
    levels = sorted(best)
    first = best[levels[0]]
    if first == 0:
        return None, f"no draft is fastest at concurrency {levels[0]}: serve without speculation"
    schedule: Schedule = {}
    capped = []
    for i, c in enumerate(levels):
        k = min(best[c], first)
        if best[c] > first:
            capped.append(f"{c} ({best[c]} -> {first})")
        if not schedule or schedule[max(schedule)] != k:
            schedule[1 if i == 0 else max(levels[i - 1] + 1, round(math.sqrt(levels[i - 1] * c)))] = k
    note = ", ".join(f"k={k} from {b}" for b, k in schedule.items())
    return schedule, note + (f"; capped at batch size 1's k: {', '.join(capped)}" if capped else "")


def trtllm_tiers(schedule: Schedule, max_batch_size: int) -> dict[int, int]:
    """TensorRT-LLM's draft_len_schedule: each threshold's length keyed by the last batch size before the next
    threshold; a last tier that drafts runs to max_batch_size, one that does not is left to TensorRT-LLM's implicit
    0 past the largest key. {1: 3, 2: 2, 8: 0} -> {1: 3, 7: 2}; {1: 3, 16: 1} with 64 -> {15: 3, 64: 1}."""
    sizes = sorted(schedule)
    tiers = {nxt - 1: schedule[size] for size, nxt in zip(sizes, sizes[1:], strict=False)}
    if schedule[sizes[-1]]:
        tiers[max(sizes[-1], max_batch_size)] = schedule[sizes[-1]]
    return tiers


def from_trtllm_tiers(tiers: dict[int, int]) -> Schedule:
    """trtllm_tiers undone: thresholds, with 0 from one past the largest key (TensorRT-LLM's implicit tier)."""
    keys = sorted(tiers)
    schedule = {1: tiers[keys[0]]}
    for key, nxt in zip(keys, [*keys[1:], None], strict=True):
        length = tiers[nxt] if nxt is not None else 0
        if length != schedule[max(schedule)]:
            schedule[key + 1] = length
    return schedule


def with_schedule_trtllm(spec: dict[str, Any], schedule: Schedule, max_batch_size: int) -> dict[str, Any]:
    """TensorRT-LLM's speculative_config with the schedule (max_draft_len = the length at batch size 1)."""
    return {**spec, "max_draft_len": schedule[1], "draft_len_schedule": trtllm_tiers(schedule, max_batch_size)}


def with_schedule_vllm(spec: dict[str, Any], schedule: Schedule) -> dict[str, Any]:
    """vLLM's speculative_config with the schedule (num_speculative_tokens = the longest it drafts)."""
    return {**spec, "num_speculative_tokens": max(schedule.values()),
            "num_speculative_tokens_per_batch_size": vllm_ranges(schedule)}
