"""What --check says a build will take: the rows a local source holds (lines, cut at its limit, less the held-out
share), unknown for a hub dataset without a limit, and the offline states' fp16 size of those rows."""

from __future__ import annotations

import json

from trtspec.config import config_from_dict
from trtspec.resources import FEW_ROWS, few_rows_warning, lines, training_rows

BASE = {"model": {"source": "demo:smollm2-135m-instruct"}}


def test_training_rows_from_local_files_and_limits(tmp_path):
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"text": f"q{i}"}) + "\n" for i in range(40)) + "\n")
    cfg = config_from_dict({**BASE, "data": {"sources": [{"kind": "regenerate", "path": "p.jsonl"},
                                                         {"kind": "regenerate", "path": "p.jsonl", "limit": 10}],
                                             "holdout_fraction": 0.25}}, base_dir=tmp_path)
    assert training_rows(cfg) == 37  # (40 + 10) x 0.75, the blank line not a row
    hub = config_from_dict({**BASE, "data": {"sources": [{"kind": "hf", "path": "org/chats"}]}}, base_dir=tmp_path)
    assert training_rows(hub) is None
    limited = config_from_dict({**BASE, "data": {"sources": [{"kind": "hf", "path": "org/chats", "limit": 100}],
                                                 "holdout_fraction": 0.1}}, base_dir=tmp_path)
    assert training_rows(limited) == 90


def test_the_lines_flag_what_exceeds_the_machine():
    est = {"target_weights_gib": 30.0, "trainer_loads": "the whole target", "free_memory_gib": 20.0,
           "training_rows": 1000, "states_gib": 80.0, "free_disk_gib": 50.0}
    memory, disk = lines(est)
    assert "weights 30.0 GiB (MORE than is free)" in memory and "20.0 GiB free now" in memory
    assert "at most 1000" in disk and "offline states at most 80.0 GiB (MORE than is free)" in disk
    assert "MORE" not in lines({**est, "target_weights_gib": 1.0})[0]


def test_few_training_rows_are_said_before_the_build_and_in_check(tmp_path):
    """A build whose sources hold fewer than FEW_ROWS training rows says so in one line before its data stage (and
    --check says it on its data line); one with enough says nothing."""
    def cfg(n):
        (tmp_path / f"p{n}.jsonl").write_text("".join(json.dumps({"text": f"q{i}"}) + "\n" for i in range(n)))
        return config_from_dict({**BASE, "data": {"sources": [{"kind": "regenerate", "path": f"p{n}.jsonl"}],
                                                  "holdout_fraction": 0.25}}, base_dir=tmp_path)

    assert few_rows_warning(cfg(12)).startswith("warning: the data sources give at most 9 training rows (FEW")
    assert few_rows_warning(cfg(2 * FEW_ROWS)) is None
    est = {"target_weights_gib": 1.0, "trainer_loads": "the whole target", "free_memory_gib": 20.0,
           "training_rows": 9, "states_gib": None, "free_disk_gib": 50.0}
    assert "at most 9 (FEW" in lines(est)[1] and "FEW" not in lines({**est, "training_rows": FEW_ROWS})[1]
