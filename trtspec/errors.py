"""The errors trtspec raises on purpose, and the boundary (exit_with_one_line) where the CLI and every script
turn each into one `Error: ...` line and its exit code."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn


class TrtspecError(Exception):
    """Base class: a message for the user, a hint how to fix it, and the process exit code."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def __reduce__(self) -> tuple:
        # rebuilt from its fields, not its __init__'s arguments (DiskFull's differ): an error raised in a spawned
        # process (trtspec.engines.worker) reaches this one whole, hint included
        return _rebuild, (type(self), self.__dict__)


def _rebuild(cls: type, fields: dict) -> TrtspecError:
    error = cls.__new__(cls)
    Exception.__init__(error, fields["message"])
    error.__dict__.update(fields)
    return error


class ConfigError(TrtspecError):
    """The build config (file, YAML, keys, types, values, --set overrides) is wrong."""


class ModelError(TrtspecError):
    """A model path/id/architecture/tokenizer cannot be used."""


class DataError(TrtspecError):
    """Training data or prompts are empty, malformed or unusable."""


class ArtifactError(TrtspecError):
    """A run directory, bundle or checkpoint is missing, foreign or corrupted."""


class DiskFull(TrtspecError):
    """The disk filled while a stage wrote; the stage left nothing a later run trusts."""

    exit_code = 5

    def __init__(self, stage: str, run_path: object):
        super().__init__(f"the disk filled while the {stage} stage wrote into '{run_path}'; the stage left nothing a "
                         "later run trusts", "free some disk and re-run the same command: finished stages are kept")


class LockedError(TrtspecError):
    """Another live trtspec process holds the run directory."""

    exit_code = 4


class ProcessDied(TrtspecError):
    """A spawned process (an engine kept apart from the build's, trtspec.engines.worker) ended without answering:
    killed, most often by the kernel for memory."""

    exit_code = 5


class MissingDependency(TrtspecError):
    """An optional package or hardware (tensorrt_llm, CUDA) the stage needs is not here."""

    exit_code = 3


class ValidationFailed(TrtspecError):
    """A validation gate (--require-exact, --min-acceptance-length, --min-speedup) was missed."""

    exit_code = 1


def exit_with_one_line(e: BaseException, debug: bool = False) -> NoReturn:
    """The boundary of the CLI and of every script: an exception becomes one line on stderr and an exit code
    (0 ok, 1 validation gate missed, 2 bad input, 3 missing dependency, 4 run dir locked, 5 out of memory or
    disk, 70 internal error, 130 interrupted); the traceback only with `debug` (--debug) or TRTSPEC_DEBUG=1."""
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if debug or os.environ.get("TRTSPEC_DEBUG") == "1":
        traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
    if isinstance(e, TrtspecError):
        say(f"Error: {e.message}" + (f"\n  hint: {e.hint}" if e.hint else ""))
        sys.exit(e.exit_code)
    if isinstance(e, BrokenPipeError):  # the reader went away (`trtspec families | head`): nothing left to say
        sys.stderr.close()
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        sys.exit(0)
    if isinstance(e, KeyboardInterrupt):
        say("Error: interrupted (a build keeps its finished stages: the same command resumes)")
        sys.exit(130)
    if isinstance(e, MemoryError):
        say("Error: out of memory (in a build: lower data.batch_size / train.batch_size)")
        sys.exit(5)
    if isinstance(e, OSError) and getattr(e, "errno", None) == 28:
        say("Error: no space left on the device; free some disk and re-run (finished stages are kept)")
        sys.exit(5)
    say(f"Error: internal error: {type(e).__name__}: {e} (re-run with --debug for the traceback)")
    sys.exit(70)


def run_main(main: Callable[[], int | None]) -> NoReturn:
    """A script's entry point: main()'s return value is the exit code, and an exception ends it as the CLI ends,
    in one line (the traceback with --debug on the command line or TRTSPEC_DEBUG=1)."""
    try:
        code = main()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - the script's boundary: everything becomes one line
        exit_with_one_line(e, "--debug" in sys.argv[1:])
    sys.exit(code)
