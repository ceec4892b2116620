"""The build config: strict keys and types, nearest-key hints, --set overrides, shipped recipes."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from trtspec.config import BuildConfig, apply_overrides, config_from_dict, load_config, parse_override
from trtspec.errors import ConfigError

MINIMAL = {"data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}}


def write(tmp_path, obj_or_text):
    p = tmp_path / "c.yaml"
    p.write_text(obj_or_text if isinstance(obj_or_text, str) else yaml.safe_dump(obj_or_text))
    return p


def test_minimal_config_gets_defaults(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL))
    assert cfg.model.source == "demo:smollm2-135m-instruct"
    assert cfg.train.mode == "offline"
    assert cfg.resolve_path("x.jsonl") == (tmp_path / "x.jsonl").resolve()


def test_unknown_key_names_file_key_and_nearest(tmp_path):
    p = write(tmp_path, {**MINIMAL, "train": {"lrr": 1e-3}})
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(p) in str(e.value) and "train.lrr" in str(e.value) and "did you mean 'train.lr'" in str(e.value)


def test_unknown_nested_list_key(tmp_path):
    p = write(tmp_path, {"data": {"sources": [{"kind": "jsonl", "pth": "x"}]}})
    with pytest.raises(ConfigError, match=r"data\.sources\.0\.pth"):
        load_config(p)


def test_wrong_type_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.epochs"):
        load_config(write(tmp_path, {**MINIMAL, "train": {"epochs": "many"}}))
    with pytest.raises(ConfigError, match=r"train\.batch_size"):
        load_config(write(tmp_path, {**MINIMAL, "train": {"batch_size": 2.5}}))


def test_out_of_range_and_unknown_choice(tmp_path):
    with pytest.raises(ConfigError, match="data.holdout_fraction"):
        load_config(write(tmp_path, {"data": {**MINIMAL["data"], "holdout_fraction": 1.5}}))
    with pytest.raises(ConfigError, match="quantize.format"):
        load_config(write(tmp_path, {**MINIMAL, "quantize": {"format": "fp7"}}))


def test_conflicting_options(tmp_path):
    with pytest.raises(ConfigError, match="kv_cache"):
        load_config(write(tmp_path, {**MINIMAL, "quantize": {"format": "none", "kv_cache": "fp8"}}))
    with pytest.raises(ConfigError, match="engine.backend.*'trtllm' or 'vllm'"):  # the engine backend is gone
        load_config(write(tmp_path, {**MINIMAL, "engine": {"backend": "tensorrt"}}))


def test_old_spelling_of_the_trtllm_backend_is_read_with_one_line(tmp_path, capsys):
    cfg = load_config(write(tmp_path, {**MINIMAL, "engine": {"backend": "pytorch"}}))
    assert cfg.engine.backend == "trtllm"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "engine.backend: pytorch is deprecated, read as trtllm" in err[0]
    assert load_config(write(tmp_path, MINIMAL), ["engine.backend=pytorch"]).engine.backend == "trtllm"


def test_old_spelling_of_the_runs_own_draft_is_read_with_one_line(tmp_path, capsys):
    """serve.decoding eagle3 meant the run's own draft of any family (a DFlash bundle's too): now `draft`."""
    cfg = load_config(write(tmp_path, {**MINIMAL, "draft": {"method": "dflash"}, "serve": {"decoding": "eagle3"}}))
    assert cfg.serve.decoding == "draft" and load_config(write(tmp_path, MINIMAL)).serve.decoding == "draft"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "serve.decoding: eagle3 is deprecated, read as draft" in err[0]
    assert load_config(write(tmp_path, MINIMAL), ["serve.decoding=eagle3"]).serve.decoding == "draft"


def test_extends_merges_the_parent_under_the_child(tmp_path):
    (tmp_path / "parent.yaml").write_text(yaml.safe_dump({**MINIMAL, "seed": 3, "train": {"epochs": 5.0, "lr": 1e-3}}))
    (tmp_path / "child.yaml").write_text(yaml.safe_dump({"extends": "parent.yaml", "train": {"lr": 2e-4}}))
    cfg = load_config(tmp_path / "child.yaml", ["train.batch_size=2"])
    assert (cfg.seed, cfg.train.epochs, cfg.train.lr, cfg.train.batch_size) == (3, 5.0, 2e-4, 2)
    assert cfg.data.sources == load_config(tmp_path / "parent.yaml").data.sources


def test_extends_errors(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="loops back"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: missing.yaml\n")
    with pytest.raises(ConfigError, match="missing.yaml' does not exist"):
        load_config(tmp_path / "c.yaml")


def test_shipped_fp8_recipe_is_the_demo_plus_fp8():
    from pathlib import Path

    from trtspec.config import dump_config

    root = Path(__file__).resolve().parents[2] / "build_configs"
    demo, fp8 = dump_config(load_config(root / "smollm2-135m-eagle3.yaml")), dump_config(load_config(root / "smollm2-135m-eagle3-fp8.yaml"))
    assert fp8["quantize"]["format"] == "fp8" and demo["quantize"]["format"] == "none"
    assert all(fp8[k] == demo[k] for k in ("model", "data", "convert", "train"))


def test_yaml_syntax_error_has_line_number(tmp_path):
    with pytest.raises(ConfigError, match="line 2"):
        load_config(write(tmp_path, "seed: 1\n\tdata: x\n"))


def test_missing_file_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_scientific_notation_and_int_for_float(tmp_path):
    cfg = load_config(write(tmp_path, "data: {sources: [{kind: jsonl, path: x}]}\ntrain: {lr: 5e-4, epochs: 2}\n"))
    assert cfg.train.lr == 5e-4 and cfg.train.epochs == 2.0


def test_overrides_apply_and_validate(tmp_path):
    p = write(tmp_path, MINIMAL)
    cfg = load_config(p, ["train.lr=1e-4", "convert.aux_layers=[1, 2, 3]", "quantize.block_size=null"])
    assert cfg.train.lr == 1e-4 and cfg.convert.aux_layers == [1, 2, 3] and cfg.quantize.block_size is None
    assert load_config(p, ["quantize.format=none", "quantize.kv_cache=none"]).quantize.format == "none"
    with pytest.raises(ConfigError, match="train.nope"):
        load_config(p, ["train.nope=1"])
    with pytest.raises(ConfigError, match="no '='"):
        load_config(p, ["train.lr"])


def test_validate_section_alias():
    cfg = config_from_dict({**MINIMAL, "validate": {"min_speedup": 1.5}})
    assert cfg.validate_.min_speedup == 1.5 and cfg.section("validate")["min_speedup"] == 1.5


@given(
    key=st.lists(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), min_size=1, max_size=3),
    value=st.one_of(st.integers(), st.booleans(), st.floats(allow_nan=False, allow_infinity=False), st.from_regex(r"[a-z]{1,6}", fullmatch=True)),
)
def test_parse_override_roundtrips(key, value):
    text = ".".join(key) + "=" + (yaml.safe_dump(value).strip().removesuffix("...").strip())
    parts, parsed = parse_override(text)
    assert parts == key
    if isinstance(value, str):
        assert parsed == yaml.safe_load(value)
    else:
        assert parsed == value


@given(st.text(max_size=30))
def test_parse_override_never_crashes(text):
    try:
        parse_override(text)
    except ConfigError:
        pass


TRAIN_FIELDS = {k: f for k, f in BuildConfig.model_fields["train"].annotation.model_fields.items()
                if k not in ("states_engine", "states_endpoint")}  # keys, not sections


def values_for(annotation) -> st.SearchStrategy:
    """Values of the key's own type, in and out of its bounds, and of one wrong type: most draws reach its checks."""
    import typing

    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return st.sampled_from([*typing.get_args(annotation), "x"])
    kinds = args or [annotation]
    own = st.one_of(*[st.booleans() if k is bool else st.integers(-3, 3000) if k is int
                      else st.floats(-1, 1500, allow_nan=False) for k in kinds if k in (bool, int, float)])
    return st.one_of(own, st.none(), st.just("x"))


@given(st.dictionaries(st.sampled_from(sorted(TRAIN_FIELDS)), st.just(None), min_size=1, max_size=3).flatmap(
    lambda keys: st.fixed_dictionaries({k: values_for(TRAIN_FIELDS[k].annotation) for k in keys})))
def test_train_keys_are_kept_as_given_or_refused_by_name(extra):
    """Real train keys with values of every type: accepted, each reads back as given (an int for a float key: its
    value), or refused in one line that names a key of the draw."""
    try:
        cfg = config_from_dict({**MINIMAL, "train": extra})
    except ConfigError as e:
        assert any(f"train.{k}" in str(e) or k in str(e) for k in extra), str(e)
        return
    for k, v in extra.items():
        assert getattr(cfg.train, k) == v, (k, v, getattr(cfg.train, k))


def test_apply_overrides_refuses_setting_inside_a_value():
    with pytest.raises(ConfigError, match="not a section"):
        apply_overrides({"seed": 1}, ["seed.x=2"])


def test_relative_model_paths_are_relative_to_the_yaml(tmp_path):
    """model.source (and the other model keys) named by a relative path resolve against the YAML's folder, like
    every path in the config, whatever the working directory; demo: names and hub ids stay as they are."""
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "recipes").mkdir()
    raw = {**MINIMAL, "model": {"source": "../models/m"}, "validate": {"assistant_model": "org/small-model"}}
    cfg = load_config(write(tmp_path / "recipes", raw))
    assert cfg.model.source == str(tmp_path / "models" / "m")
    assert cfg.validate_.assistant_model == "org/small-model"
    assert load_config(write(tmp_path / "recipes", MINIMAL)).model.source.startswith("demo:")



def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    # PyYAML keeps the last of two equal keys: an appended section would replace the first one whole, unnoticed
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(MINIMAL) + "train:\n  lr: 0.1\n  epochs: 2\n  lr: 0.2\n")
    with pytest.raises(ConfigError, match=r"key 'lr' is given twice in one mapping \(lines \d+ and \d+\)"):
        load_config(tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(MINIMAL) + "train:\n  lr: 0.1\n  epochs: 2\n")
    assert load_config(tmp_path / "d.yaml").train.lr == 0.1
    (tmp_path / "e.yaml").write_text("seed: 1\n? [a, b]\n: 1\n")  # a key no mapping can hold: YAML's own error
    with pytest.raises(ConfigError, match="YAML syntax error at line 2, column 3: found unhashable key"):
        load_config(tmp_path / "e.yaml")



def test_a_config_saved_as_utf16_with_its_mark_is_read(tmp_path):
    # Windows PowerShell 5 writes UTF-16 with a byte-order mark; it was refused as "not a text file"
    (tmp_path / "c.yaml").write_bytes((yaml.safe_dump({**MINIMAL, "train": {"lr": 0.01}}) + "# Größe\n").encode("utf-16"))
    assert load_config(tmp_path / "c.yaml").train.lr == 0.01
