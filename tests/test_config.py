"""Configs from params.yaml: unknown keys, wrong types and bad values fail with the key."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from lrm.config import (
    EvalConfig,
    GenerateConfig,
    IngestConfig,
    LoaderConfig,
    ParamsConfig,
    TrainConfig,
    TrainOverrides,
    from_dict,
    with_overrides,
)
from lrm.errors import ConfigError
from tests.conftest import REPO


def test_defaults_and_coercion():
    cfg = from_dict(GenerateConfig, {"users": 10, "base_ctr": 0.05, "mean_session_length": 3},
                    "generate")
    assert cfg.users == 10 and cfg.base_ctr == 0.05
    assert isinstance(cfg.mean_session_length, float)
    assert from_dict(IngestConfig, {"files": ["a", "b"]}, "ingest").files == ["a", "b"]


@pytest.mark.parametrize(
    "data, needle",
    [
        ({"userz": 1}, "unknown keys ['userz']"),
        ({"users": "many"}, "generate.users: expected int"),
        ({"users": 0}, "generate.users: must be >= 1"),
        ({"base_ctr": 0.9}, "generate.base_ctr"),
        ({"users": True}, "generate.users"),
    ],
)
def test_errors_name_the_key(data, needle):
    with pytest.raises(ConfigError, match=None) as e:
        from_dict(GenerateConfig, data, "generate")
    assert needle in str(e.value)


def test_loader_validation():
    with pytest.raises(ConfigError, match="loader.prefetch"):
        from_dict(LoaderConfig, {"prefetch": -1}, "loader")
    with pytest.raises(ConfigError, match=r"unknown keys \['batch_size'\]"):  # a removed knob
        from_dict(LoaderConfig, {"batch_size": 8}, "loader")


def _leaves(obj, prefix=""):
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _leaves(getattr(obj, f.name), f"{prefix}{f.name}.")
    else:
        yield prefix.rstrip("."), obj


def test_params_yaml_states_every_value_and_agrees_with_the_defaults():
    """One set of defaults: params.yaml holds every value a run uses, equal to lrm.config's
    built-in ones (so a library caller and a pipeline run train the same thing)."""
    from stagekit import load_params

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    from_file, built_in = load_params([REPO / "params.yaml"]), ParamsConfig()
    differ = [(k, a, b) for (k, a), (_, b) in zip(_leaves(from_file), _leaves(built_in),
                                                   strict=True) if a != b]
    assert not differ, f"params.yaml and lrm.config disagree: {differ}"
    for key, value in _leaves(built_in):
        if value is None and key.startswith(("teacher.train.", "students.train.")):
            continue  # an override left unset inherits `train`'s value
        node = raw
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"params.yaml does not state {key}"
            node = node[part]


def test_overrides_inherit_what_they_do_not_set():
    base = TrainConfig(lr=0.5, batch_size=64)
    over = from_dict(TrainOverrides, {"lr": 0.25}, "teacher.train")
    merged = with_overrides(base, over)
    assert (merged.lr, merged.batch_size) == (0.25, 64)
    with pytest.raises(ConfigError, match=r"teacher.train: unknown keys \['lrr'\]"):
        from_dict(TrainOverrides, {"lrr": 1}, "teacher.train")


def test_train_for_applies_each_kinds_overrides_once_and_names_their_section():
    """The one place a model's training values are resolved (stages and the stream take
    them from here). Plant: return `train` for every kind, or drop the section name."""
    p = from_dict(ParamsConfig, {"train": {"lr": 0.5, "batch_size": 64},
                                 "teacher": {"train": {"lr": 0.25}},
                                 "students": {"train": {"batch_size": 32}}}, "params")
    assert (p.train_for("student").lr, p.train_for("student").batch_size) == (0.5, 64)
    assert (p.train_for("teacher").lr, p.train_for("teacher").batch_size) == (0.25, 64)
    assert (p.train_for("students").lr, p.train_for("students").batch_size) == (0.5, 32)
    assert p.train.lr == 0.5  # `train` itself is left as it is
    bad = dataclasses.replace(p, students=dataclasses.replace(
        p.students, train=TrainOverrides(batch_size=0)))
    with pytest.raises(ConfigError, match=r"^students\.train\.batch_size"):
        bad.train_for("students")
    with pytest.raises(ConfigError, match="one of"):
        p.train_for("students-large")


def test_a_bootstrap_too_small_for_a_95_percent_interval_is_refused():
    """`--bootstrap 1` printed [x, x] as a "95%" interval. Red with the floor dropped."""
    for n in (1, 39):
        with pytest.raises(ConfigError, match=r"bootstrap: must be 0 \(no intervals\) or >= 40"):
            EvalConfig(bootstrap=n)
    assert EvalConfig(bootstrap=0).bootstrap == 0 and EvalConfig(bootstrap=40).bootstrap == 40


def test_student_sizes_and_variants_that_cannot_name_a_folder_or_model_are_refused():
    """A size or variant names checkpoint folders and registered models (VM/VARIANT,
    lrm-student-tab1-SIZE): 'a/b' or '..' would escape the folder. Red with the check
    dropped."""
    for key, bad in (("models", "a/b"), ("models", ".."), ("variants", "x y"),
                     ("variants", "-x")):
        with pytest.raises(ConfigError, match=rf"^params\.students\.{key}: names \[.*\] may hold"):
            from_dict(ParamsConfig, {"students": {key: {bad: {}}}}, "params")
    ok = from_dict(ParamsConfig, {"students": {"models": {"big.v2": {}}}}, "params")
    assert list(ok.students.models) == ["big.v2"]
