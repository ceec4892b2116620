"""A `datasets` dataset by its hub id or a local copy: what data.sources and eval.suites of kind hf load.

With no network (as on machines that reach no hub) a local copy needs none: a folder written by Dataset.save_to_disk,
or a data file as the hub serves datasets (.parquet, .json/.jsonl, .csv, .arrow; the text ones also gzip-, bzip2-, xz- or
zstd-compressed), read by datasets' own builders.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtspec.errors import DataError

DATA_FILE_BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv", ".arrow": "arrow"}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")  # a data file's outer suffix datasets reads through (data.jsonl.gz)


def data_file_suffix(path: str | Path) -> str:
    """The suffix that names a data file's kind, past a compression's (`train.jsonl.gz` -> `.jsonl`)."""
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


LOCAL_COPY = ("a local copy needs no network: a JSONL file (kind: jsonl), a .parquet/.json/.csv data file or a folder "
              "written by Dataset.save_to_disk (kind: hf, path: the file or folder)")


def load_hf_dataset(path: str | None, subset: str | None, split: str, resolve: Callable[[str], Path], where: str) -> Any:
    """The dataset `path` names, split `split`, by the real `datasets` code: a saved folder (load_from_disk), a local
    data file or folder of them (load_dataset with data_files), else a hub id with its config `subset` (load_dataset;
    with no network, one line). `resolve` makes a local path absolute (relative to the YAML); `where` starts each
    error: the config key and the dataset."""
    assert path is not None
    local = resolve(path)
    # a hub id is owner/name: a path that starts as a path does, exists, or ends as a data file does is a local copy
    looks_local = path.startswith((".", "/", "~")) or local.exists() or data_file_suffix(path) in DATA_FILE_BUILDERS
    if looks_local and not local.exists():
        raise DataError(f"{where}: '{local}' does not exist", "check its path (relative to the YAML)")
    try:
        import datasets

        if local.is_dir() and any((local / f).is_file() for f in ("state.json", "dataset_dict.json")):
            ds = datasets.load_from_disk(str(local))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise DataError(f"{where}: the saved dataset has no split '{split}' (its splits: {', '.join(ds)})",
                                    "set its split")
                ds = ds[split]
        elif local.is_file():
            builder = DATA_FILE_BUILDERS.get(data_file_suffix(local))
            if builder is None:
                raise DataError(f"{where}: '{local.name}' is no data file datasets reads by its name "
                                f"({', '.join(DATA_FILE_BUILDERS)})", "or give a JSONL file as kind: jsonl")
            ds = datasets.load_dataset(builder, data_files={split: str(local)}, split=split)
        elif looks_local:
            ds = datasets.load_dataset(str(local), subset, split=split)
        else:
            ds = datasets.load_dataset(path, subset, split=split)
    except DataError:
        raise
    except Exception as e:  # datasets raises many kinds (network, missing split, bad name, bad file)
        why = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        if not looks_local and isinstance(e, (ConnectionError, TimeoutError)):
            raise DataError(f"{where}: the hub cannot be reached ({why}); {LOCAL_COPY}") from None
        raise DataError(f"{where} cannot be loaded ({why})" + ("" if looks_local else f"; {LOCAL_COPY}")) from None
    return ds
