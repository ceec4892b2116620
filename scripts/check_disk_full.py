#!/usr/bin/env python
"""A disk that fills in the middle of each stage, for real: the run folder on a small tmpfs, one stage at a time.

For each stage of a finished reference build, a fresh tmpfs holds the stages before it (copied from the reference)
and half the room the stage's own folder takes; `trtspec build --until STAGE` must then fail in one line (no
traceback), leave no manifest and no staging folder behind for that stage, and keep the stages before it. The tmpfs
is then grown and the same command must resume: the stage done, the stages before it not redone.

    sudo python scripts/check_disk_full.py                        # tiny:llama3, every stage, about 10 minutes
    sudo python scripts/check_disk_full.py --stages train export --set model.source=tiny:qwen3_moe

Needs root (it mounts tmpfs) on Linux. Prints one row per stage and exits 1 if any row fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from trtspec.config import STAGES
from trtspec.errors import run_main

GRACE = 4096  # room above what the earlier stages take: the run's own file (trtspec-run.json)


def folder_bytes(path: Path) -> int:
    """What a folder takes on a tmpfs: each file in whole 4 KiB pages."""
    return sum(-(-p.stat().st_size // 4096) * 4096 for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def build(config: str, out: Path, sets: list[str], until: str | None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "trtspec.cli", "build", config, "--out", str(out), *sum((["--set", s] for s in sets), [])]
    return subprocess.run(cmd + (["--until", until] if until else []), capture_output=True, text=True)


def mount(path: Path, size: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)


def stage_folder(run: Path, stage: str) -> Path:
    from trtspec.artifacts import RunDir

    return RunDir(run).stage_dir(stage)


def check_stage(config: str, sets: list[str], ref: Path, work: Path, stage: str, stages: list[str]) -> dict:
    """Fill the disk half-way through `stage`, then give it room and resume."""
    before = stages[:stages.index(stage)]
    need = folder_bytes(stage_folder(ref, stage))
    used = sum(folder_bytes(stage_folder(ref, s)) for s in before)
    mnt = work / f"mnt-{stage}"
    mount(mnt, used + GRACE + need // 2)
    try:
        run = mnt / "run"
        run.mkdir()
        shutil.copy2(ref / "trtspec-run.json", run / "trtspec-run.json")
        for s in before:
            shutil.copytree(stage_folder(ref, s), stage_folder(run, s))
        kept = {s: (stage_folder(run, s) / "manifest.json").stat().st_mtime_ns for s in before}
        t0 = time.time()
        full = build(config, run, sets, stage)
        (work / f"{stage}-full.log").write_text(full.stdout + full.stderr)
        err = [line for line in full.stderr.strip().splitlines() if line.startswith("Error:")] or full.stderr.strip().splitlines()
        row = {"stage": stage, "stage_mib": round(need / 2**20, 2), "room_mib": round((GRACE + need // 2) / 2**20, 2),
               "full_rc": full.returncode, "full_line": err[-1] if err else "", "full_s": round(time.time() - t0, 1),
               "traceback": "Traceback" in full.stderr,
               "manifest_left": (stage_folder(run, stage) / "manifest.json").exists(),
               "staging_left": any(run.glob(f".tmp-{stage}*"))}
        subprocess.run(["mount", "-o", f"remount,size={used + need * 4 + 2**26}", str(mnt)], check=True)
        again = build(config, run, sets, stage)
        (work / f"{stage}-resume.log").write_text(again.stdout + again.stderr)
        row |= {"resume_rc": again.returncode,
                "resumed": (stage_folder(run, stage) / "manifest.json").exists(),
                "earlier_kept": all((stage_folder(run, s) / "manifest.json").stat().st_mtime_ns == t for s, t in kept.items())}
        if again.returncode:
            row["resume_line"] = (again.stderr.strip().splitlines() or [""])[-1]
        row["ok"] = (row["full_rc"] != 0 and not row["traceback"] and row["full_line"].startswith("Error:")
                     and not row["manifest_left"] and not row["staging_left"]
                     and row["resume_rc"] == 0 and row["resumed"] and row["earlier_kept"])
        return row
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="build_configs/tiny-families.yaml")
    ap.add_argument("--set", dest="sets", action="append", default=None, help="as trtspec build --set (default: model.source=tiny:llama3)")
    ap.add_argument("--stages", nargs="+", default=None, help="the stages to fill the disk in (default: every stage the build runs)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/trtspec-disk-full"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    sets = args.sets if args.sets is not None else ["model.source=tiny:llama3"]
    shutil.rmtree(args.work, ignore_errors=True)
    ref = args.work / "reference"
    done = build(args.config, ref, sets, None)
    if done.returncode:
        print(f"the reference build failed: {done.stderr.strip().splitlines()[-1]}", file=sys.stderr)
        return 2
    ran = [s for s in STAGES if (stage_folder(ref, s) / "manifest.json").is_file()]
    rows = [check_stage(args.config, sets, ref, args.work, s, ran) for s in (args.stages or ran)]
    print(f"{'stage':<9} {'MiB':>7} {'room':>6} {'rc':>3} {'tb':>3} {'left':>5} {'resume':>6} {'kept':>5} ok  the line")
    for r in rows:
        left = "yes" if r["manifest_left"] or r["staging_left"] else "no"
        print(f"{r['stage']:<9} {r['stage_mib']:>7} {r['room_mib']:>6} {r['full_rc']:>3} {'yes' if r['traceback'] else 'no':>3} "
              f"{left:>5} {r['resume_rc']:>6} {'yes' if r['earlier_kept'] else 'no':>5} {'ok' if r['ok'] else 'NO'}  "
              f"{r['full_line'][:110]}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    run_main(main)
