"""Two processes resolving the demo model at once on an empty model cache (two builds started together on a new
machine): both get the model, and the cache holds one whole folder, nothing half-written beside it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

RESOLVE = "from trtspec.models import load_tokenizer, resolve_model; p = resolve_model('demo:smollm2-135m-instruct'); " \
          "load_tokenizer(p); print(p)"


@pytest.mark.integration
def test_two_processes_on_an_empty_cache_both_get_the_whole_model(tmp_path):
    env = {**os.environ, "TRTSPEC_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", RESOLVE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    paths = {out.strip().splitlines()[-1] for out, _ in outs}
    models = tmp_path / "cache" / "models"
    assert paths == {str(models / "smollm2-135m-instruct")}
    folder = models / "smollm2-135m-instruct"
    assert {"config.json", "model.safetensors", "tokenizer.json", "trtspec-source.json"} <= {p.name for p in folder.iterdir()}
    assert sorted(p.name for p in models.iterdir()) == ["smollm2-135m-instruct", "smollm2-135m-instruct.lock"]
    # one converted, the other waited for it and read its folder (two conversions would race to replace it)
    assert sum("Writing model shards" in err for _, err in outs) == 1
