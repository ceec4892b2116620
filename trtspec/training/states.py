"""What the frozen target computes for the draft (whatever its family): the hidden states of the layers the draft
reads and its last (post-norm) hidden state, for a batch (`base_states`) or for every training row once, into fp16
memmaps that resume after a kill."""

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


def row_lengths(tokens: dict) -> list[int]:
    """Real (unpadded) length of each right-padded row."""
    return tokens["attention_mask"].sum(1).tolist()


def states_bytes(tokens: dict, hidden: int, aux: int) -> int:
    """What cache_states writes: fp16 [rows, seq_len, hidden] for each aux layer and the last hidden state."""
    n, t = tokens["input_ids"].shape
    return 2 * n * t * hidden * (aux + 1)


def check_states_fit(folder: Path, tokens: dict, hidden: int, aux: int) -> None:
    """Refuse, before computing anything, offline states the disk cannot hold (what is already cached counts)."""
    import shutil

    need = states_bytes(tokens, hidden, aux)
    have = sum(f.stat().st_size for f in folder.glob("*.npy")) if folder.is_dir() else 0
    probe = folder if folder.is_dir() else next(p for p in folder.parents if p.is_dir())
    free = shutil.disk_usage(probe).free
    if need - have > free:
        from trtspec.errors import ConfigError

        raise ConfigError(
            f"offline target states need {need / 2**30:.1f} GiB ({tokens['input_ids'].shape[0]} rows x "
            f"{tokens['input_ids'].shape[1]} tokens x {hidden} x {aux + 1} states, fp16) and {probe} has "
            f"{free / 2**30:.1f} GiB free",
            "set train.mode: online (the target runs on every step, nothing on disk), or free disk, or lower data.seq_len",
        )


def cache_states(base: Any, tokens: dict, aux_layers: list[int], folder: Path, batch_size: int, log: Any, bf16: bool = False) -> dict:
    """Target hidden states of every training row in fp16 memmaps under `folder`; resumes after a kill.
    Rows go through the target shortest first, each batch cut to its longest row: little compute on padding."""
    import numpy as np
    import torch
    from tqdm import tqdm

    n, t = tokens["input_ids"].shape
    h = base.config.hidden_size
    folder.mkdir(parents=True, exist_ok=True)
    shapes = {"aux": (n, t, h * len(aux_layers)), "last": (n, t, h)}
    progress = folder / "rows_done.json"
    saved = json.loads(progress.read_text()) if progress.is_file() else {}
    done = saved["rows"] if saved.get("order") == "by_length" else 0  # a cache filled in another order: start over
    mode = "r+" if done else "w+"
    maps = {k: np.lib.format.open_memmap(folder / f"{k}.npy", mode=mode, dtype=np.float16, shape=s) for k, s in shapes.items()}
    if done < n:
        log(f"caching target hidden states for {n} rows ({'resuming at ' + str(done) if done else 'once'}, {'bf16' if bf16 else 'fp32'} math)")
    lengths = row_lengths(tokens)
    order = sorted(range(n), key=lambda i: (lengths[i], i))
    device = next(base.parameters()).device
    bar = tqdm(total=n, initial=done, desc="target hidden states", unit="row", disable=done >= n)
    for i in range(done, n, batch_size):
        rows = order[i : i + batch_size]
        cut = max(1, max(lengths[r] for r in rows))
        ids = tokens["input_ids"][rows, :cut].to(device)
        aux, last = base_states(base, ids, tokens["attention_mask"][rows, :cut].to(device), aux_layers, bf16)
        for k, v in (("aux", aux), ("last", last)):
            maps[k][rows, :cut] = v.to(torch.float16).cpu().numpy()
            maps[k].flush()
        progress.write_text(json.dumps({"rows": i + len(rows), "order": "by_length"}))
        bar.update(len(rows))
    bar.close()
    return {k: np.load(folder / f"{k}.npy", mmap_mode="r") for k in shapes}
