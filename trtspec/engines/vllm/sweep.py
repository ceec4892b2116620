"""A concurrency sweep: the bundle in vLLM at each draft length (0 = no draft) and concurrency; the draft length per
batch size it implies (trtspec.draft_schedule), measured against the best fixed length and against no draft.

Two ways to load the engines (run_sweep takes either pool): LockstepPool keeps every engine in this process and steps
them in lockstep, each step timed alone (the comparison that decides a few percent on a shared host whose speed
drifts within seconds); ServerPool serves the bundle in vLLM's OpenAI server under NVIDIA's load generator aiperf
(the real serving path, with HTTP and streaming, whose levels one after another carry the host's drift).

ServerPool: every server is up at once and the levels interleave: at each concurrency the draft lengths run one right after the
other, then the schedule beside no draft and the fastest length, so the ratios compared are measured side by side.
Greedy answers are the same at every draft length (lossless), so the servers generate the same tokens and output
tokens/s compare directly. Each level sends max(2 x concurrency, min_requests) requests after a warm-up of
min(concurrency, 4). Servers bind 127.0.0.1. aiperf lives in a venv of its own (its pins clash with vLLM's):
`bash scripts/setup.sh --bench` puts it in .venv-bench.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.draft_schedule import best_lengths, schedule_from_sweep, with_schedule_vllm
from trtspec.engines import read_options
from trtspec.engines import vllm as vllm_engine
from trtspec.errors import MissingDependency, TrtspecError

ROOT = Path(__file__).resolve().parents[3]
SPEC_COUNTERS = {"drafts": "vllm:spec_decode_num_drafts", "accepted": "vllm:spec_decode_num_accepted_tokens"}


class SweepFailed(TrtspecError):
    """A server or the load generator failed during the sweep (its log named)."""

    exit_code = 1


@dataclass(frozen=True)
class SweepPlan:
    concurrency: list[int]
    draft_lengths: list[int]  # 0 = no draft
    max_tokens: int = 64
    min_requests: int = 8
    server_timeout_s: float = 600
    level_timeout_s: float = 900
    preload_iomp: bool = True  # vLLM's CPU docs: Intel OpenMP preloaded (it warns of slow speculation without)
    repeats: int = 1  # rounds of every server at each concurrency; a level keeps its median round
    together: int = 0  # engines loaded at once at most, sized to the memory free (0 = every draft length's at once)


def engine_sizes(cfg: Any) -> tuple[Path, float, int]:
    """(the target's folder, the KV cache one sweep engine needs in GiB, the sweep's engines) of a build config's
    engine.sweep on a CPU."""
    from trtspec.models import resolve_model

    e, target = cfg.engine, resolve_model(cfg.model.source)
    kv = vllm_engine.kv_cache_gib_for(target, max(e.sweep) * (e.sweep_max_tokens + 64 + cfg.draft.length))
    return target, kv, len(set(e.sweep_draft_lengths or range(cfg.draft.length + 1)))


def find_aiperf(given: str | None = None) -> str:
    for candidate in (given, shutil.which("aiperf"), str(ROOT / ".venv-bench" / "bin" / "aiperf")):
        if candidate and Path(candidate).is_file():
            return candidate
    raise MissingDependency("aiperf (NVIDIA's load generator) is not installed",
                            "bash scripts/setup.sh --bench installs it in .venv-bench")


def save_sweep(run: Path, result: dict, folder: Path) -> dict:
    """folder/sweep.json: a sweep's result tied to the run's exported bundle (its fingerprint), which is how
    `deploy --drafting auto` tells a schedule measured on this bundle from one of an older export -> what was saved."""
    from trtspec.artifacts import RunDir, output_fingerprint, write_json
    from trtspec.draft_schedule import SWEEP_FILE

    export = RunDir(run).manifest("export")
    result = {**result, "bundle": output_fingerprint(export) if export else None}
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / SWEEP_FILE, result)
    if folder.resolve() == (Path(run) / "bench").resolve():  # RUN/bench has no stage manifest: its own vouches for it
        vouch_for_sweep(folder)
    return result


def vouch_for_sweep(folder: Path) -> None:
    """folder/manifest.json with sweep.json's size and checksum: what `deploy` verifies before it serves a schedule."""
    from trtspec.artifacts import sha256_file, write_json
    from trtspec.draft_schedule import SWEEP_FILE

    sweep = folder / SWEEP_FILE
    write_json(folder / "manifest.json", {"kind": "trtspec/bench-sweep", "status": "done", "files": {
        SWEEP_FILE: {"size": sweep.stat().st_size, "sha256": sha256_file(sweep)}}})


def write_prompts(texts: list[str], out: Path) -> int:
    """aiperf's single_turn JSONL: one user prompt a line."""
    out.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return len(texts)


def speculative_config(bundle: Path, k: int, schedule: dict[int, int] | None = None) -> dict | None:
    """vLLM's speculative_config drafting k tokens with the bundle's draft, or schedule's length per batch size (k
    = schedule[1]); None for k = 0 (no draft)."""
    if not k:
        return None
    spec = vllm_engine.from_options(read_options(bundle), str(bundle / "draft"))
    spec.pop("num_speculative_tokens_per_batch_size", None)
    spec["num_speculative_tokens"] = k
    return with_schedule_vllm(spec, schedule) if schedule else spec


LOWEST_PORT = 10000  # free_port's choices start here: below are the well-known and registered services' ports


def ephemeral_ports() -> tuple[int, int] | None:
    """The kernel's range of ephemeral ports (Linux: net.ipv4.ip_local_port_range), or None where it cannot be read."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return None


def free_port() -> int:
    """A loopback TCP port free now for a server to bind, chosen below the kernel's ephemeral range: every port bind(0)
    and connect() hand out comes from that range, so no other process's socket (a vLLM engine's, an HTTP client's)
    can take this one between its choice here and the server's bind. Where the range is unknown or leaves no room
    below it, the kernel's own choice of a free port."""
    span = ephemeral_ports()
    if span and span[0] > LOWEST_PORT + 1000:
        rng = random.Random()  # seeded from the OS: a test's random.seed must not make two processes choose alike
        for _ in range(100):
            port = rng.randrange(LOWEST_PORT, span[0])
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_command(bundle: Path, port: int, spec: dict | None, max_seqs: int) -> list[str]:
    """vLLM's OpenAI server over bundle/target; spec: its speculative_config (None: no draft)."""
    from trtspec.engines.vllm import target_dtype

    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(bundle / "target"),
           "--served-model-name", "bundle", "--dtype", target_dtype(bundle / "target"), "--max-model-len", "1024",
           "--max-num-seqs", str(max_seqs), "--host", "127.0.0.1", "--port", str(port)]
    return cmd + (["--speculative-config", json.dumps(spec)] if spec else [])


def server_environment(preload_iomp: bool) -> tuple[dict[str, str], list[str]]:
    """The server's environment and extra flags: on a CPU the build's KV cache, thread binding and Intel OpenMP."""
    import torch

    from trtspec.engines.vllm import cpu_environment

    env = dict(os.environ)
    if torch.cuda.is_available():
        return env, []
    cpu = cpu_environment(kv_cache_gib=2, server=True)
    env = {**cpu, **env}
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"  # installed with vLLM's CPU build
    if preload_iomp and iomp.is_file() and "libiomp" not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = ":".join(filter(None, [env.get("LD_PRELOAD"), str(iomp)]))
    return env, ["--enforce-eager"]


def server_temp_folder(env: dict[str, str]) -> str:
    """A short folder of the server's own (a socket's path is at most 107 bytes) for what vLLM leaves in the temp
    folder after a clean exit: its ZMQ sockets (VLLM_RPC_BASE_PATH, 7 a server) and its one-process rendezvous file
    (vllm_dist_*, in TMPDIR). Set in `env`, with inductor's cache kept where it would be without TMPDIR (a compiling
    server's warm cache; a torch without that private helper compiles into the folder, and again next time)."""
    folder = tempfile.mkdtemp(prefix="trtspec-vllm-")
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        env.setdefault("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    except ImportError:
        pass
    env.update(VLLM_RPC_BASE_PATH=folder, TMPDIR=folder)
    return folder


@dataclass
class Server:
    """vLLM's OpenAI server as start_vllm left it: its process (the leader of its own process group), its loopback
    port, and the temp folder of its sockets and rendezvous file (stop() removes it)."""

    proc: subprocess.Popen
    port: int
    temp_dir: str
    drafts: bool = False  # served with a speculative_config: its /metrics count drafts and accepted tokens


PORT_TRIES = 3  # starts of a server whose port another process took between its choice and the server's bind


def start_vllm(bundle: Path, spec: dict | None, max_seqs: int, log: Path, plan: SweepPlan) -> Server:
    """vLLM's OpenAI server on a free loopback port; returns once /v1/models answers. A port is free when chosen, not
    when the server binds it (another server's engine may open a socket on it in between): a server that exits on a
    taken port is started again on another, PORT_TRIES times in all."""
    for attempt in range(1, PORT_TRIES + 1):
        try:
            return start_vllm_once(bundle, spec, max_seqs, log, plan)
        except SweepFailed as e:
            if attempt == PORT_TRIES or "address already in use" not in log.read_text(errors="replace").lower():
                raise e from None
    raise AssertionError("unreachable")


def start_vllm_once(bundle: Path, spec: dict | None, max_seqs: int, log: Path, plan: SweepPlan) -> Server:
    """One start of vLLM's OpenAI server on a port free now (start_vllm)."""
    port = free_port()
    env, extra = server_environment(plan.preload_iomp)
    temp_dir = server_temp_folder(env)
    with log.open("w") as out:
        proc = subprocess.Popen(vllm_command(bundle, port, spec, max_seqs) + extra, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(proc, port, temp_dir, drafts=spec is not None)
    deadline = time.time() + plan.server_timeout_s
    while True:
        if proc.poll() is not None:
            stop(server)
            raise SweepFailed(f"vLLM's server exited ({proc.returncode}) before answering", f"see {log}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
            return server
        except OSError:
            if time.time() > deadline:
                stop(server)
                raise SweepFailed(f"vLLM's server was not ready within {plan.server_timeout_s:.0f} s", f"see {log}") from None
            time.sleep(2)


def end_group(proc: subprocess.Popen, term_s: float = 60) -> None:
    """SIGTERM to the process group `proc` leads (started with start_new_session), SIGKILL if `proc` is still there
    after term_s seconds; returns once `proc` is reaped."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=term_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def stop(server: Server) -> None:
    """The server's process group ended (end_group) and its temp folder removed."""
    try:
        end_group(server.proc)
    finally:
        shutil.rmtree(server.temp_dir, ignore_errors=True)


def spec_counters(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return {key: sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:_total)?{{[^}}]*}} (\S+)$", text, re.M))
            for key, name in SPEC_COUNTERS.items()}


def run_aiperf(aiperf: str, port: int, tokenizer: Path, prompts: Path, concurrency: int, requests: int,
               plan: SweepPlan, out: Path) -> dict:
    """One aiperf profile at a fixed concurrency -> its summary metrics (profile_export_aiperf.json)."""
    cmd = [aiperf, "profile", "--model", "bundle", "--url", f"http://127.0.0.1:{port}", "--endpoint-type", "chat",
           "--streaming", "--tokenizer", str(tokenizer), "--input-file", str(prompts),
           "--custom-dataset-type", "single_turn", "--concurrency", str(concurrency), "--request-count", str(requests),
           "--warmup-request-count", str(min(concurrency, 4)), "--extra-inputs",
           json.dumps({"temperature": 0, "max_tokens": plan.max_tokens}), "--output-artifact-dir", str(out),
           "--ui-type", "none", "--random-seed", "0"]
    log = out.with_suffix(".log")
    # aiperf 0.13 under HF_HUB_OFFLINE loads every tokenizer as a cached hub snapshot, which a local folder is not
    # (HFValidationError); the tokenizer here is always the bundle's folder, so nothing is fetched without it
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    out.mkdir(parents=True, exist_ok=True)
    env["AIPERF_DATASET_MMAP_BASE_PATH"] = str(out)  # its per-run dataset folder, else left empty in /tmp
    with log.open("w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=plan.level_timeout_s, env=env)
    exports = sorted(out.rglob("profile_export_aiperf.json"))
    if done.returncode != 0 or not exports:
        raise SweepFailed(f"aiperf failed at concurrency {concurrency} (exit {done.returncode})", f"see {log}")
    return json.loads(exports[-1].read_text())


def stat(summary: dict, name: str, field: str = "avg") -> float | None:
    """A metric from aiperf's JSON export: {"name": {"avg": ..., "p50": ..., "unit": ...}} (top level or under
    "records", depending on the release)."""
    entry = summary.get(name) or summary.get("records", {}).get(name) or {}
    return entry.get(field) if isinstance(entry, dict) else None


class ServerPool:
    """vLLM's OpenAI servers kept up together, one per label, each on its own loopback port, loaded by aiperf with
    the prompts of `prompts` (aiperf's JSONL); all stopped on exit. An idle server waits on its request queue, so the
    servers not under load leave the machine to the one that is."""

    KIND = "trtspec/serving-sweep"

    def __init__(self, bundle: Path, plan: SweepPlan, work: Path, aiperf: str, prompts: Path, log: Any = print) -> None:
        self.bundle, self.plan, self.work, self.aiperf, self.prompts, self.log = bundle, plan, work, aiperf, prompts, log
        self.servers: dict[str, Server] = {}
        work.mkdir(parents=True, exist_ok=True)

    def start(self, label: str, k: int, schedule: dict[int, int] | None = None) -> None:
        spec = speculative_config(self.bundle, k, schedule)
        self.servers[label] = start_vllm(self.bundle, spec, max(self.plan.concurrency), self.work / f"vllm-{label}.log",
                                         self.plan)

    def rows(self, levels: dict[int, list[str]], tag: str = "") -> dict[str, dict[int, dict]]:
        return measure_interleaved(self, levels, self.aiperf, self.prompts, tag, self.log)

    def stop(self, label: str) -> None:
        stop(self.servers.pop(label))

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        for label in list(self.servers):
            self.stop(label)

    def measure(self, label: str, c: int, aiperf: str, prompts: Path, tag: str) -> dict:
        """One aiperf level on server `label` at concurrency c -> its row (tokens/s, TTFT, ITL, requests/s, and the
        acceptance length vLLM counted during it)."""
        server = self.servers[label]
        before = spec_counters(server.port) if server.drafts else {}
        summary = run_aiperf(aiperf, server.port, self.bundle / "target", prompts, c, max(2 * c, self.plan.min_requests),
                             self.plan, self.work / f"aiperf-{tag}-c{c}")
        after = spec_counters(server.port) if server.drafts else {}
        n = after.get("drafts", 0) - before.get("drafts", 0)
        return {
            "tokens_per_s": stat(summary, "output_token_throughput"),
            "ttft_ms": stat(summary, "time_to_first_token"),
            "itl_ms": stat(summary, "inter_token_latency"),
            "requests_per_s": stat(summary, "request_throughput"),
            "acceptance_length": round(1 + (after["accepted"] - before["accepted"]) / n, 3) if n else None,
        }


def measure_interleaved(pool: ServerPool, levels: dict[int, list[str]], aiperf: str, prompts: Path, tag: str = "",
                        log: Any = print) -> dict[str, dict[int, dict]]:
    """At each concurrency c, the servers levels[c] one right after the other, pool.plan.repeats rounds of them: a
    drift of the host's speed over the sweep's minutes then falls between concurrencies, not between the servers
    compared at one. -> {label: {c: the round of median tokens/s, with every round's tokens/s as "runs"}}."""
    rows: dict[str, dict[int, dict]] = {}
    for c, labels in levels.items():
        runs: dict[str, list[dict]] = {label: [] for label in labels}
        for r in range(pool.plan.repeats):
            for label in labels:
                runs[label].append(pool.measure(label, c, aiperf, prompts, f"{tag}{label}" + (f"-r{r}" if r else "")))
                log(f"{label} at concurrency {c}: {fmt(runs[label][-1]['tokens_per_s'])} tok/s")
        for label, got in runs.items():
            rows.setdefault(label, {})[c] = median_round(got)
    return rows


def median_round(rounds: list[dict]) -> dict:
    """One engine's rounds at one level -> the round of median tokens/s, with every round's tokens/s as "runs"
    (paired_ratio pairs them with another engine's rounds)."""
    ranked = sorted(rounds, key=lambda row: row["tokens_per_s"] or 0.0)
    return {**ranked[(len(ranked) - 1) // 2], "runs": [round(row["tokens_per_s"] or 0.0, 2) for row in rounds]}


def groups_of(lengths: list[int], together: int) -> list[list[int]]:
    """The draft lengths in the groups a sweep loads at once: all of them where `together` is 0 or holds them, else
    groups of `together` engines, each with no draft (k = 0) beside its lengths, so that every group measures its
    lengths against the same reference in the same rounds."""
    if not together or together >= len(lengths):
        return [list(lengths)]
    base = [0] if 0 in lengths else []
    size = together - len(base)
    if size < 1:
        raise ValueError(f"a sweep in groups needs room for no draft and one draft length, not {together} engine(s)")
    rest = [k for k in lengths if k != 0]
    return [base + rest[i:i + size] for i in range(0, len(rest), size)]


def measure_groups(pool: Any, plan: SweepPlan, log: Any) -> tuple[dict[int, dict[int, dict]], dict[int, dict[int, float]]]:
    """Every draft length at every concurrency, the groups (groups_of) one after another, each group's engines stopped
    before the next starts -> (rows {k: {c: row}}, tokens/s {k: {c: ...}} on one clock: a later group's figures
    scaled by the first group's no-draft tokens/s over its own, so lengths of different groups compare by their
    ratio to no draft measured beside them, not across the host's drift between groups)."""
    groups = groups_of(plan.draft_lengths, plan.together)
    if len(groups) > 1:
        log(f"the draft lengths in {len(groups)} groups of at most {plan.together} engines (the memory free): "
            + "; ".join(str(g) for g in groups))
    rows: dict[int, dict[int, dict]] = {}
    tps: dict[int, dict[int, float]] = {}
    for group in groups:
        for k in group:
            pool.start(f"k{k}", k)
        found = pool.rows({c: [f"k{k}" for k in group] for c in plan.concurrency})
        if len(groups) > 1:
            for k in group:
                pool.stop(f"k{k}")
        scale = {c: ratio(rows[0][c]["tokens_per_s"], r["tokens_per_s"]) or 1.0
                 for c, r in found["k0"].items()} if 0 in rows and "k0" in found else {}
        for k in group:
            if k not in rows:
                rows[k] = found[f"k{k}"]
                tps[k] = {c: r["tokens_per_s"] and r["tokens_per_s"] * scale.get(c, 1.0) for c, r in rows[k].items()}
    return rows, tps


def run_sweep(pool: Any, plan: SweepPlan, log: Any = print) -> dict:
    """Every draft length at every concurrency on `pool` (ServerPool: vLLM's servers under aiperf; LockstepPool:
    engines in this process, stepped in lockstep), in groups where the memory holds fewer engines than lengths
    (measure_groups), then the schedule they imply (when it is not one fixed length), measured again beside no draft
    and the fastest fixed length at each concurrency (those that fit beside it): {rows: {k: {c: row}}, schedule,
    decided, scheduled: {c: row} | None, compared: {c: {no_draft: row, fastest: row}} | None, table, crossover}."""
    grouped = len(groups_of(plan.draft_lengths, plan.together)) > 1
    with pool:
        rows, tps = measure_groups(pool, plan, log)
        schedule, decided = schedule_from_sweep(tps)
        scheduled = compared = None
        if schedule and len(set(schedule.values())) > 1:  # a schedule that is one fixed k was measured above
            best = best_lengths(tps)
            keep = [k for k in dict.fromkeys([0, *best.values()]) if k in rows]
            if grouped:  # every engine was stopped: start those that fit beside the schedule's
                keep = keep[:plan.together - 1]
                for k in keep:
                    pool.start(f"k{k}", k)
            else:
                for k in set(plan.draft_lengths) - set(keep):
                    pool.stop(f"k{k}")  # its memory for the schedule's engine
            log(f"the schedule they imply, {schedule}, beside the fastest length and no draft")
            pool.start("schedule", schedule[1], schedule)
            levels = {c: list(dict.fromkeys(["schedule", *(f"k{k}" for k in (best[c], 0) if k in keep)]))
                      for c in plan.concurrency if c in best}
            again = pool.rows(levels, tag="again-")
            scheduled = again["schedule"]
            compared = {c: {"fastest": again[f"k{best[c]}"][c] if best[c] in keep else None,
                            "no_draft": again["k0"][c] if 0 in keep else None} for c in levels}
    table, where = sweep_table(rows, scheduled, compared)
    from trtspec.engines.measured import measured_on

    return {"kind": pool.KIND, "engine": "vllm", "measured_on": measured_on(vllm_engine),
            "concurrency": plan.concurrency, "draft_lengths": plan.draft_lengths,
            "groups": groups_of(plan.draft_lengths, plan.together),
            "max_tokens": plan.max_tokens, "rows": rows, "schedule": schedule, "decided": decided, "scheduled": scheduled,
            "compared": compared, "table": table, "crossover": where}


def lockstep_sweep(bundle: Path, prompts: list[list[int]], plan: SweepPlan, log: Any = print) -> dict:
    """run_sweep in lockstep (LockstepPool) on prompts given as token ids."""
    return run_sweep(LockstepPool(bundle, plan, prompts, log), plan, log)


class LockstepPool:
    """ServerPool's interface over vLLM engines loaded together in this process (vllm_engine.load, each with the KV
    cache its share needs), measured in lockstep (vllm_engine.lockstep): each engine's clock is its own steps, so a
    drift of the host's speed falls on every engine alike, where levels measured one after another (aiperf) put it
    between them. `plan.repeats` rounds at each concurrency; a level keeps its median round."""

    KIND = "trtspec/lockstep-sweep"

    def __init__(self, bundle: Path, plan: SweepPlan, prompts: list[list[int]], log: Any = print) -> None:
        self.bundle, self.plan, self.prompts, self.log, self.engines = bundle, plan, prompts, log, {}
        self.window = max(map(len, prompts)) + plan.max_tokens + max(plan.draft_lengths) + 8
        self.kv_gib = vllm_engine.kv_cache_gib_for(bundle / "target", max(plan.concurrency) * self.window)
        self.method = vllm_engine.from_options(read_options(bundle))["method"]

    def start(self, label: str, k: int, schedule: dict[int, int] | None = None) -> None:
        llm = vllm_engine.load(self.bundle / "target", self.bundle / "draft" if k else None, k, self.window,
                               max(self.plan.concurrency), schedule=schedule, kv_cache_gib=self.kv_gib,
                               method=self.method if k else None)
        vllm_engine.generate(llm, self.prompts[:2], 8)  # warm-up
        self.engines[label] = llm

    def stop(self, label: str) -> None:
        vllm_engine.shutdown(self.engines.pop(label))

    def __enter__(self) -> LockstepPool:
        return self

    def __exit__(self, *exc: object) -> None:
        for label in list(self.engines):
            self.stop(label)

    def rows(self, levels: dict[int, list[str]], tag: str = "") -> dict[str, dict[int, dict]]:
        """At each concurrency c, the engines levels[c] in lockstep, plan.repeats rounds -> {label: {c: the median
        round's tokens/s, TTFT and ITL (ms, on the engine's own clock), every round's tokens/s as "runs"}}."""
        rows: dict[str, dict[int, dict]] = {}
        for c, labels in levels.items():
            engines = {label: self.engines[label] for label in labels}
            requests = max(2 * c, self.plan.min_requests)
            got = [vllm_engine.lockstep(engines, self.prompts, self.plan.max_tokens, c, requests)
                   for _ in range(self.plan.repeats)]
            for label in labels:
                rounds = [{key: g[label][key] for key in ("tokens_per_s", "ttft_ms", "itl_ms")} for g in got]
                rows.setdefault(label, {})[c] = median_round(rounds)
            self.log(f"concurrency {c}: " + ", ".join(f"{label} {fmt(rows[label][c]['tokens_per_s'])}" for label in labels)
                     + " tok/s")
        return rows


def fmt(v: float | None, f: str = "{:.1f}") -> str:
    return "n/a" if v is None else f.format(v)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def paired_ratio(a: dict | None, b: dict | None) -> float | None:
    """Row a's tokens/s over row b's: the median of their rounds' ratios where both were measured in the same rounds
    (a round holds one level of each, back to back or in lockstep), else the ratio of the two rows."""
    import statistics

    if not a or not b:
        return None
    runs_a, runs_b = a.get("runs") or [], b.get("runs") or []
    if len(runs_a) == len(runs_b) > 1 and all(runs_b):
        return statistics.median(x / y for x, y in zip(runs_a, runs_b, strict=True))
    return ratio(a.get("tokens_per_s"), b.get("tokens_per_s"))


def sweep_table(rows: dict[int, dict[int, dict]], scheduled: dict[int, dict] | None,
                compared: dict[int, dict] | None = None) -> tuple[str, str]:
    """The side-by-side table (markdown: tokens/s at each draft length, the fastest, the schedule against it and
    against no draft, AL at the longest draft) and where speculation stops paying at the longest draft. The
    schedule's ratios (paired_ratio) are to `compared` ({c: {fastest, no_draft}} rows, measured beside the
    schedule) where given, else to the rows."""
    lengths = sorted(rows)
    levels = sorted({c for r in rows.values() for c in r})
    tps = {k: {c: rows[k][c]["tokens_per_s"] for c in rows[k]} for k in lengths}
    best = best_lengths(tps)
    head = "| concurrency | " + " | ".join(f"k={k} tok/s" for k in lengths) + " | fastest k |"
    if scheduled:
        head += " schedule tok/s | vs fastest k | vs no draft |"
    head += f" AL k={lengths[-1]} |"
    lines = [head, "|" + "---:|" * (head.count("|") - 1)]
    pays, costs = [], []
    for c in levels:
        r = paired_ratio(rows[lengths[-1]].get(c), rows.get(0, {}).get(c))
        if 0 in tps and r is not None:
            (pays if r >= 1 else costs).append(f"{c}" + ("" if r >= 1 else f" ({r:.2f}x)"))
        line = f"| {c} | " + " | ".join(fmt(tps[k].get(c)) for k in lengths) + f" | {best.get(c, 'n/a')} |"
        if scheduled:
            s = scheduled.get(c)
            beside = (compared or {}).get(c) or {"fastest": rows[best[c]][c] if c in best else None,
                                                 "no_draft": rows.get(0, {}).get(c)}
            line += (f" {fmt((s or {}).get('tokens_per_s'))} | {fmt(paired_ratio(s, beside['fastest']), '{:.2f}x')} |"
                     f" {fmt(paired_ratio(s, beside['no_draft']), '{:.2f}x')} |")
        lines.append(line + f" {fmt(rows[lengths[-1]].get(c, {}).get('acceptance_length'), '{:.2f}')} |")
    where = "; ".join(([f"k={lengths[-1]} pays at concurrency {', '.join(pays)}"] if pays else [])
                      + ([f"costs at {', '.join(costs)}"] if costs else []))
    return "\n".join(lines), where
