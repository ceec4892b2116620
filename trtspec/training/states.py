"""What the frozen target computes for the draft (whatever its family): the hidden states of the layers the draft
reads and its last (post-norm) hidden state.

Where they come from (train.states_from): `HFStates`, the HF model's forward in this process, or an engine
(`trtspec.training.engine_states.VllmStates`); both hand back fp16 rows. How training reads them (train.mode):
`cache_states` computes every row once into memmaps that resume after a kill (`CachedStates`); `StreamedStates`
extracts them a window at a time, in the order the trainer reads rows, and forgets each row once read (a bounded
buffer, re-extracted every epoch); online, the target runs in every training step (neither).

How they are held (train.states_storage): fp16, or fp8 (e4m3) with one float32 scale per token and layer, the
layer's largest magnitude at fp8's largest (448): half the disk and half the buffer, and the trainer reads them back
as fp16 (`to_fp8`, `from_fp8`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def drop_collected_states(model: Any) -> None:
    """Forget the aux hidden states Model Optimizer's hooks collect on every forward of a converted base (a forward
    run for its states alone, outside modelopt's own training step, would otherwise leave them to pile up); nothing
    to do for a plain target."""
    if hasattr(model, "_aux_hidden_states"):
        model._aux_hidden_states.clear()


def base_states(base: Any, input_ids: Any, attention_mask: Any, aux_layers: list[int], bf16: bool = False) -> tuple[Any, Any]:
    """(aux, last): concat of the aux layers' outputs (pre-final-norm) [B, T, len(aux)*H], final post-norm [B, T, H].
    bf16: the target's matmuls in bfloat16 (autocast), its weights untouched."""
    import torch

    with torch.no_grad(), torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        out = base.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    drop_collected_states(base)
    # hidden_states[0] = embeddings, hidden_states[i + 1] = output of decoder layer i
    aux = torch.cat([out.hidden_states[i + 1] for i in aux_layers], dim=-1)
    return aux.float(), out.last_hidden_state.float()


FP8_MAX = 448.0  # float8_e4m3fn's largest finite value


def to_fp8(x: Any, groups: int) -> tuple[Any, Any]:
    """fp16 states [T, groups * H] -> (their e4m3 bytes, uint8 [T, groups * H]; scales, float32 [T, groups]): each
    token's state of each layer divided by its largest magnitude / 448 before rounding to fp8."""
    import numpy as np
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x)).float().view(x.shape[0], groups, -1)
    scale = t.abs().amax(-1).clamp(min=1e-12) / FP8_MAX
    q = (t / scale[..., None]).to(torch.float8_e4m3fn).view(torch.uint8)
    return q.reshape(x.shape).numpy(), scale.numpy()


def from_fp8(q: Any, scale: Any) -> Any:
    """to_fp8's bytes and scales -> fp16 states [T, groups * H]."""
    import numpy as np
    import torch

    t = torch.from_numpy(np.ascontiguousarray(q)).view(torch.float8_e4m3fn).float()
    t = t.view(q.shape[0], scale.shape[-1], -1) * torch.from_numpy(np.ascontiguousarray(scale))[..., None]
    return t.reshape(q.shape).to(torch.float16).numpy()


def stored(states: tuple[Any, Any], storage: str, aux_layers: int) -> tuple:
    """A row's (aux, last) as `storage` holds them: fp16 as they come, fp8 as (aux bytes, aux scales, last bytes,
    last scales)."""
    if storage == "fp16":
        return states
    aux, last = states
    return (*to_fp8(aux, aux_layers), *to_fp8(last, 1))


def loaded(held: tuple, n: int) -> tuple[Any, Any]:
    """`stored`'s row -> (aux, last) fp16, its first n tokens."""
    if len(held) == 2:
        return held[0][:n], held[1][:n]
    aux_q, aux_s, last_q, last_s = held
    return from_fp8(aux_q[:n], aux_s[:n]), from_fp8(last_q[:n], last_s[:n])


def token_bytes(hidden: int, aux: int, storage: str = "fp16") -> int:
    """Bytes one token's states take: [hidden] per aux layer and the last state, fp16 or fp8 with a float32 scale
    per state."""
    return (aux + 1) * (2 * hidden if storage == "fp16" else hidden + 4)


def row_lengths(tokens: dict) -> list[int]:
    """Real (unpadded) length of each right-padded row."""
    return tokens["attention_mask"].sum(1).tolist()


def states_bytes(tokens: dict, hidden: int, aux: int, storage: str = "fp16") -> int:
    """What cache_states writes: [rows, seq_len, hidden] for each aux layer and the last hidden state (token_bytes)."""
    n, t = tokens["input_ids"].shape
    return n * t * token_bytes(hidden, aux, storage)


def check_states_fit(folder: Path, tokens: dict, hidden: int, aux: int, storage: str = "fp16") -> None:
    """Refuse, before computing anything, offline states the disk cannot hold (what is already cached counts)."""
    import shutil

    need = states_bytes(tokens, hidden, aux, storage)
    have = sum(f.stat().st_size for f in folder.glob("*.npy")) if folder.is_dir() else 0
    probe = folder if folder.is_dir() else next(p for p in folder.parents if p.is_dir())
    free = shutil.disk_usage(probe).free
    if need - have > free:
        from trtspec.errors import ConfigError

        raise ConfigError(
            f"offline target states need {need / 2**30:.1f} GiB ({tokens['input_ids'].shape[0]} rows x "
            f"{tokens['input_ids'].shape[1]} tokens x {hidden} x {aux + 1} states, {storage}) and {probe} has "
            f"{free / 2**30:.1f} GiB free",
            "set train.mode: online (the target runs on every step) or streamed (a bounded buffer): nothing on disk; "
            "or train.states_storage: fp8 (half the disk); or free disk, or lower data.seq_len",
        )


class HFStates:
    """States from the HF target's forward in this process, a batch at a time (rows padded to the batch's longest)."""

    name = "hf"
    batch_rows = 16  # rows cache_states hands over at once

    def __init__(self, base: Any, aux_layers: list[int], bf16: bool = False, batch_size: int = 16):
        self.base, self.aux_layers, self.bf16, self.batch_size = base, aux_layers, bf16, batch_size

    def extract(self, rows: list[Any]) -> list[tuple[Any, Any]]:
        """[(aux [n, A*H], last [n, H]) as fp16 numpy] for each row of token ids (1-D tensors)."""
        import torch

        device = next(self.base.parameters()).device
        out = []
        for i in range(0, len(rows), self.batch_size):
            batch = rows[i : i + self.batch_size]
            cut = max(1, max(len(r) for r in batch))
            ids = torch.zeros(len(batch), cut, dtype=torch.long)
            mask = torch.zeros(len(batch), cut, dtype=torch.long)
            for j, r in enumerate(batch):
                ids[j, : len(r)], mask[j, : len(r)] = r, 1
            aux, last = base_states(self.base, ids.to(device), mask.to(device), self.aux_layers, self.bf16)
            out += [(aux[j, : len(r)].to(torch.float16).cpu().numpy(), last[j, : len(r)].to(torch.float16).cpu().numpy())
                    for j, r in enumerate(batch)]
        return out

    def close(self) -> None:
        pass


class CachedStates:
    """The offline cache (`cache_states`' memmaps) read by row, as fp16."""

    def __init__(self, maps: dict):
        self.maps = maps

    def row(self, i: int, n: int) -> tuple[Any, Any]:
        return loaded(tuple(self.maps[k][i, :n].copy() for k in STORED[self.maps["aux"].dtype.itemsize == 1]), n)

    def rows(self, picked: list[tuple[int, int]]) -> list[tuple[Any, Any]]:
        return [self.row(i, n) for i, n in picked]

    def close(self) -> None:
        pass  # its source closed once the cache was full


class StreamedStates:
    """States extracted by `source` as training reads them, through a bounded buffer.

    The trainer reads rows in its sampler's order for the epoch (`follow` hands that order over). A row missing from
    the buffer is extracted with the `window` rows the trainer reads after it (so the engine sees batches, not single
    rows); each row is dropped once read, so at most `window` rows are ever held, and every epoch extracts its rows
    again instead of keeping them. A run resumed mid-epoch starts its window where the trainer resumes."""

    def __init__(self, source: Any, tokens: dict, window: int, storage: str = "fp16", aux_layers: int = 1):
        self.source, self.tokens, self.window = source, tokens, max(1, window)
        self.storage, self.aux_layers = storage, aux_layers  # how the buffer holds a row (train.states_storage)
        self.lengths = [max(1, n) for n in row_lengths(tokens)]
        self.buffer: dict[int, tuple[Any, Any]] = {}
        self.order: Any = None  # () -> the rows in the order the trainer reads them this epoch
        self.stats = {"rows_extracted": 0, "windows": 0, "peak_buffer_bytes": 0}

    def follow(self, order: Any, batch_size: int = 1, world: int = 1, rank: int = 0) -> None:
        """order: () -> this epoch's rows in the order the trainer reads them. With several processes each reads the
        batches of `batch_size` rows dealt to it in turn (accelerate's BatchSamplerShard), and extracts those only."""
        self.order = order if world == 1 else lambda: rank_share(order(), batch_size, world, rank)

    def row(self, i: int, n: int) -> tuple[Any, Any]:
        if i not in self.buffer:
            self.fill_from(i)
        return loaded(self.buffer.pop(i), n)

    def fill_from(self, i: int) -> None:
        order = list(self.order()) if self.order else [i]
        at = order.index(i) if i in order else len(order)  # a row out of order (a last batch wrapped round): alone
        wanted = [r for r in dict.fromkeys([i] + order[at : at + self.window]) if r not in self.buffer][: self.window]
        for r, states in zip(wanted, self.source.extract([self.tokens["input_ids"][r, : self.lengths[r]] for r in wanted]),
                             strict=True):
            self.buffer[r] = stored(states, self.storage, self.aux_layers)
        self.stats["rows_extracted"] += len(wanted)
        self.stats["windows"] += 1
        held = sum(a.nbytes for row in self.buffer.values() for a in row)
        self.stats["peak_buffer_bytes"] = max(self.stats["peak_buffer_bytes"], held)

    def rows(self, picked: list[tuple[int, int]]) -> list[tuple[Any, Any]]:
        """The states of (row, length) pairs now, outside the trainer's order (the fit measure after training)."""
        got = self.source.extract([self.tokens["input_ids"][i, :n] for i, n in picked])
        return [(a[:n], b[:n]) for (a, b), (_, n) in zip(got, picked, strict=True)]

    def close(self) -> None:
        self.source.close()


def rank_share(order: list[int], batch_size: int, world: int, rank: int) -> list[int]:
    """The rows one of `world` processes reads, in order: batch b of `order` goes to process b % world."""
    return [r for b in range(rank, -(-len(order) // batch_size), world) for r in order[b * batch_size : (b + 1) * batch_size]]


def window_rows(budget_mib: float, seq_len: int, hidden: int, aux: int, storage: str = "fp16") -> int:
    """Rows a buffer of `budget_mib` MiB holds: [seq_len, hidden] per aux layer and the last state, per row."""
    return int(budget_mib * 2**20 // (seq_len * token_bytes(hidden, aux, storage)))


STORED = {False: ("aux", "last"), True: ("aux", "aux_scale", "last", "last_scale")}  # the cache's arrays: fp16, fp8


def cache_states(source: Any, tokens: dict, hidden: int, aux_layers: list[int], folder: Path, log: Any,
                 batch_size: int | None = None, storage: str = "fp16") -> dict:
    """Target hidden states of every training row in memmaps under `folder` (fp16, or fp8 with its scales: `stored`),
    from `source` (HFStates or an engine's); resumes after a kill. Rows go to the source shortest first, `batch_size`
    at a time (default: the source's `batch_rows`): little compute on padding."""
    import numpy as np
    from tqdm import tqdm

    n, t = tokens["input_ids"].shape
    h, a = hidden, len(aux_layers)
    batch_size = batch_size or source.batch_rows
    folder.mkdir(parents=True, exist_ok=True)
    fp8 = storage == "fp8"
    shapes = {"aux": (n, t, h * a), "aux_scale": (n, t, a), "last": (n, t, h), "last_scale": (n, t, 1)}
    dtypes = {"aux": np.uint8 if fp8 else np.float16, "last": np.uint8 if fp8 else np.float16}
    shapes = {k: shapes[k] for k in STORED[fp8]}
    progress = folder / "rows_done.json"
    saved = json.loads(progress.read_text()) if progress.is_file() else {}
    same = saved.get("order") == "by_length" and saved.get("storage", "fp16") == storage
    done = saved["rows"] if same else 0  # a cache filled in another order or storage: start over
    mode = "r+" if done else "w+"
    maps = {k: np.lib.format.open_memmap(folder / f"{k}.npy", mode=mode, dtype=dtypes.get(k, np.float32), shape=s)
            for k, s in shapes.items()}
    if done < n:
        log(f"caching target hidden states for {n} rows from {source.name} "
            f"({'resuming at ' + str(done) if done else 'once'})")
    lengths = row_lengths(tokens)
    order = sorted(range(n), key=lambda i: (lengths[i], i))
    bar = tqdm(total=n, initial=done, desc=f"target hidden states ({source.name})", unit="row", disable=done >= n)
    for i in range(done, n, batch_size):
        rows = order[i : i + batch_size]
        got = source.extract([tokens["input_ids"][r, : max(1, lengths[r])] for r in rows])
        for r, states in zip(rows, got, strict=True):
            for k, part in zip(shapes, stored(states, storage, a), strict=True):
                maps[k][r, : len(part)] = part
        for m in maps.values():
            m.flush()
        progress.write_text(json.dumps({"rows": i + len(rows), "order": "by_length", "storage": storage}))
        bar.update(len(rows))
    bar.close()
    return {k: np.load(folder / f"{k}.npy", mmap_mode="r") for k in shapes}
