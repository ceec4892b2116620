"""The HF Trainer's private methods the head's trainer overrides or calls (trtspec/training/trainer.py TRAINER_PRIVATE):
each still there with the parameters relied on, and a changed one refused in one line before any stage runs."""

from __future__ import annotations

import pytest
from transformers import Trainer

from trtspec.errors import MissingDependency
from trtspec.training import trainer


@pytest.mark.parametrize("name", sorted(trainer.TRAINER_PRIVATE))
def test_the_installed_trainer_has_each_private_method_as_relied_on(name):
    import inspect

    params = tuple(inspect.signature(getattr(Trainer, name)).parameters)[1:]
    assert params == trainer.TRAINER_PRIVATE[name], f"transformers' Trainer.{name}{params}"


def test_a_trainer_that_changed_one_is_refused_before_training(monkeypatch):
    class Renamed(Trainer):
        def _save(self, output_dir=None, state_dict=None, safe_serialization=True):  # a parameter added upstream
            pass

    assert trainer.private_api_changes(Trainer) == []
    assert trainer.private_api_changes(Renamed) == ["_save(output_dir, state_dict)"]
    monkeypatch.setattr("transformers.Trainer", Renamed)
    with pytest.raises(MissingDependency, match=r"changed the Trainer methods .*_save\(output_dir, state_dict\)"):
        trainer.check_trainer_api()


def test_the_train_stage_checks_it_in_its_preflight(monkeypatch):
    from trtspec.config import config_from_dict
    from trtspec.stages import train

    calls = []
    monkeypatch.setattr(train, "check_trainer_api", lambda: calls.append(1))
    cfg = config_from_dict({"model": {"source": "x"}, "data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}})
    train.preflight(cfg, None)  # no eval.context_bins: the target's window is not read
    assert calls == [1]
