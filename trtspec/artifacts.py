"""The run directory: one folder per stage, each written to a temporary folder and renamed into place.

RUN_DIR/
  trtspec-run.json        marks the folder as a trtspec run (a foreign folder is never written into)
  .lock                   pid + host of the process writing it; a stale lock (dead pid) is taken over
  .work/<stage>-<key>/    resumable scratch (training checkpoints, regenerated answers); survives kills
  .work/target-<key>/     the frozen target's hidden states and held-out answers, shared by every train recipe
  <stage>/manifest.json   stage, fingerprint, resolved config, inputs, versions, wall time, metrics,
                          and the sha256 of every file it vouches for

A stage counts as done only when its folder exists, its manifest's fingerprint matches, and every file
listed in the manifest still has the recorded size and hash. Anything else is redone.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trtspec.errors import ArtifactError, DiskFull, LockedError

MARKER = "trtspec-run.json"
# the export stage's folder is the deployment bundle a user copies to a GPU server
STAGE_DIRS = {"export": "bundle"}
MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fingerprint(obj: Any) -> str:
    """A stable short hash of any JSON-able object (config sections, upstream fingerprints)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def output_fingerprint(manifest: dict) -> str:
    """What a downstream stage keys on (its manifest's `inputs`): the stage's fingerprint and the sha256 of the
    files it wrote, so a stage redone with the same settings but other outputs still redoes what follows."""
    return fingerprint({"fp": manifest["fingerprint"], "files": {k: v["sha256"] for k, v in manifest.get("files", {}).items()}})


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temp file + rename), so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def write_tensors(path: Path, tensors: dict) -> Path:
    """A safetensors file written whole or not at all (a temporary file renamed into place)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp))
    tmp.replace(path)
    return path


def read_tensors(path: Path, what: str) -> dict:
    """A safetensors file's tensors; a missing or unreadable file is one ArtifactError naming `what`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from trtspec.errors import ArtifactError

    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{what} '{path}' are missing", "re-run the convert/train stage")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ArtifactError(f"'{path}' is not a readable safetensors file ({e})", "re-run the stage that wrote it") from None


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ArtifactError(f"'{path}' is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ArtifactError(f"'{path}' is not valid JSON (corrupted or truncated)") from None


def file_table(folder: Path) -> dict[str, dict[str, Any]]:
    """{relative path: {size, sha256}} for every file under folder except the manifest itself."""
    table = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            table[p.relative_to(folder).as_posix()] = {"size": p.stat().st_size, "sha256": sha256_file(p)}
    return table


def verify_files(folder: Path, manifest: dict) -> list[str]:
    """Problems with the files a manifest vouches for, and files it does not know of (an extra weight shard is loaded
    by engines that glob for them): an empty list = all intact."""
    want_files = manifest.get("files", {})
    problems = []
    for rel, want in want_files.items():
        p = folder / rel
        if not p.is_file():
            problems.append(f"{rel}: missing")
        elif p.stat().st_size != want["size"]:
            problems.append(f"{rel}: size {p.stat().st_size} != {want['size']}")
        elif sha256_file(p) != want["sha256"]:
            problems.append(f"{rel}: checksum differs")
    if want_files and folder.is_dir():
        problems += [f"{rel}: added after the stage wrote its folder" for rel in added_files(folder, want_files)]
    return problems


def added_files(folder: Path, known: dict) -> list[str]:
    """Files under `folder` (its manifest aside) that `known` does not list."""
    return sorted(rel for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST
                  and (rel := p.relative_to(folder).as_posix()) not in known)


def keyed_scratch(root: Path, name: str, key: str) -> Path:
    """root/name-key, created; scratch of the same name under another key is removed (it can never be reused)."""
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob(f"{name}-*"):
        if old.name != f"{name}-{key}":
            shutil.rmtree(old, ignore_errors=True)
    d = root / f"{name}-{key}"
    d.mkdir(exist_ok=True)
    return d


def package_versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in ("trtspec", "torch", "transformers", "nvidia-modelopt", "accelerate", "datasets", "onnx", "onnxruntime"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunDir:
    """A trtspec run directory. Use `with RunDir(path).locked():` around anything that writes."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    # --- identity -------------------------------------------------------------------------------
    def ensure(self) -> None:
        """Create the run dir, or check that an existing folder is a trtspec run (never write into another)."""
        marker = self.path / MARKER
        if self.path.exists():
            if not self.path.is_dir():
                raise ArtifactError(f"run directory '{self.path}' is a file", "choose another --out")
            if not marker.exists() and any(self.path.iterdir()):
                raise ArtifactError(
                    f"'{self.path}' exists and is not a trtspec run directory; refusing to write into it",
                    "choose an empty or new --out folder",
                )
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            if not marker.exists():
                write_json(marker, {"kind": "trtspec-run", "format": FORMAT_VERSION, "created": time.time()})
            probe = self.path / f".probe{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise ArtifactError(f"run directory '{self.path}' is not writable: {e.strerror}", "check permissions and free space") from None

    def is_run(self) -> bool:
        return (self.path / MARKER).is_file()

    # --- locking --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[RunDir]:
        self.ensure()
        lock = self.path / ".lock"
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        for _ in range(3):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    other = json.loads(lock.read_text() or "{}")
                except (OSError, json.JSONDecodeError):
                    other = {}
                same_host = other.get("host") == me["host"]
                if other.get("pid") and same_host and _pid_alive(int(other["pid"])):
                    raise LockedError(
                        f"run directory '{self.path}' is in use by another trtspec process (pid {other['pid']})",
                        "wait for it to finish, or use another --out",
                    ) from None
                if other and not same_host:
                    raise LockedError(
                        f"run directory '{self.path}' is locked by host {other.get('host')} (pid {other.get('pid')})",
                        f"if that run is dead, delete {lock}",
                    ) from None
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()  # stale: its process is gone
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            break
        else:
            raise LockedError(f"could not take the lock on '{self.path}'")
        try:
            yield self
        finally:
            with contextlib.suppress(FileNotFoundError):
                if json.loads(lock.read_text() or "{}").get("pid") == os.getpid():
                    lock.unlink()

    # --- stages ---------------------------------------------------------------------------------
    def stage_dir(self, stage: str) -> Path:
        return self.path / STAGE_DIRS.get(stage, stage)

    def work_dir(self, stage: str, key: str) -> Path:
        """Resumable scratch for one stage and one fingerprint; other fingerprints' scratch is removed."""
        return keyed_scratch(self.path / ".work", stage, key)

    def manifest(self, stage: str) -> dict | None:
        """A stage's manifest; None when it is missing or unreadable (the stage is then redone: check_stage)."""
        try:
            return self.read_manifest(stage)
        except ArtifactError:
            return None

    def read_manifest(self, stage: str) -> dict | None:
        """A stage's manifest, None when it has none; an ArtifactError naming the file when it is not a JSON object
        (truncated, corrupted): what `trtspec inspect` reports."""
        p = self.stage_dir(stage) / MANIFEST
        if not p.is_file():
            return None
        m = read_json(p)
        if not isinstance(m, dict):
            raise ArtifactError(f"'{p}' is not a manifest (a JSON object)")
        return m

    def check_stage(self, stage: str, fp: str) -> str | None:
        """None when the stage is done with fingerprint fp and intact, else why it must be (re)done."""
        d = self.stage_dir(stage)
        if not d.exists():
            return "not run yet"
        m = self.manifest(stage)
        if m is None:
            return "manifest missing or unreadable"
        if m.get("stage") != stage or m.get("status") not in ("done", "skipped"):
            return "manifest is not a finished stage"
        if m.get("fingerprint") != fp:
            return "config or inputs changed"
        problems = verify_files(d, m)
        if problems:
            return "files do not match the manifest: " + "; ".join(problems[:3])
        return None

    def require(self, stage: str, verify: bool = False) -> tuple[Path, dict]:
        """The folder and manifest of a finished upstream stage, or a clear error. verify: its files are checked
        against the manifest's sizes and checksums first (a command that reads them outside a build: an edited file
        is refused by name, never served)."""
        m = self.manifest(stage)
        if m is None or m.get("status") != "done":
            raise ArtifactError(
                f"'{self.path}' has no finished '{stage}' stage", f"run `trtspec build CONFIG --out {self.path} --until {stage}`"
            )
        if verify and (problems := verify_files(self.stage_dir(stage), m)):
            raise ArtifactError(f"'{self.stage_dir(stage) / problems[0].split(':')[0]}' no longer matches what the {stage} "
                                f"stage wrote ({problems[0].split(': ', 1)[1]}"
                                + (f"; {len(problems) - 1} more file(s)" if len(problems) > 1 else "") + ")",
                                f"redo it: `trtspec build CONFIG --out {self.path}` (it redoes {stage} and what follows)")
        return self.stage_dir(stage), m

    @contextlib.contextmanager
    def staging(self, stage: str) -> Iterator[Path]:
        """A fresh temporary folder for a stage; `commit` renames it into place."""
        tmp = self.path / f".tmp-{stage}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def commit(self, stage: str, tmp: Path, manifest: dict) -> dict:
        """Hash the files, write the manifest last, then swap the folder into place."""
        manifest = {**manifest, "files": file_table(tmp)}
        try:
            write_json(tmp / MANIFEST, manifest)
            final = self.stage_dir(stage)
            old = self.path / f".old-{stage}"
            shutil.rmtree(old, ignore_errors=True)
            if final.exists():
                os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise DiskFull(stage, self.path) from None
            raise ArtifactError(f"could not write stage '{stage}' into '{self.path}': {e.strerror}") from None
        return manifest

    def invalidate(self, stage: str) -> None:
        """Remove a stage's folder before redoing it; a folder without a trtspec manifest is never removed."""
        d = self.stage_dir(stage)
        if d.is_dir() and not (d / MANIFEST).is_file() and any(d.iterdir()):
            raise ArtifactError(
                f"'{d}' exists and is not a trtspec artifact; refusing to overwrite it",
                f"move it out of '{self.path}' or choose another --out",
            )
        shutil.rmtree(d, ignore_errors=True)


def reset_peak_rss() -> bool:
    """Start peak_rss_gib's count afresh, so that a stage reports its own peak and not an earlier stage's (Linux:
    writing 5 to /proc/self/clear_refs resets the process's high-water mark); False where the OS cannot, the peak then
    being the process's so far."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_rss_gib() -> float | None:
    """The process's peak resident memory in GiB (Linux/macOS) since it started or reset_peak_rss last ran, None
    where the OS does not report it."""
    try:
        import resource
    except ImportError:
        return None
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(kb / (2**30 if sys.platform == "darwin" else 2**20), 2)
