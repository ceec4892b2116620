"""A real tritonserver (2.51, from the nvidia-pytriton wheel that scripts/setup.sh --engines vllm unpacks into
$VENV/triton) started on a repository `trtspec deploy triton` wrote, with the stand-in model.py in place of NVIDIA's,
and always stopped. Errors are one line: the server log's first error, not its tables."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from trtspec.engines.vllm.sweep import end_group, free_port

ROOT = Path(__file__).resolve().parents[2]
# Triton's Python backend makes a folder of its own at this fixed path when it loads (EnvironmentManager, mkdtemp) and
# removes it at a clean exit only: a server killed, or one that failed to start, leaves it behind
PYTHON_ENVS = "/tmp/python_env_*"
TRITON_DIR = Path(os.environ.get("TRTSPEC_TRITONSERVER_DIR") or Path(sys.prefix) / "triton" / "pytriton" / "tritonserver")
STANDIN = Path(__file__).resolve().parent / "triton_standin" / "model.py"
MODEL = "tensorrt_llm"


class ServerError(Exception):
    """tritonserver did not come up, in one line; `pid` leads the server's (stopped) process group."""

    def __init__(self, message: str, pid: int):
        super().__init__(message)
        self.pid = pid


def binary() -> Path:
    return TRITON_DIR / "bin" / "tritonserver"


def missing() -> str | None:
    """Why the tier cannot run here (None when it can)."""
    if not binary().is_file():
        return f"no tritonserver at {binary()} (bash scripts/setup.sh --engines vllm unpacks nvidia-pytriton there)"
    if not (TRITON_DIR / "backends" / "python" / "triton_python_backend_stub").is_file():
        return "Triton's Python backend stub is not in backends/python (re-run scripts/setup.sh --engines vllm)"
    try:
        import tritonclient.grpc  # noqa: F401
        import tritonclient.http  # noqa: F401
    except ImportError:
        return "tritonclient[http,grpc] is not installed (pip install -e '.[triton]')"
    return None


def stub_environment() -> dict[str, str]:
    """What the Python backend stub needs to run the stand-in on this checkout: the venv interpreter's own libpython
    (the stub links libpython3.X by name) and the folders to import from, numpy 1.x first (see scripts/setup.sh)."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    libdir = sysconfig.get_config_var("LIBDIR")
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, os.environ.get("LD_LIBRARY_PATH")) if p)
    env["TRTSPEC_STANDIN_SYS_PATH"] = os.pathsep.join([str(TRITON_DIR.parents[1]), str(ROOT), *site.getsitepackages()])
    return env


def stage_repository(model_repo: Path, dest: Path) -> Path:
    """The written repository, copied as launch.sh copies it, with the stand-in as the model's model.py."""
    shutil.copytree(model_repo, dest)
    shutil.copy(STANDIN, dest / MODEL / "1" / "model.py")
    return dest


@dataclass
class Server:
    proc: subprocess.Popen
    http: int
    grpc: int
    metrics: int
    log: Path
    load_s: float = 0.0
    env_dirs: tuple[str, ...] = ()  # the Python backend's folders this server made (PYTHON_ENVS)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc}"

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def get(self, path: str, port: int | None = None) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{port or self.http}{path}", timeout=30) as r:
            return r.read()


def first_error(log: Path) -> str:
    """The log's first error line (E... lines and 'error:' lines), without Triton's prefix and tables."""
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    for line in lines:
        m = re.match(r'E\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] "?(.*?)"?$', line)
        if m and "CudaDriverHelper" not in m.group(1):
            return " ".join(m.group(1).replace("\\n", " ").split())[:400]
    return next((line for line in lines if line.startswith("error:")), "no error in the log")


PORT_TAKEN = "already in use"  # what Triton's log says when another process bound a port first
PORT_TRIES = 3


def start(repo: Path, cwd: Path, log: Path, ports: tuple[int, int, int] | None = None, timeout_s: float = 600,
          env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> Server:
    """tritonserver on `repo` with `cwd` as its working folder (model.yaml's paths are relative to it), bound to
    127.0.0.1 on free ports, `env` added to the stub's environment, `args` added to its command line; returns once
    the server is ready, raises ServerError (server stopped) when it is not.

    A free port is free when chosen, not when Triton binds it: a process in the other test worker (a vLLM engine's
    sockets) may take it in between, so without `ports` given a start that fails on a taken port tries new ports."""
    for attempt in range(1, PORT_TRIES + 1):
        try:
            return start_once(repo, cwd, log, ports or (free_port(), free_port(), free_port()), timeout_s, env, args)
        except ServerError as e:
            if ports or PORT_TAKEN not in str(e) or attempt == PORT_TRIES:
                raise
    raise AssertionError("unreachable")


def start_once(repo: Path, cwd: Path, log: Path, ports: tuple[int, int, int], timeout_s: float,
               env: dict[str, str] | None, args: tuple[str, ...]) -> Server:
    """One start of tritonserver on these ports (start)."""
    http, grpc, metrics = ports
    cmd = [str(binary()), f"--model-repository={repo}", f"--backend-directory={TRITON_DIR / 'backends'}",
           "--http-address=127.0.0.1", f"--http-port={http}", "--grpc-address=127.0.0.1", f"--grpc-port={grpc}",
           "--metrics-address=127.0.0.1", f"--metrics-port={metrics}", "--allow-gpu-metrics=false",
           "--exit-timeout-secs=5", *args]
    t0 = time.perf_counter()
    envs_before = set(glob.glob(PYTHON_ENVS))
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env={**stub_environment(), **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = Server(proc, http, grpc, metrics, log)
    try:
        try:
            while not server.ready():
                if proc.poll() is not None:
                    raise ServerError(f"tritonserver exited ({proc.returncode}): {first_error(log)}", proc.pid)
                if time.perf_counter() - t0 > timeout_s:
                    raise ServerError(f"tritonserver not ready within {timeout_s:.0f} s: {first_error(log)}", proc.pid)
                time.sleep(0.5)
        finally:
            # its own: the servers these tests start come up one at a time (test_triton.py, in one worker)
            server.env_dirs = tuple(set(glob.glob(PYTHON_ENVS)) - envs_before)
    except BaseException:
        stop(server)
        raise
    server.load_s = time.perf_counter() - t0
    return server


def kill(server: Server) -> None:
    """SIGKILL to the server's process group: the server dies as in a crash, with no time to finish a request (its
    Python backend's folder removed here, as the crash leaves it)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=20)
    remove_env_dirs(server)


def remove_env_dirs(server: Server) -> None:
    for d in server.env_dirs:
        shutil.rmtree(d, ignore_errors=True)


def stop(server: Server) -> None:
    """SIGTERM to the server's process group (its stubs too), SIGKILL if still there after 20 s; whatever Python
    backend folder it left, removed."""
    try:
        end(server)
    finally:
        remove_env_dirs(server)


def end(server: Server) -> None:
    end_group(server.proc, term_s=20)
    try:  # stubs left behind (a stub busy answering outlives its server's SIGTERM)
        os.killpg(server.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.time() + 20
    while group_alive(server.proc.pid) and time.time() < deadline:
        time.sleep(0.1)


@contextmanager
def running(repo: Path, cwd: Path, log: Path, **kw):
    server = start(repo, cwd, log, **kw)
    try:
        yield server
    finally:
        stop(server)


def group_alive(pgid: int) -> bool:
    """Is a process of the group `pgid` leads still running (the server or one of its stubs)? Zombies do not count:
    a stub whose server died is reparented to PID 1, which may be slow to reap it."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
