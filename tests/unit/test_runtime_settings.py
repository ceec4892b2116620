"""Runtime settings (runtime/settings.py): each one changes what runs, set by the object handed to the loaders and by
the benchmark scripts' flags, never by a module global."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import torch
from stagekit import export_random_eagle

from trtspec.bench import add_runtime_flags, runtime_settings
from trtspec.eagle.runtime import load_eagle3_drafter
from trtspec.runtime.kernels import CANDIDATES, available_candidates
from trtspec.runtime.model import load_transformer
from trtspec.runtime.native import attention_usable
from trtspec.runtime.settings import RuntimeSettings

pytestmark = pytest.mark.usefixtures("one_thread")


def flags(*argv: str) -> RuntimeSettings:
    ap = argparse.ArgumentParser()
    add_runtime_flags(ap)
    return runtime_settings(ap.parse_args(list(argv)))


def native_attention_here(target) -> bool:
    return attention_usable(torch.float32, torch.device("cpu"), target.args.head_dim)


def test_the_flags_map_onto_the_settings():
    assert flags() == RuntimeSettings()
    assert flags("--torch-attention").native_attention is False and not flags("--torch-attention").uses_native_pass
    assert flags("--no-compile").compile is False
    s = flags("--without", "native16,packed,native_pass,tree_rows")
    assert "native16" not in s.kernels and "packed" not in s.kernels and "native" in s.kernels
    assert s.native_pass is False and s.tree_kernel is False and s.native_attention is True
    with pytest.raises(SystemExit, match="unknown name"):
        flags("--without", "nativ16")
    assert "linear" in RuntimeSettings(kernels=("native",)).kernels  # F.linear is every kernel's fallback


def test_each_setting_changes_what_runs(target_dir):
    base, _ = load_transformer(target_dir)
    no_attention, _ = load_transformer(target_dir, settings=RuntimeSettings(native_attention=False))
    no_pass, _ = load_transformer(target_dir, settings=RuntimeSettings(native_pass=False))
    linear_only, _ = load_transformer(target_dir, settings=RuntimeSettings(kernels=("linear",), tree_kernel=False))
    for t in (base, no_attention, no_pass, linear_only):
        t.setup_cache(64)
    # kernels: only the allowed are timed and chosen; tree_kernel off leaves 9-64 rows to F.linear, untimed
    assert set(linear_only.kernel_choice["by_rows"]) == {"linear"}
    assert set(linear_only.kernel_choice["ms_per_pass"]["1_rows"]) == {"linear"}
    assert "16_rows" not in linear_only.kernel_choice["ms_per_pass"]
    assert set(base.kernel_choice["ms_per_pass"]["1_rows"]) == set(available_candidates()) > {"linear"}
    # native attention off: no layer attends natively and the native pass (native attention inside) is off too
    assert not any(layer.self_attn.native for layer in no_attention.layers) and not no_attention.native_pass
    if not native_attention_here(base):
        pytest.skip("the native kernels are not built here: attention and pass run torch's either way")
    assert all(layer.self_attn.native for layer in base.layers) and base.native_pass
    # native pass off: the target's pass is its compiled forward, attention still native inside it
    assert not no_pass.native_pass and all(layer.self_attn.native for layer in no_pass.layers)


def test_a_drafter_runs_as_its_target_unless_told(target_dir, tmp_path):
    draft_dir = tmp_path / "draft"
    export_random_eagle(target_dir, draft_dir)
    target, _ = load_transformer(target_dir, settings=RuntimeSettings(native_attention=False, kernels=("linear",)))
    drafter = load_eagle3_drafter(draft_dir, target)
    assert drafter.net.settings == target.settings and set(drafter.net.kernel_choice["by_rows"]) == {"linear"}
    own = load_eagle3_drafter(draft_dir, target, settings=RuntimeSettings())
    assert own.net.settings == RuntimeSettings()


def test_no_script_rebinds_a_runtime_global():
    scripts = Path(__file__).parents[2] / "scripts"
    pattern = re.compile(r"trtspec\.runtime\.\w+\.[A-Z_]+\s*=|kernels\.CANDIDATES\s*=")
    offenders = [p.name for p in scripts.glob("*.py") if pattern.search(p.read_text())]
    assert not offenders, offenders
    assert len(CANDIDATES) >= 5
