"""The import rules of the code layout (README, "The code"): a stage imports the library and the stage contract,
never another stage or the runner; the library never imports a stage or the runner; scripts use the library only."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER = "trtspec.pipeline.runner"


def imported_modules(path: Path) -> set[str]:
    """Every trtspec module a file imports, at any depth of the file (function-level imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("trtspec")}


def is_stage(module: str) -> bool:
    return module.startswith("trtspec.stages.")


def test_a_stage_imports_no_other_stage_and_not_the_runner():
    for path in sorted((ROOT / "trtspec" / "stages").glob("*.py")):
        me = f"trtspec.stages.{path.stem}"
        bad = {m for m in imported_modules(path) if (is_stage(m) and m != me) or m.startswith(RUNNER)}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_library_imports_no_stage_and_not_the_runner():
    for path in sorted((ROOT / "trtspec").rglob("*.py")):
        rel = path.relative_to(ROOT / "trtspec").as_posix()
        if rel.startswith("stages/") or rel in ("cli.py", "pipeline/runner.py"):
            continue  # the stages themselves; the CLI and the runner are the ones that run them
        bad = {m for m in imported_modules(path) if is_stage(m) or m == "trtspec.stages" or m.startswith(RUNNER)}
        assert not bad, f"trtspec/{rel} imports {sorted(bad)}"


def test_scripts_use_the_library_only():
    for path in sorted((ROOT / "scripts").glob("*.py")):
        bad = {m for m in imported_modules(path) if is_stage(m) or m == "trtspec.stages"}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
