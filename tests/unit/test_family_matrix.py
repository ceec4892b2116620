"""scripts/family_matrix.py's table and its place in docs/families.md (trtspec.bench.write_doc_section): the page
shows what the script measured."""

import pytest
from stagekit import load_script

from trtspec.bench import write_doc_section

matrix = load_script("family_matrix")

SERVED = {"family": "llama3", "method": "eagle3", "rc": 0, "seconds": 38.3, "error": None, "convert": "done",
          "train": "done", "heldout_al": 1.2345, "export": "done", "engine": "done", "engine_note": None,
          "vllm_al": 1.0345, "runtime_al_same_prompts": 1.0345, "vllm_exact": "2/2", "validate": "done",
          "runtime_al": 1.11, "runtime_path": "native", "runtime_exact": "2/2"}


def test_table_prints_each_figure_in_its_column():
    skipped = {**SERVED, "family": "gemma3", "engine": "skipped", "engine_note": "gemma3: no hidden states", "heldout_al": None,
               "vllm_al": None, "vllm_exact": None, "runtime_path": "hf"}
    failed = {**SERVED, "family": "phi3", "rc": 1, "error": "Error: train: out of memory", "train": "failed",
              "export": "not run", "engine": "not run", "validate": "not run"}
    rows = matrix.table([SERVED, skipped, failed]).splitlines()
    assert len(rows) == 2 + 3 + 1 and all(r.count("|") == 9 for r in rows)
    assert rows[2] == ("| llama3 | eagle3 | done | done (1.23) | done | AL 1.03 (1.03), 2/2 | native, AL 1.11, 2/2 | 38.3 |")
    assert "| done (not measured) |" in rows[3] and "| skipped: gemma3: no hidden states |" in rows[3]
    assert "| failed | not run | not run | not run |" in rows[4] and "Error: train: out of memory" in rows[5]


def test_write_table_replaces_only_between_its_markers(tmp_path):
    page = tmp_path / "families.md"
    page.write_text("intro\n<!-- family-matrix:eagle3:start -->\nold\n<!-- family-matrix:eagle3:end -->\n\n"
                    "<!-- family-matrix:dflash:start -->\nkept\n<!-- family-matrix:dflash:end -->\nend\n")
    write_doc_section(page, "family-matrix:eagle3", "new table")
    assert page.read_text() == ("intro\n<!-- family-matrix:eagle3:start -->\nnew table\n<!-- family-matrix:eagle3:end -->\n\n"
                                "<!-- family-matrix:dflash:start -->\nkept\n<!-- family-matrix:dflash:end -->\nend\n")
    with pytest.raises(SystemExit, match="no <!-- family-matrix:dflash2:start -->"):
        write_doc_section(tmp_path / "families.md", "family-matrix:dflash2", "x")

