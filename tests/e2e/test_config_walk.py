"""The config schema walked key by key: every leaf key of BuildConfig gets the hostile values of its type (negative,
zero below its bound, huge, inf, nan, a wrong type, an empty string) through `trtspec build --check --set KEY=VALUE`.
Each must be refused with one `Error:` line naming the key and exit 2, before any stage runs. The values at each
bound must pass the config: exit 0, or 2 where the model's config refuses them (a bin past the window), never the
CLI's internal-error path (exit 70), which is for real bugs.
"""

from __future__ import annotations

import json
import math
import types
import typing
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from trtspec.cli import main
from trtspec.config import BuildConfig, config_from_dict
from trtspec.errors import ConfigError

ROWS = [{"messages": [{"role": "user", "content": f"Say {w}."}, {"role": "assistant", "content": f"{w.title()}!"}]}
        for w in ("hi", "yes", "no", "blue")]
FREE_TEXT = {"description"}  # may be empty
# keys that exist only for the other draft method are walked with that method set
CONTEXT = {"dflash.": ["draft.method=dflash"], "serve.draft_model": ["serve.decoding=draft_target"]}


def leaf_keys(model: type[BaseModel] = BuildConfig, prefix: str = "") -> list[tuple[str, typing.Any, list]]:
    """(dotted key, annotation, pydantic metadata) of every leaf key; data.sources' keys as data.sources.KEY."""
    keys = []
    for name, field in model.model_fields.items():
        dotted = prefix + (field.alias or name)
        inner = [a for t in (field.annotation, *typing.get_args(field.annotation)) for a in (t, *typing.get_args(t))]
        section = next((a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if section is not None:
            keys += leaf_keys(section, dotted + ".")
        else:
            keys.append((dotted, field.annotation, field.metadata))
    return keys


def bounds(metadata: list) -> tuple[float | None, float | None, bool, bool]:
    """(low, high, low inclusive, high inclusive) from the field's Ge/Gt/Le/Lt."""
    low = high = None
    low_inc = high_inc = True
    for m in metadata:
        if (v := getattr(m, "ge", None)) is not None:
            low = v
        if (v := getattr(m, "gt", None)) is not None:
            low, low_inc = v, False
        if (v := getattr(m, "le", None)) is not None:
            high = v
        if (v := getattr(m, "lt", None)) is not None:
            high, high_inc = v, False
    return low, high, low_inc, high_inc


def kind(annotation) -> str:
    optional = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    base = next(a for a in typing.get_args(annotation) if a is not type(None)) if optional else annotation
    if typing.get_origin(base) is typing.Literal:
        return "literal"
    if typing.get_origin(base) is list:
        return "list"
    if typing.get_origin(base) is dict:
        return "dict"
    return {bool: "bool", int: "int", float: "float", str: "str"}[base]


HOSTILE = {
    "int": ["-1", "1000000000000000000000000000000", ".inf", ".nan", "1.5", "x", "''", "true", "[1]"],
    "float": ["-1", "1.0e+30", ".inf", "-.inf", ".nan", "x", "''", "true", "[1]"],
    "literal": ["nope", "''", "1", "true", "[]"],
    "bool": ["x", "2", "''", "[]"],
    "str": ["''", "5", "true", "[1]"],
    "list": ["[-1]", "[100000]", "x", "[]", "[.nan]", "[1.5]"],
    "dict": ["x", "[1]", "{intermediate_size: -5}", "{hidden_size: .inf}", "{rope_theta: x}", "{nope: 1}"],
}


LISTS = ("data.sources.", "eval.suites.")  # lists of sections: their keys walked as whole lists below


def hostile_values(key: str, annotation, metadata) -> list[str]:
    if key.startswith(LISTS):
        return []  # walked through data.sources and eval.suites below
    values = [v for v in HOSTILE[kind(annotation)] if not (key in FREE_TEXT and v == "''")]
    if kind(annotation) == "list" and not any(type(m).__name__ == "MinLen" for m in metadata):
        values.remove("[]")  # a list that may be empty (draft.step_back: [] = none)
    low, high, low_inc, _ = bounds(metadata)
    if kind(annotation) in ("int", "float") and low is not None and (low > 0 or not low_inc):
        values.append("0")
    if high is not None and kind(annotation) in ("int", "float"):
        values.append(str(int(high) + 1))
    if type(None) not in typing.get_args(annotation):
        values.append("null")
    return values


def boundary_values(annotation, metadata) -> list[str]:
    if kind(annotation) not in ("int", "float"):
        return []
    low, high, low_inc, high_inc = bounds(metadata)
    out = []
    if low is not None:
        out.append(str(low if low_inc else (low + 1 if kind(annotation) == "int" else low + 1e-6)))
    if high is not None:
        out.append(str(high if high_inc else (high - 1 if kind(annotation) == "int" else high - 1e-6)))
    return out


SOURCE_HOSTILE = ["x", "[]", "[{}]", "[{kind: jsonl}]", "[{kind: jsonl, path: ''}]", "[{kind: csv, path: d.jsonl}]",
                  "[{kind: jsonl, path: d.jsonl, limit: 0}]", "[{kind: jsonl, path: d.jsonl, limit: .inf}]",
                  "[{kind: jsonl, path: d.jsonl, limit: 10000000000}]", "[{kind: jsonl, path: d.jsonl, split: ''}]",
                  "[{kind: jsonl, path: d.jsonl, regenerate: 3}]", "[{kind: jsonl, path: d.jsonl, split: test}]",
                  "[{kind: regenerate, path: d.jsonl, subset: x}]", "[{kind: hf, path: d.jsonl, subset: ''}]"]
SUITE_HOSTILE = ["x", "null", "[{}]", "[1]", "[{kind: csv}]", "[{kind: jsonl}]", "[{kind: hf}]", "[{kind: jsonl, path: ''}]",
                 "[{kind: builtin, path: d.jsonl}]", "[{kind: builtin, categories: []}]", "[{kind: builtin, categories: [nope]}]",
                 "[{kind: builtin, categories: ['']}]", "[{kind: builtin, categories: [1]}]", "[{kind: builtin, split: test}]",
                 "[{kind: jsonl, path: d.jsonl, prompt_field: ''}]", "[{kind: jsonl, path: d.jsonl, messages_field: 5}]",
                 "[{kind: jsonl, path: d.jsonl, category_field: null}]", "[{kind: jsonl, path: d.jsonl, split: test}]",
                 "[{kind: hf, path: d.jsonl, subset: ''}]", "[{kind: hf, path: d.jsonl, split: ''}]",
                 "[{kind: jsonl, path: d.jsonl, nope: 1}]", "[" + ", ".join(["{kind: builtin}"] * 17) + "]"]
KEYS = leaf_keys()
WALK = ([(k, v) for k, ann, meta in KEYS for v in hostile_values(k, ann, meta)] + [("data.sources", v) for v in SOURCE_HOSTILE]
        + [("eval.suites", v) for v in SUITE_HOSTILE])
EDGES = [(k, v) for k, ann, meta in KEYS for v in boundary_values(ann, meta)]


@pytest.fixture(scope="module")
def walk_config(tmp_path_factory, tiny_model_dir) -> Path:
    tmp = tmp_path_factory.mktemp("walk")
    (tmp / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    raw = {"model": {"source": str(tiny_model_dir)},
           "data": {"sources": [{"kind": "jsonl", "path": "d.jsonl"}], "seq_len": 64, "holdout_fraction": 0.25},
           "eval": {"num_prompts": 1, "max_new_tokens": 4}}
    (tmp / "c.yaml").write_text(yaml.safe_dump(raw))
    return tmp / "c.yaml"


def check(cfg: Path, key: str, value: str) -> tuple[int, list[str], str]:
    context = [c for prefix, sets in CONTEXT.items() if key.startswith(prefix) for c in sets]
    args = ["build", str(cfg), "--out", str(cfg.parent / "run"), "--check"]
    for s in [*context, f"{key}={value}"]:
        args += ["--set", s]
    result = CliRunner().invoke(main, args)
    errors = [ln for ln in result.output.splitlines() if ln.startswith("Error: ")]
    return result.exit_code, errors, result.output


def test_the_walk_covers_the_schema():
    walked = {k for k, _ in WALK}
    assert {k for k, *_ in KEYS if not k.startswith(LISTS)} <= walked
    assert len(KEYS) >= 80 and len(WALK) >= 500
    unbounded = [k for k, ann, meta in KEYS if kind(ann) in ("int", "float") and None in bounds(meta)[:2]]
    assert not unbounded, f"numeric keys without a lower and an upper bound: {unbounded}"


@pytest.mark.parametrize("key", sorted({k for k, _ in WALK}))
def test_every_hostile_value_is_refused_at_load(key, walk_config):
    for value in [v for k, v in WALK if k == key]:
        code, errors, out = check(walk_config, key, value)
        assert code == 2 and len(errors) == 1 and "Traceback" not in out, f"{key}={value}: exit {code}\n{out}"
        assert key.split(".")[-1] in errors[0] or key == "data.sources", f"{key}={value}: {errors[0]}"
        assert not key.startswith("eval.suites") or "eval.suites" in errors[0], f"{key}={value}: {errors[0]}"
        assert not (walk_config.parent / "run").exists(), f"{key}={value} created the run directory"


@pytest.mark.parametrize("key", sorted({k for k, _ in EDGES}))
def test_values_at_the_bounds_never_reach_an_internal_error(key, walk_config):
    for value in [v for k, v in EDGES if k == key]:
        code, errors, out = check(walk_config, key, value)
        assert code in (0, 2) and "Traceback" not in out, f"{key}={value}: exit {code}\n{out}"
        assert code == 0 or len(errors) == 1, f"{key}={value}: {out}"


NUMERIC = [(k, ann, meta) for k, ann, meta in KEYS if kind(ann) in ("int", "float") and not k.startswith(LISTS)]


def nested(key: str, value) -> dict:
    raw: dict = {"data": {"sources": [{"kind": "jsonl", "path": "d.jsonl"}]}}
    node = raw
    *sections, leaf = key.split(".")
    for s in sections:
        node = node.setdefault(s, {})
    node[leaf] = value
    if key.startswith("dflash."):
        raw["draft"] = {"method": "dflash"}
    return raw


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_number_outside_a_keys_bounds_is_refused(data):
    """Property: for a numeric key drawn at random, any number outside its bounds (or not finite) is refused at load
    with a ConfigError naming the key; the walk above tries the edges, this tries everything else."""
    key, ann, meta = data.draw(st.sampled_from(NUMERIC))
    low, high, low_inc, high_inc = bounds(meta)
    outside = [st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not math.isfinite(x))]
    if low is not None:
        outside.append(st.floats(max_value=low, exclude_max=low_inc, allow_nan=False) if kind(ann) == "float" else
                       st.integers(max_value=math.ceil(low) - (1 if low_inc else 0)))
    if high is not None:
        outside.append(st.floats(min_value=high, exclude_min=high_inc, allow_nan=False) if kind(ann) == "float" else
                       st.integers(min_value=math.floor(high) + (1 if high_inc else 0)))
    value = data.draw(st.one_of(outside))
    with pytest.raises(ConfigError, match=key.split(".")[-1]):
        config_from_dict(nested(key, value))


def test_check_runs_no_stage_and_writes_nothing(walk_config):
    run = walk_config.parent / "run"
    result = CliRunner().invoke(main, ["build", str(walk_config), "--out", str(run), "--check", "--json", "--until", "train"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.splitlines()[-1])
    assert (out["ok"], out["would_run"]) == (True, ["data", "convert", "train"])
    # what the build will take: the target's checkpoint, the rows the sources hold, their offline states (fp16)
    from trtspec.config import load_config
    from trtspec.models import resolve_model

    cfg, est = load_config(walk_config), out["resources"]
    weights = sum(p.stat().st_size for p in resolve_model(cfg.model.source).glob("*.safetensors")) / 2**30
    assert est["target_weights_gib"] == round(weights, 2) and est["trainer_loads"] == "the whole target"
    assert est["free_memory_gib"] > 0 and est["free_disk_gib"] > 0
    assert est["training_rows"] is None or (est["training_rows"] >= 1 and est["states_gib"] >= 0)
    assert not run.exists()
