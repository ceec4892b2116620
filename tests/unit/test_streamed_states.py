"""StreamedStates: states extracted a window ahead in the trainer's order, each row dropped once read, never more
than a window held, every epoch extracted again; a run resumed mid-epoch extracts from where it resumes."""

from __future__ import annotations

import numpy as np
import torch

from trtspec.training.states import StreamedStates, window_rows
from trtspec.training.trainer import HeadDataset, LengthGroupedEpochSampler


class CountingSource:
    """Each row's states are its token ids broadcast: what a row reads back says which row it came from."""

    name = "fake"

    def __init__(self):
        self.calls: list[list[int]] = []

    def extract(self, rows):
        self.calls.append([int(r[0]) for r in rows])
        return [(np.repeat(r.numpy()[:, None], 2, 1).astype(np.float16), r.numpy()[:, None].astype(np.float16))
                for r in rows]


def tokens(n: int = 20, t: int = 8) -> dict:
    ids = torch.arange(n).repeat_interleave(t).reshape(n, t) + 1000  # row i: all tokens 1000 + i
    mask = torch.ones(n, t, dtype=torch.long)
    mask[::3, 5:] = 0  # some shorter rows
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": mask.clone()}


def test_rows_come_back_right_in_windows_and_are_dropped_once_read():
    tok, src = tokens(), CountingSource()
    states = StreamedStates(src, tok, window=6)
    ds = HeadDataset(tok, states)
    sampler = LengthGroupedEpochSampler(ds.lengths, 4, seed=0)
    states.follow(sampler.order)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for i in sampler:
            row = ds[i]
            assert int(row["aux_hidden_states"][0, 0]) == 1000 + i and len(row["aux_hidden_states"]) == ds.lengths[i]
            assert len(states.buffer) <= 6
    assert states.stats["rows_extracted"] == 2 * 20  # every epoch extracts again, nothing extracted twice in one
    assert all(len(c) <= 6 for c in src.calls) and len(src.calls) == states.stats["windows"]
    assert not states.buffer and states.stats["peak_buffer_bytes"] > 0


def test_a_resumed_epoch_extracts_from_where_it_resumes():
    tok, src = tokens(), CountingSource()
    states = StreamedStates(src, tok, window=5)
    sampler = LengthGroupedEpochSampler([8] * 20, 4, seed=3)
    states.follow(sampler.order)
    order = sampler.order()
    for i in order[12:]:  # the trainer skipped the first 12 rows it had trained on
        states.row(i, 8)
    assert src.calls[0] == [1000 + r for r in order[12:17]]
    assert states.stats["rows_extracted"] == 8


def test_the_buffer_budget_in_rows():
    # fp16: 2 bytes x 256 tokens x 576 wide x (3 aux + last) = 1,179,648 bytes a row
    assert window_rows(64, 256, 576, 3) == 56
    assert window_rows(1, 256, 576, 3) == 0
