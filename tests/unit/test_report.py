"""report.md's words: the run's own draft named by its family in every table that names a drafting."""

from trtspec.report import _sampling, drafting_names


def test_the_runs_own_draft_is_named_by_its_family():
    assert drafting_names({"draft_method": "eagle3"})["speculative"] == "EAGLE-3"
    assert drafting_names({})["eagle3_suffix"] == "EAGLE-3 + suffix"  # reports written before draft_method
    dflash = {"draft_method": "dflash", "sampling_check": {"speculative": {
        "samples": 200, "drafted": 150, "temperature": 0.8, "chi2": 1.0, "dof": 2, "threshold": 5.99,
        "total_variation": 0.02, "passed": True}}}
    assert _sampling(dflash, drafting_names(dflash))[-1].startswith("| DFlash | 200 (150) at T=0.8 |")
