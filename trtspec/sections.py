"""What every section of the build config is made of (trtspec.config composes them; each draft family's package
declares its own section, e.g. trtspec.dflash2.config): a strict pydantic model, keys that document themselves, and
the bounded number types the keys share."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

BIG = 10**9  # the bound of counts (rows, steps) that have no natural one: finite, far beyond any real run
VOCAB_MAX = 1 << 24  # token ids and vocabulary sizes (the largest vocabularies are ~260k)
LayerId = Annotated[int, Field(ge=0, le=1023)]
BatchSize = Annotated[int, Field(ge=1, le=1024)]
Requests = Annotated[int, Field(ge=1, le=65536)]  # a batch size an engine serves (serve.max_batch_size's range)
ContextLen = Annotated[int, Field(ge=16, le=1_048_576)]  # tokens of context before an answer
DraftLen = Annotated[int, Field(ge=0, le=16)]  # tokens drafted per step; 0 = no speculation (draft.length's range)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, allow_inf_nan=False)


def key(default: Any = ..., description: str = "", **limits: Any) -> Any:
    """A config key: its default, what it means (docs/config.md is generated from it), its limits."""
    return Field(default=default, description=description, **limits)
