"""What a build will take of this machine, estimated before it runs (`trtspec build --check`): the target's weights
against the free memory, the training rows its data sources hold, the offline states they make against the free disk.

Exact where the inputs say it (a checkpoint's size, a file's lines, the states' fp16 layout), None where they cannot
(a dataset on the hub, a model not yet fetched)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trtspec.config import BuildConfig

GIB = 2**30
# fewer training conversations than this and a draft learns its answers, not the target: the CI recipe's 18 make a
# draft that accepts about nothing held out (AL@3 1.06), the demo's 2134 one of AL@3 1.86
FEW_ROWS = 256


def estimate(cfg: BuildConfig, run_dir: Path) -> dict[str, Any]:
    """{target_weights_gib, free_memory_gib, training_rows, states_gib, free_disk_gib, trainer_loads}."""
    from trtspec.models import resolve_model
    from trtspec.runtime.kernels import available_memory_mb
    from trtspec.targets import text_config

    target = resolve_model(cfg.model.source)
    weights = sum(p.stat().st_size for p in Path(target).glob("*.safetensors")) / GIB
    rows = training_rows(cfg)
    states = None
    if rows is not None and cfg.train.mode == "offline":
        from transformers import AutoConfig

        text = text_config(AutoConfig.from_pretrained(target))
        aux = len(cfg.convert.aux_layers or [0, 0, 0])  # EAGLE-3's and DFlash's default: three target layers
        states = 2 * rows * cfg.data.seq_len * text.hidden_size * (aux + 1) / GIB  # fp16, every row padded to seq_len
    free_mb = available_memory_mb()
    probe = next(p for p in (Path(run_dir).resolve(), *Path(run_dir).resolve().parents) if p.is_dir())
    return {
        "target_weights_gib": round(weights, 2),
        "trainer_loads": "embeddings, final norm and output head" if cfg.train.states_from != "hf" else "the whole target",
        "free_memory_gib": round(free_mb / 1024, 1) if free_mb is not None else None,
        "training_rows": rows,
        "states_gib": round(states, 2) if states is not None else None,
        "free_disk_gib": round(shutil.disk_usage(probe).free / GIB, 1),
    }


def training_rows(cfg: BuildConfig) -> int | None:
    """The training rows the data sources give at most: each local file's rows (lines), cut at its limit, less the
    held-out share; None when a source's size is not known before it is read (a dataset on the hub, a run)."""
    total = 0
    for s in cfg.data.sources:
        path = cfg.resolve_path(s.path)
        if s.kind in ("hf", "run") or not path.is_file():
            if s.limit is None:
                return None
            total += s.limit
            continue
        with path.open("rb") as f:
            lines = sum(1 for line in f if line.strip())
        total += min(lines, s.limit or lines)
    return int(total * (1 - cfg.data.holdout_fraction))


def lines(est: dict[str, Any]) -> list[str]:
    """`--check`'s words for an estimate."""
    def gib(v: float | None) -> str:
        return "unknown" if v is None else f"{v} GiB"

    def over(need: float | None, free: float | None) -> str:
        return " (MORE than is free)" if need is not None and free is not None and need > free else ""

    out = [f"memory: the target's weights {gib(est['target_weights_gib'])}"
           f"{over(est['target_weights_gib'], est['free_memory_gib'])} (the trainer loads {est['trainer_loads']}); "
           f"{gib(est['free_memory_gib'])} free now"]
    rows = "unknown before the data stage reads its sources" if est["training_rows"] is None else f"at most {est['training_rows']}"
    disk = (f"offline states at most {gib(est['states_gib'])}{over(est['states_gib'], est['free_disk_gib'])}; "
            if est["states_gib"] is not None else "")
    out.append(f"data: training rows {rows}{few(est['training_rows']) or ''}; disk: {disk}{gib(est['free_disk_gib'])} "
               "free where the run is written")
    return out


def few(rows: int | None) -> str | None:
    """Why `rows` training conversations are too few to expect a useful draft, or None."""
    if rows is None or rows >= FEW_ROWS:
        return None
    return (f" (FEW: a draft trained on fewer than {FEW_ROWS} conversations learns its answers, not the target; "
            "expect little acceptance on other prompts)")


def few_rows_warning(cfg: BuildConfig) -> str | None:
    """The line a build prints before its data stage when its sources hold few training rows (a warning, not a
    refusal: a smoke test of the path is a use too)."""
    rows = training_rows(cfg)
    return f"warning: the data sources give at most {rows} training rows{few(rows)}" if few(rows) else None
