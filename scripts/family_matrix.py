#!/usr/bin/env python
"""The architecture matrix: every decoder family of trtspec.targets.tiny through the whole pipeline, one table.

    python scripts/family_matrix.py                         # every family, EAGLE-3, into runs/families/
    python scripts/family_matrix.py --families qwen3_moe,gemma3 --method dflash
    python scripts/family_matrix.py --json
    python scripts/family_matrix.py --method dflash --write # and rewrite docs/families.md's DFlash table with it
    python scripts/family_matrix.py --shape deep            # each family's second shape (tiny:FAMILY:deep)

Each family is a tiny random model built in code (`model.source: tiny:FAMILY`, the demo model's tokenizer) run
through build_configs/tiny-families.yaml (tiny-families-dflash.yaml with --method dflash) by `trtspec build` in a process of its own. Per family the table gives each
stage's outcome (done, skipped with its reason, or the error line), the draft's held-out AL, vLLM's AL and greedy
match, the runtime's path (native or hf), greedy exactness and the wall time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from functools import partial
from pathlib import Path

from trtspec.errors import run_main
from trtspec.measure import timed

ROOT = Path(__file__).resolve().parent.parent
RECIPES = {"eagle3": ROOT / "build_configs" / "tiny-families.yaml", "dflash": ROOT / "build_configs" / "tiny-families-dflash.yaml",
           "dflash2": ROOT / "build_configs" / "tiny-families-dflash.yaml"}  # with draft.method dflash2
STAGES = ("convert", "train", "export", "engine", "validate")


def run_family(family: str, method: str, out: Path, extra: list[str]) -> dict:
    """`trtspec build` of one family -> its row: stage outcomes and figures from the manifests."""
    run = out / f"{family.replace(':', '-')}-{method}"
    cmd = [sys.executable, "-m", "trtspec.cli", "build", str(RECIPES[method]), "--out", str(run),
           "--set", f"model.source=tiny:{family}", "--set", f"draft.method={method}", *extra]
    proc, seconds = timed(partial(subprocess.run, cmd, capture_output=True, text=True))
    row = {"family": family, "method": method, "rc": proc.returncode, "seconds": round(seconds, 1)}
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    row["error"] = errors[-1] if errors else None
    for stage in STAGES:
        manifest = run / ("bundle" if stage == "export" else stage) / "manifest.json"
        m = json.loads(manifest.read_text()) if manifest.is_file() else None
        row[stage] = m.get("status", "done") if m else ("failed" if row["error"] else "not run")
        metrics = (m or {}).get("metrics") or {}
        if stage == "train":
            row["heldout_al"] = metrics.get("AL@3")  # null where the recipe measures no held-out acceptance
        if stage == "engine":
            row["engine_note"] = m.get("reason") if m and m.get("status") == "skipped" else None
            row["vllm_al"] = metrics.get("acceptance_length")
            row["runtime_al_same_prompts"] = (metrics.get("runtime_agreement") or {}).get("runtime_acceptance_length")
            match = metrics.get("greedy_vs_hf") or {}
            row["vllm_exact"] = f"{match['exact']}/{match['total']}" if match else None
        if stage == "validate" and m:
            report = json.loads((run / "validate" / "report.json").read_text())
            row["runtime_al"] = report.get("acceptance_length")
            row["runtime_path"] = report.get("target_path")
            gm = report.get("greedy_match") or {}
            row["runtime_exact"] = f"{gm.get('matched')}/{gm.get('total')}"
    return row


def cell(value, fmt: str = "{:.2f}") -> str:
    return "not measured" if value is None else fmt.format(value)


def table(rows: list[dict]) -> str:
    """The matrix as a markdown table: each stage's outcome; vLLM's AL beside trtspec's runtime's on the same prompts
    (the engine stage's `runtime_agreement`) and vLLM's greedy match; the runtime's path, held-out AL and greedy match."""
    head = ("| family | method | convert | train (held-out AL@3) | export | vLLM: AL (runtime's, same prompts), greedy "
            "| runtime: path, AL, greedy | s |")
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        engine = r["engine"]
        if r.get("engine_note"):
            engine = f"skipped: {r['engine_note']}"
        elif engine == "done":
            engine = f"AL {cell(r['vllm_al'])} ({cell(r.get('runtime_al_same_prompts'))}), {r['vllm_exact']}"
        runtime = r["validate"] if r["validate"] != "done" else f"{r['runtime_path']}, AL {cell(r['runtime_al'])}, {r['runtime_exact']}"
        train = r["train"] if r["train"] != "done" else f"done ({cell(r['heldout_al'])})"
        lines.append(f"| {r['family']} | {r['method']} | {r['convert']} | {train} | {r['export']} | {engine} | {runtime} | {r['seconds']} |")
        if r["error"]:
            lines.append(f"|  | | {r['error'][:200]} | | | | | |")
    return "\n".join(lines)


def measured_on(method: str, families: list[str], shape: str) -> str:
    from trtspec.bench import measured_line
    from trtspec.targets.tiny import TINY

    which = "" if [f.partition(":")[0] for f in families] == list(TINY) else f" --families {','.join(families)}"
    return measured_line(f"python scripts/family_matrix.py --method {method}{'' if shape == 'base' else ' --shape ' + shape}"
                         f"{which} --write")


def main() -> None:
    from trtspec.targets.tiny import SHAPES, TINY

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default=",".join(TINY), help="comma-separated, from trtspec.targets.tiny.TINY")
    ap.add_argument("--shape", default="base", choices=SHAPES, help="the tiny models' shape (trtspec.targets.tiny.SHAPES)")
    ap.add_argument("--method", default="eagle3", choices=tuple(RECIPES))
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "families")
    ap.add_argument("--set", action="append", default=[], help="more config overrides, KEY=VALUE")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="also write the table into docs/families.md (between its markers)")
    a = ap.parse_args()
    families = a.families.split(",")
    unknown = [f for f in families if f not in TINY]
    if unknown:
        sys.exit(f"unknown families {unknown}; known: {', '.join(TINY)}")
    families = [f if a.shape == "base" else f"{f}:{a.shape}" for f in families]
    extra = [x for kv in a.set for x in ("--set", kv)]
    rows = []
    for f in families:
        rows.append(run_family(f, a.method, a.out, extra))
        print(f"{f}: rc {rows[-1]['rc']} in {rows[-1]['seconds']} s", file=sys.stderr, flush=True)
    print(json.dumps(rows, indent=2) if a.json else table(rows))
    if a.write:
        from trtspec.bench import DOCS, write_doc_section

        key = "family-matrix:" + (a.method if a.shape == "base" else f"{a.method}:{a.shape}")
        write_doc_section(DOCS / "families.md", key, measured_on(a.method, families, a.shape) + "\n" + table(rows))


if __name__ == "__main__":
    run_main(main)
