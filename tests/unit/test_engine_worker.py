"""trtspec.engines.worker: an engine object built and called here, or in a spawned process of its own, alike; what the
engine does to its process's modules (as vLLM's Transformers backend rewrites transformers') stays there, and a
trtspec error raised where it lives arrives whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtspec.engines.worker import EngineWorker
from trtspec.errors import DataError


def open_counter(start: int, marker: str) -> dict:
    import json  # a module the "engine" rewrites in the process it lives in

    json.rewritten_by_the_engine = True
    return {"n": start, "marker": marker, "pid": __import__("os").getpid()}


def bump(engine: dict, by: int) -> tuple[int, int]:
    engine["n"] += by
    return engine["n"], engine["pid"]


def fail(engine: dict) -> None:
    raise DataError("the request log holds no usable prompt", "give a JSONL of chat prompts")


def close_counter(engine: dict) -> None:
    Path(engine["marker"]).write_text(str(engine["n"]))


@pytest.mark.parametrize("spawned", [False, True])
def test_the_engine_lives_where_it_was_asked_and_keeps_its_state(spawned, tmp_path, monkeypatch):
    import json
    import os

    monkeypatch.delattr(json, "rewritten_by_the_engine", raising=False)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # the spawned worker imports this module by name
    marker = tmp_path / "closed"
    worker = EngineWorker(open_counter, (10, str(marker)), close_counter, spawned=spawned)
    assert not worker.opened  # nothing built before the first call
    assert worker.call(bump, 1)[0] == 11
    n, pid = worker.call(bump, 2)
    assert n == 13 and (pid != os.getpid()) == spawned
    assert hasattr(json, "rewritten_by_the_engine") != spawned, "a spawned engine leaves this process's modules alone"
    with pytest.raises(DataError) as raised:
        worker.call(fail)
    assert raised.value.hint == "give a JSONL of chat prompts"
    worker.close()
    assert marker.read_text() == "13" and not worker.opened


def die(engine: dict) -> None:
    import os

    os._exit(9)  # as the kernel's out-of-memory kill leaves it: no answer, no exception


def test_a_spawned_engine_whose_process_dies_is_one_clear_error_and_closes(tmp_path, monkeypatch):
    from trtspec.engines.worker import in_own_process
    from trtspec.errors import ProcessDied

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    worker = EngineWorker(open_counter, (0, str(tmp_path / "closed")), close_counter, spawned=True)
    worker.call(bump, 1)
    with pytest.raises(ProcessDied, match="ended without answering") as raised:
        worker.call(die)
    assert raised.value.exit_code == 5 and "memory" in raised.value.hint
    with pytest.raises(ProcessDied):  # the next call too, not a hang
        worker.call(bump, 1)
    worker.close()
    assert not worker.opened and not (tmp_path / "closed").exists()
    with pytest.raises(ProcessDied):
        in_own_process(die, {})
