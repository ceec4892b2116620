"""StreamedStates: states extracted a window ahead in the trainer's order, each row dropped once read, never more
than a window held, every epoch extracted again; a run resumed mid-epoch extracts from where it resumes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trtspec.training.states import CachedStates, StreamedStates, cache_states, from_fp8, to_fp8, window_rows
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
    # fp8: (1 byte x 576 + a 4-byte scale) x 256 tokens x 4 states = 593,920 bytes a row: twice the rows, nearly
    assert window_rows(64, 256, 576, 3, "fp8") == 112


class WideSource:
    """Random states of a real model's spread: most values small, a few large outliers per token (as residual streams
    have), two aux layers of width 64 and the last state."""

    name = "wide"

    def extract(self, rows):
        g = torch.Generator().manual_seed(int(rows[0][0]))
        out = []
        for r in rows:
            x = torch.randn(len(r), 3 * 64, generator=g)
            x[:, ::37] *= 40  # outlier channels
            out.append((x[:, :128].half().numpy(), x[:, 128:].half().numpy()))
        return out


def assert_fp8_close(got: np.ndarray, want: np.ndarray, groups: int) -> None:
    """Within e4m3's rounding: 3 mantissa bits (half a step: 1/16 of the value), and below its smallest normal the
    subnormal step of each token's layer scale (largest magnitude / 448)."""
    want32, got32 = want.astype(np.float32), got.astype(np.float32)
    scale = np.abs(want32).reshape(len(want), groups, -1).max(-1, keepdims=True) / 448
    bound = np.abs(want32).reshape(len(want), groups, -1) / 16 + scale * 2.0**-9 + 1e-3 * np.abs(want32).reshape(len(want), groups, -1)
    assert (np.abs(got32 - want32).reshape(len(want), groups, -1) <= bound).all()
    assert not np.array_equal(got, want)  # stored as fp8 indeed


def test_fp8_states_round_trip_within_e4m3s_rounding():
    aux, last = WideSource().extract([torch.arange(7) + 3])[0]
    q, scale = to_fp8(aux, 2)
    assert q.dtype == np.uint8 and q.shape == aux.shape and scale.shape == (7, 2)
    assert_fp8_close(from_fp8(q, scale), aux, 2)
    assert_fp8_close(from_fp8(*to_fp8(last, 1)), last, 1)
    zeros = np.zeros((3, 8), np.float16)
    assert (from_fp8(*to_fp8(zeros, 2)) == 0).all()  # a token of zeros (padding) stays zeros, no division by zero


def test_fp8_cache_holds_the_states_in_half_the_disk_and_restarts_on_another_storage(tmp_path):
    tok = tokens(n=6, t=10)
    fp16 = CachedStates(cache_states(WideSource(), tok, 64, [0, 1], tmp_path / "a", print, 2))
    fp8 = CachedStates(cache_states(WideSource(), tok, 64, [0, 1], tmp_path / "b", print, 2, storage="fp8"))
    for i in range(6):
        (a16, l16), (a8, l8) = fp16.row(i, 7), fp8.row(i, 7)
        assert a8.dtype == np.float16 and a8.shape == a16.shape == (7, 128) and l8.shape == (7, 64)
        assert_fp8_close(a8, a16, 2)
        assert_fp8_close(l8, l16, 1)
    size = {k: sum(f.stat().st_size for f in (tmp_path / k).glob("*.npy")) for k in "ab"}
    assert 0.5 < size["b"] / size["a"] < 0.56  # half, and the scales
    cache_states(WideSource(), tok, 64, [0, 1], tmp_path / "a", print, 2, storage="fp8")  # the fp16 folder asked as fp8
    assert "fp8" in (tmp_path / "a" / "rows_done.json").read_text()  # filled again, not read as fp16


def test_a_streamed_fp8_buffer_holds_half_the_bytes():
    tok = tokens(n=8, t=10)
    peak = {}
    for storage in ("fp16", "fp8"):
        states = StreamedStates(WideSource(), tok, 8, storage, 2)
        states.follow(lambda: list(range(8)))
        rows = [states.row(i, 10) for i in range(8)]
        peak[storage] = states.stats["peak_buffer_bytes"]
        if storage == "fp16":
            want = rows
    for (a, last), (wa, wl) in zip(rows, want, strict=True):
        assert_fp8_close(a, wa, 2)
        assert_fp8_close(last, wl, 1)
    assert 0.5 < peak["fp8"] / peak["fp16"] < 0.56


def vllm_states_reading(tmp_path, aux_layers=(0, 2), layers=4, hidden=8):
    """A VllmStates that never loads vLLM: what it does with the files vLLM writes."""
    from trtspec.training.engine_states import VllmStates

    return VllmStates(tmp_path, list(aux_layers), layers, torch.nn.Identity(), tmp_path / "states", "float32", 64)


def test_vllm_files_are_read_in_trtspecs_numbering_and_deleted(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from trtspec.engines import vllm as vllm_engine

    monkeypatch.setattr(vllm_engine, "installed", lambda: True)
    states = vllm_states_reading(tmp_path)
    assert states.ids == [1, 3, 4]  # aux 0 -> id 1, aux 2 -> id 3, the last layer's output -> id 4
    hs = torch.stack([torch.full((5, 8), float(i)) for i in states.ids], dim=1)  # [tokens, ids, hidden]
    path = tmp_path / "r.safetensors"
    save_file({"hidden_states": hs, "token_ids": torch.arange(5)}, str(path))
    aux, last = states.read(path, torch.arange(5))
    assert aux.shape == (5, 16) and (aux[:, :8] == 1).all() and (aux[:, 8:] == 3).all() and (last == 4).all()
    assert not path.exists()


def test_vllm_states_of_other_tokens_are_refused(tmp_path, monkeypatch):
    import pytest
    from safetensors.torch import save_file

    from trtspec.engines import vllm as vllm_engine
    from trtspec.errors import DataError

    monkeypatch.setattr(vllm_engine, "installed", lambda: True)
    states = vllm_states_reading(tmp_path)
    path = tmp_path / "r.safetensors"
    save_file({"hidden_states": torch.zeros(3, 3, 8), "token_ids": torch.tensor([5, 6, 7])}, str(path))
    with pytest.raises(DataError, match="other token ids than the data stage's row"):
        states.read(path, torch.tensor([5, 6, 8]))


def test_an_unwritable_states_folder_and_aux_layers_past_the_target_are_refused(tmp_path, monkeypatch):
    import pytest

    from trtspec.engines import vllm as vllm_engine
    from trtspec.errors import ConfigError
    from trtspec.training.engine_states import VllmStates

    monkeypatch.setattr(vllm_engine, "installed", lambda: True)
    (tmp_path / "a-file").write_text("")
    states = VllmStates(tmp_path, [0], 4, torch.nn.Identity(), tmp_path / "a-file" / "states", "float32", 64)
    with pytest.raises(ConfigError, match="cannot write vLLM's hidden states"):
        states.prepare_folder()
    with pytest.raises(ConfigError, match=r"aux layers \[3\] are not inside the target's 4 layers"):
        VllmStates(tmp_path, [0, 3], 4, torch.nn.Identity(), tmp_path / "s", "float32", 64)


def test_the_states_servers_launch_line_and_its_absence_in_one_line(tmp_path):
    """train.states_from: endpoint: the launch line names the draft's layer ids, the folder and the port (the reference
    connector on a GPU, trtspec's plain-copy one and the CPU build's variables on a CPU); a server that does not answer
    is one line whose hint is that launch line; a file the server reported but never wrote is one line naming the
    folder setting."""
    import torch

    from trtspec.config import StatesEndpointSection
    from trtspec.errors import DataError
    from trtspec.training.engine_states import EndpointStates, launch_line, wait_written

    cpu = launch_line("/models/t", "float32", 200, [2, 3, 5], str(tmp_path), gpu=False, port=9)
    assert cpu.startswith("VLLM_CPU_KVCACHE_SPACE=") and "--port 9 " in cpu and "--enforce-eager" in cpu
    assert '"eagle_aux_hidden_state_layer_ids": [2, 3, 5]' in cpu and "CPUHiddenStatesConnector" in cpu and str(tmp_path) in cpu
    gpu = launch_line("/models/t", "bfloat16", 200, [2, 3, 5], "/shared", gpu=True, engine_args={"tensor_parallel_size": 4,
                                                                                                "enable_expert_parallel": True})
    assert gpu.startswith("python -m vllm.entrypoints.openai.api_server --model /models/t")
    assert "ExampleHiddenStatesConnector" in gpu and "--tensor-parallel-size 4 --enable-expert-parallel" in gpu
    source = EndpointStates(StatesEndpointSection(url="http://127.0.0.1:9", retries=0), [1, 2], 5, torch.nn.Identity(), cpu)
    with pytest.raises(DataError, match=r"^cannot reach train.states_endpoint \(http://127.0.0.1:9\)") as e:
        source.check(None, 100)
    assert e.value.hint == f"start it: {cpu}"
    with pytest.raises(DataError, match="did not appear within 0 s") as e:
        wait_written(tmp_path / "never.safetensors", 0.2, cpu)
    assert "train.states_endpoint.folder" in e.value.hint


def test_each_rank_extracts_only_the_rows_accelerate_deals_it():
    """Two processes: accelerate deals the sampler's batches in turn (BatchSamplerShard); each rank's streamed states
    extract exactly the rows that rank reads (with 11 batches, the second rank's last batch wraps round to the first
    rows: those are read, and extracted, on both), not every rank all the rows."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    tok = tokens(n=22)
    extracted, read = [], []
    for rank in range(2):
        src = CountingSource()
        states = StreamedStates(src, tok, window=5)
        ds = HeadDataset(tok, states)
        sampler = LengthGroupedEpochSampler(ds.lengths, 4, seed=1)
        states.follow(sampler.order, 2, 2, rank)
        read.append([i for batch in BatchSamplerShard(BatchSampler(sampler, 2, drop_last=False), 2, rank) for i in batch])
        for i in read[-1]:
            assert int(ds[i]["aux_hidden_states"][0, 0]) == 1000 + i
        extracted.append(sorted(r - 1000 for call in src.calls for r in call))
        assert extracted[-1] == sorted(read[-1]) and not states.buffer
    assert set(extracted[0]) | set(extracted[1]) == set(range(22)) and len(extracted[0]) + len(extracted[1]) == 24
