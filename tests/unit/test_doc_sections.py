"""Tables the scripts write into docs/ (trtspec.bench.write_doc_section): each page holds the markers its script
writes between, and a script's table has a cell per column."""

from pathlib import Path

import pytest
from stagekit import load_script

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("page, key", [("results.md", "bench-drafters"), ("families.md", "family-matrix:eagle3"),
                                       ("families.md", "family-matrix:dflash"), ("families.md", "family-matrix:dflash2")])
def test_each_page_holds_its_scripts_markers_once(page, key):
    doc = (ROOT / "docs" / page).read_text()
    assert doc.count(f"<!-- {key}:start -->") == doc.count(f"<!-- {key}:end -->") == 1
    assert doc.index(f"<!-- {key}:start -->") < doc.index(f"<!-- {key}:end -->")


def test_bench_drafters_table_has_a_cell_per_column():
    row = {"prompts": "chat", "method": "dflash2:demo-dflash2@k=7", "tokens_per_s": 61.234, "speedup_vs_no_draft": 1.234,
           "acceptance_length": 1.62, "identical": 4, "of": 4, "step_cost_in_decode_steps": 1.31,
           "accept_rate_by_position": [0.37, 0.14]}
    lines = load_script("bench_drafters").markdown([row]).splitlines()
    assert len({line.count("|") for line in lines}) == 1
    assert lines[2] == "| chat | dflash2:demo-dflash2@k=7 | 61.2 | 1.23x | 1.62 | 4/4 | 1.31 | 0.37, 0.14 |"
