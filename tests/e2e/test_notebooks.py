"""The notebooks: stored without outputs (fast), and each one runs top to bottom on the CI recipe (integration).

The integration tests execute the notebooks in order in one run directory, as a reader would: later notebooks
reuse the stages earlier ones finished. Executed copies are kept in that directory for a look after a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = [
    "01_quickstart.ipynb",
    "02_eagle3_head.ipynb",
    "03_quantize_export.ipynb",
    "04_validation.ipynb",
    "05_deployment.ipynb",
    "06_adapt.ipynb",
]
CI_CONFIG = ROOT / "build_configs" / "smollm2-135m-eagle3-ci.yaml"
# notebook 03's format comparison in CI: the baseline, one CPU format, and one that must fail cleanly on a CPU
# notebook 03 needs one format that really quantizes (fp8, simulated on the CPU); nvfp4 shows the clean refusal
CI_FORMATS = os.environ.get("TRTSPEC_CI_NB_FORMATS", "fp8,nvfp4")


def read(name: str):
    return nbformat.read(NOTEBOOK_DIR / name, as_version=4)


def test_the_notebooks_are_the_documented_ones():
    assert sorted(p.name for p in NOTEBOOK_DIR.glob("*.ipynb")) == NOTEBOOKS


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_stored_without_outputs(name):
    nb = read(name)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{name} cell {i} has outputs: clear them (Jupyter: Edit > Clear Outputs of All Cells) before saving"
            )


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_reads_config_and_run_dir_from_the_environment(name):
    source = "\n".join(c.source for c in read(name).cells if c.cell_type == "code")
    assert "TRTSPEC_NB_CONFIG" in source and "TRTSPEC_NB_RUN" in source


def test_notebook_code_is_lint_clean():
    """scripts/test.sh lints trtspec/, tests/ and scripts/; the notebooks' code is held to the same rules here."""
    ruff = shutil.which("ruff", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if ruff is None:
        pytest.skip("ruff is not installed")
    r = subprocess.run([ruff, "check", "--output-format", "concise", str(NOTEBOOK_DIR)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def notebook_run(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("notebooks") / "run"


@pytest.mark.integration
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, notebook_run, monkeypatch, finished_runs):
    from nbclient import NotebookClient

    family_run = notebook_run.parent / f"{notebook_run.name}-qwen3_moe"  # notebook 01's family build
    if (done := finished_runs.get(("tiny-families", "qwen3_moe", "eagle3"))) and not family_run.exists():
        shutil.copytree(done, family_run)  # the family matrix built this recipe: the notebook finds it finished

    monkeypatch.setenv("TRTSPEC_NB_CONFIG", str(CI_CONFIG))
    monkeypatch.setenv("TRTSPEC_NB_RUN", str(notebook_run))
    monkeypatch.setenv("TRTSPEC_NB_FORMATS", CI_FORMATS)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    # the kernel is this interpreter (jupyter_client maps the `python` of the python3 kernel spec to sys.executable)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    nb = read(name)
    client = NotebookClient(
        nb, timeout=3000, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK_DIR)}}
    )
    try:
        client.execute()
    finally:
        executed = notebook_run.parent / "executed"
        executed.mkdir(exist_ok=True)
        nbformat.write(nb, executed / name)
    shown = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "display_data"]
    assert shown, f"{name} displayed nothing (no plot, image or table)"
