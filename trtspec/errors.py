"""The errors trtspec raises on purpose. cli.py turns each into one `Error: ...` line and its exit code."""

from __future__ import annotations


class TrtspecError(Exception):
    """Base class: a message for the user, a hint how to fix it, and the process exit code."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


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


class MissingDependency(TrtspecError):
    """An optional package or hardware (tensorrt_llm, CUDA) the stage needs is not here."""

    exit_code = 3


class ValidationFailed(TrtspecError):
    """A validation gate (--require-exact, --min-acceptance-length, --min-speedup) was missed."""

    exit_code = 1
