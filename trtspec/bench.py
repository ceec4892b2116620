"""What the benchmark scripts (scripts/bench_*.py) share: reading a finished run (its model source, prompts, bundle,
a stage's metrics), training head recipes side by side on one run's data, and writing a measured table into its
page of docs/ (write_doc_section), so the page shows what the script printed.

Each script holds what it measures; how a run is read lives here once, the way the validate stage reads it, so
no two scripts read a run two ways and no script imports another. Like cli.py, this is an entry point above the
pipeline: it may run builds (train_recipe); the library below it never imports it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.errors import DataError


def arg_parser(doc: str) -> argparse.ArgumentParser:
    """A script's parser: the first paragraph of its docstring `doc` as the description, the rest (how to run it,
    what it prints) as the epilog, line breaks kept."""
    first, _, rest = doc.strip("\n").partition("\n\n")
    ap = argparse.ArgumentParser(description=first, epilog=rest.strip("\n") or None,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--debug", action="store_true", help="show the traceback of an error (errors.run_main reads it)")
    return ap


# --without names that are switches of the runtime settings, not product kernels
SWITCHES = {"native_pass": "native_pass", "tree_rows": "tree_kernel", "native_attention": "native_attention"}


def add_runtime_flags(ap: argparse.ArgumentParser, without_default: str = "") -> None:
    """The runtime settings (runtime/settings.py) as the flags every script that loads a bundle shares."""
    from trtspec.runtime.kernels import CANDIDATES

    ap.add_argument("--no-compile", action="store_true", help="run the passes eager, not torch.compile'd")
    ap.add_argument("--torch-attention", action="store_true",
                    help="attend over the KV cache with torch's attention, not the native kernel (the target's native "
                    "pass, which is native attention inside one call, goes with it)")
    ap.add_argument("--without", default=without_default, metavar="NAME,...",
                    help=f"product kernels left out of the load-time choice ({', '.join(CANDIDATES[1:])}) and "
                    f"switches turned off ({', '.join(SWITCHES)})")


def runtime_settings(a: argparse.Namespace, without: str | None = None) -> Any:
    """The RuntimeSettings the flags of `add_runtime_flags` ask for (`without`: instead of a.without)."""
    from dataclasses import replace

    from trtspec.runtime.kernels import CANDIDATES
    from trtspec.runtime.settings import RuntimeSettings

    names = {n for n in (a.without if without is None else without).split(",") if n}
    if unknown := names - {*CANDIDATES, *SWITCHES}:
        raise SystemExit(f"--without: unknown name(s) {', '.join(sorted(unknown))}; expected "
                         f"{', '.join((*CANDIDATES[1:], *SWITCHES))}")
    settings = RuntimeSettings(compile=not a.no_compile, native_attention=not a.torch_attention).without(names)
    return replace(settings, **{SWITCHES[n]: False for n in names & set(SWITCHES)})


def draft_specs(text: str, k: int) -> dict[str, Any]:
    """"chain:3,dynamic_tree:4:3:8" (shape:depth[:topk:total], comma-separated) -> {label: DraftSpec}; a missing
    depth is k, topk 4, total 16."""
    from trtspec.runtime import DraftSpec

    specs = {}
    for item in text.split(","):
        shape, *nums = item.strip().split(":")
        if shape not in ("chain", "tree", "dynamic_tree") or not all(n.isdigit() for n in nums) or len(nums) > 3:
            raise SystemExit(f"'{item}' is not a draft shape:depth[:topk:total] (shape chain, tree or dynamic_tree)")
        depth, topk, total = (*map(int, nums), None, None, None)[:3]
        spec = DraftSpec(shape, depth or k, topk or 4, total or 16)
        label = f"chain k={spec.k}" if shape == "chain" else f"{shape} depth {spec.k} top-{spec.topk} {spec.total} nodes"
        specs[label] = spec
    return specs


def verified(run: Path, stage: str) -> tuple[Path, dict]:
    """(folder, manifest) of a finished stage of `run`, its files checked against the manifest first, as deploy and
    inspect check them: a benchmark never measures an edited, missing or added file."""
    from trtspec.artifacts import RunDir

    return RunDir(run).require(stage, verify=True)


def stage_metrics(run: Path, stage: str) -> dict:
    """The metrics a finished stage of `run` recorded in its manifest."""
    return verified(run, stage)[1]["metrics"]


def model_source(run: Path) -> Path:
    """The local folder of the run's model.source, as its data stage recorded it (the demo's GGUF converted once)."""
    from trtspec.models import resolve_model

    return resolve_model(verified(run, "data")[1]["config"]["model"]["source"])


def load_prompt_rows(run: Path, n: int, split: str = "heldout") -> list[dict]:
    """The first n prompt rows {id, category, messages} of the data stage's split (heldout | train)."""
    from trtspec.chat import prompt_rows, read_rows

    path = verified(run, "data")[0] / f"{split}.jsonl"
    rows = prompt_rows(read_rows(path))[:n]
    if not rows:
        raise DataError(f"no prompts in {path}")
    return rows


def count(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a count of prompts, of rounds)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"give a whole number of at least 1, not '{text}'")
    return int(text)


def spread(rows: list, n: int) -> list:
    """n of `rows` spread evenly over them (a suite is ordered by category: its first rows are one category)."""
    return rows[:: max(1, len(rows) // n)][:n]


def suite_rows(path: Path, spread_to: int | None = None) -> list[dict]:
    """A JSONL suite's rows {id, category, messages}, read as validate reads eval.suites; with `spread_to`, that
    many rows spread evenly over the file (spread)."""
    from collections import Counter

    from trtspec.config import EvalSuite
    from trtspec.suites import read_suite_file

    hint = "a JSONL file of {prompt or messages, category} rows, the path absolute or relative to the current directory"
    rows = read_suite_file(path, Counter(), EvalSuite(kind="jsonl", path=str(path)), "--suite", hint)
    if not rows:
        raise DataError(f"--suite '{path}' holds no prompt", hint)
    return rows if spread_to is None else spread(rows, spread_to)


def load_prompts(run: Path, tok: Any, n: int, split: str = "heldout") -> list[list[int]]:
    """The first n prompts of the data stage's split (heldout | train), chat-templated."""
    from trtspec.chat import encode_row

    return [encode_row(tok, r) for r in load_prompt_rows(run, n, split)]


def load_suite_prompts(path: Path, tok: Any, n: int) -> list[list[int]]:
    """n prompts of a JSONL suite, spread over its categories (suite_rows), chat-templated."""
    from trtspec.chat import encode_row

    return [encode_row(tok, r) for r in suite_rows(path, spread_to=n)]


@dataclass
class Bundle:
    """A run's exported bundle, checked, with the target's tokenizer and the ids that end an answer."""

    path: Path
    tok: Any
    eos: set[int]

    @property
    def draft_length(self) -> int:
        """The draft.length the bundle was exported for (its manifest's config): what the engines draft."""
        return json.loads((self.path / "manifest.json").read_text())["config"]["draft"]["length"]

    def runtime(self, draft: bool = True, draft_weights: str = "auto", settings: Any = None) -> tuple[Any, Any]:
        """(the runtime's target, its drafter (EAGLE-3 or DFlash) or None), run as `settings` (RuntimeSettings) say:
        loading the target times the product kernels; draft_weights: how the draft's weights are stored
        (draft_families.load_drafter)."""
        from trtspec.draft_families import load_drafter
        from trtspec.runtime import load_target
        from trtspec.runtime.settings import DEFAULT

        target, _ = load_target(self.path / "target", settings=settings or DEFAULT)  # native or HF path, by family
        return target, load_drafter(self.path / "draft", target, draft_weights) if draft else None


def open_bundle(run: Path) -> Bundle:
    """RUN/bundle checked (every file the export stage writes), with its target's tokenizer and eos ids."""
    from trtspec.deploy.bundle import check_bundle
    from trtspec.generation import eos_ids
    from trtspec.models import load_tokenizer

    path = verified(run, "export")[0]
    check_bundle(path)
    tok = load_tokenizer(path / "target")
    return Bundle(path, tok, eos_ids(path / "target", tok))


# ---------------------------------------------------------------------------------------------- head recipes


def train_recipe(config: str, base_sets: list[str], out: Path, name: str, sets: list[str]) -> dict:
    """Train one recipe (config overrides `sets` on `base_sets`) in run `out`, or read it back if it finished before
    -> {name, sets, metrics, evals}. Every recipe reuses the run's data and convert stages and the target's hidden
    states, so each costs its training alone; OUT/recipes/NAME.json keeps it."""
    from trtspec.config import load_config
    from trtspec.pipeline.runner import run_build

    saved = out / "recipes" / f"{name}.json"
    if saved.is_file():
        return json.loads(saved.read_text())
    cfg = load_config(config, base_sets + sets)
    run_build(cfg, out, until="train")
    log = [json.loads(x) for x in (out / "train" / "train_log.jsonl").read_text().splitlines() if x.strip()]
    row = {"name": name, "sets": sets, "metrics": stage_metrics(out, "train"),
           "evals": [{"step": r["step"], "epoch": r["epoch"], **r["eval"]} for r in log if "eval" in r]}
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(row, indent=1) + "\n")
    return row


def print_table(rows: list[dict]) -> None:
    """One line per recipe: steps, training time and speed, last-step TTT accuracy, held-out AL@k, per-position rates."""
    ks = sorted({int(k[3:]) for r in rows for k in r["metrics"] if k.startswith("AL@") and k[3:].isdigit()})
    print(f"{'recipe':14s} {'steps':>5s} {'train s':>7s} {'tok/s':>6s} {'states (s, GiB)':>16s} {'acc_ttt (last step)':>20s} "
          + " ".join(f"{f'AL@{k}':>5s}" for k in ks) + f" {'AL@' + str(max(ks)) + ' 95% CI' if ks else '':>14s}  accept rate by position")
    for r in rows:
        m = r["metrics"]
        acc = "/".join(f"{a:.2f}" for a in (m.get("final_acc_ttt") or []))
        als = " ".join(f"{m[f'AL@{k}']:5.2f}" if f"AL@{k}" in m else f"{'-':>5s}" for k in ks)
        ci = m.get(f"AL@{max(ks)}_ci95") if ks else None
        disk = (m.get("states") or {}).get("states_disk_bytes")
        states = f"{m.get('cache_states_s', 0):.0f}" + (f", {disk / 2**30:.2f}" if disk else "")
        print(f"{r['name']:14s} {m['steps']:5d} {m['train_s']:7.0f} {m['train_tokens_per_s']:6.0f} {states:>16s} {acc:>20s} "
              f"{als} {'{:.2f}-{:.2f}'.format(*ci) if ci else '-':>14s}  {m['accept_rate_by_position']}")


def save_figure(fig: Any, path: Path) -> None:
    """Write a matplotlib figure and say where."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


DOCS = Path(__file__).resolve().parent.parent / "docs"


def write_doc_section(page: Path, key: str, text: str) -> None:
    """Replace what stands between `<!-- KEY:start -->` and `<!-- KEY:end -->` in `page` with `text` (a script's
    table with the command, date and machine it was measured with); a page without the markers is an error."""
    start, end = f"<!-- {key}:start -->", f"<!-- {key}:end -->"
    doc = page.read_text()
    if start not in doc or end not in doc:
        raise SystemExit(f"{page}: no {start} ... {end} markers to write the table between")
    head, rest = doc.split(start, 1)
    page.write_text(f"{head}{start}\n{text}\n{end}{rest.split(end, 1)[1]}")


def measured_line(command: str) -> str:
    """'Measured DATE on CPU (N cores) by `command`:' for a table a script writes into docs/."""
    import datetime

    from trtspec.runtime.kernels import cpu_description

    machine = cpu_description()
    return f"Measured {datetime.date.today()} on {machine['model']} ({machine['cores']} cores) by `{command}`:\n"
