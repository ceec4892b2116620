"""The documentation cannot drift: the CLI reference (docs/cli.md) is re-rendered from the commands' --help and compared;
every recipe the docs name exists and loads; the repository keeps its top-level layout."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from stagekit import load_script

from trtspec.cli import main
from trtspec.config import load_config

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CLI_DOC = ROOT / "docs" / "cli.md"


def test_readme_cli_reference_is_up_to_date():
    gen = load_script("gen_cli_reference")
    text = CLI_DOC.read_text(encoding="utf-8")
    assert text == gen.replace_section(text, gen.render()), (
        "docs/cli.md's CLI reference differs from the commands' --help: run `python scripts/gen_cli_reference.py`"
    )


def test_config_reference_is_up_to_date_and_every_key_is_described():
    gen = load_script("gen_config_reference")
    from trtspec.config import BuildConfig

    assert [k for k, *_, desc in gen.rows(BuildConfig) if not desc] == []
    assert (ROOT / "docs" / "config.md").read_text(encoding="utf-8") == gen.render(), (
        "docs/config.md differs from the keys' descriptions: run `python scripts/gen_config_reference.py`"
    )


def test_engines_reference_is_the_engines_support_tables():
    gen = load_script("gen_engines_reference")
    assert (ROOT / "docs" / "engines.md").read_text(encoding="utf-8") == gen.render(), (
        "docs/engines.md differs from trtspec/engines/*/support.py: run `python scripts/gen_engines_reference.py`"
    )


def test_cli_reference_is_what_help_prints():
    """The rendered block of a command is exactly what `trtspec <cmd> --help` prints (same width, same options)."""
    gen = load_script("gen_cli_reference")
    rendered = gen.render()
    for args in (["--help"], ["build", "--help"], ["deploy", "triton", "--help"]):
        out = CliRunner().invoke(main, args, prog_name="trtspec", terminal_width=gen.WIDTH).output.rstrip()
        assert out in rendered, f"trtspec {' '.join(args)} is not in the rendered reference"


def test_every_command_is_in_the_reference():
    text = CLI_DOC.read_text(encoding="utf-8")
    for name in main.commands:
        assert f"#### `trtspec {name}`" in text, name


def test_replace_section_keeps_the_rest():
    gen = load_script("gen_cli_reference")
    text = f"top\n{gen.START}\nold\n{gen.END}\nbottom\n"
    assert gen.replace_section(text, "new\n") == f"top\n{gen.START}\nnew\n{gen.END}\nbottom\n"
    with pytest.raises(SystemExit):
        gen.replace_section("no markers", "x")


def test_readme_starts_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    first_block = text.split("```bash", 1)[1].split("```", 1)[0]
    assert "bash scripts/demo.sh" in first_block and "bash scripts/test.sh" in first_block


def named_recipes() -> set[str]:
    docs = README.read_text(encoding="utf-8") + (ROOT / "build_configs" / "README.md").read_text(encoding="utf-8")
    return set(re.findall(r"[\w.-]+-(?:eagle3|dflash)[\w.-]*\.yaml", docs))


def test_named_recipes_exist_and_load():
    names = named_recipes()
    assert "smollm2-135m-eagle3.yaml" in names and "smollm2-135m-eagle3-ci.yaml" in names
    missing = sorted(n for n in names if not (ROOT / "build_configs" / n).is_file())
    assert not missing, f"the docs name recipes that build_configs/ does not have: {missing}"
    for name in names:
        load_config(ROOT / "build_configs" / name)


def test_every_recipe_loads():
    for path in sorted((ROOT / "build_configs").glob("*.yaml")):
        cfg = load_config(path)
        for src in cfg.data.sources:
            if src.kind != "hf":
                assert cfg.resolve_path(src.path).is_file(), f"{path.name}: {src.path} does not exist"


def test_relative_links_resolve():
    for doc in (README, ROOT / "build_configs" / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        for target in re.findall(r"\]\(([^)#:]+)\)", doc.read_text(encoding="utf-8")):
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def test_top_level_layout():
    """What git tracks (or would add) at the top level: exactly the documented layout, plus dotfiles."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    top = {p.split("/", 1)[0] for p in listed if not p.startswith(".")}
    expected = {"pyproject.toml", "trtspec", "build_configs", "scripts", "tests", "notebooks", "README.md", "docs", "requirements"}
    assert top == expected, f"top level differs from the documented layout: {sorted(top ^ expected)}"


def test_readme_is_short():
    """What it is, the two commands, the picture, how to deploy, where to read more: the rest lives in docs/."""
    assert len(README.read_text(encoding="utf-8").splitlines()) < 150

