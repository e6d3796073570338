"""Params: files laid over each other, dotted overrides, every error naming the file (or
the option that gave the bad value)."""

from __future__ import annotations

import pytest

from lrm.errors import ConfigError
from stagekit import load_params


def test_params_files_are_laid_over_each_other_and_checked(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("train: {lr: 0.5, batch_size: 64}\n")
    b.write_text("train: {lr: 0.25}\n")
    p = load_params([a, b], {"train.steps": 3})
    assert (p.train.lr, p.train.batch_size, p.train.steps) == (0.25, 64, 3)
    with pytest.raises(ConfigError, match="nope.yaml: params file not found"):
        load_params([tmp_path / "nope.yaml"])
    b.write_text("trian: {lr: 0.25}\n")
    with pytest.raises(ConfigError, match=r"b.yaml: unknown section\(s\) \['trian'\]"):
        load_params([a, b])
    b.write_text("train: {lr: -1}\n")
    with pytest.raises(ConfigError, match=r"b.yaml: train.lr/embedding_lr: must be > 0"):
        load_params([a, b])
    with pytest.raises(ConfigError, match=r"^/\S+/a.yaml, \S+/b.yaml: train.lr/"):
        load_params([a, b], {"train.steps": 3})  # an override elsewhere: the file's fault
    b.write_text("train: {lr: 0.25}\n")  # a bad value given on the command line is named so
    with pytest.raises(ConfigError, match=r"^--evaluate.days \(over \S+/a.yaml, \S+/b.yaml\): "
                                          r"evaluate.days: '5..3': the first day comes after"):
        load_params([a, b], {"evaluate.days": "5..3"})
    with pytest.raises(ConfigError, match=r"^--train.embedding_lr \(over \S+/a.yaml, \S+/b.yaml\): "
                                          r"train.lr/embedding_lr: must be > 0"):
        load_params([a, b], {"train.embedding_lr": -1.0})
    # an item of a list option (it blamed the files: "a.yaml, b.yaml: tune.space.lr[0]")
    with pytest.raises(ConfigError, match=r"^--tune.space.lr \(over \S+/a.yaml, \S+/b.yaml\): "
                                          r"tune.space.lr\[0\]: expected float, got 'abc'"):
        load_params([a, b], {"tune.space.lr": ["abc", 0.1]})
    b.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="b.yaml, line 2, column 1: not valid YAML: "
                                          "expected ',' or ']', but got '<stream end>'"):
        load_params([b])  # (was the context alone: "while parsing a flow sequence")


def test_floats_without_a_dot_are_numbers_and_a_key_given_twice_is_refused(tmp_path):
    """The ops probe: PyYAML (YAML 1.1) read `lr: 1e-3` as the string '1e-3' ("expected
    float"), where DVC reads the number; a second `train:` section silently replaced the
    first. Red with yaml.safe_load back in read_params_file."""
    f = tmp_path / "p.yaml"
    f.write_text("train: {lr: 1e-3, steps: 2e1}\ntune:\n  space: {lr: [1e-4, 5E-2]}\n")
    p = load_params([f])
    assert (p.train.lr, p.train.steps, p.tune.space.lr) == (0.001, 20, [1e-4, 5e-2])
    f.write_text("train: {lr: '1e-3'}\n")  # quoted: the string it says it is
    with pytest.raises(ConfigError, match="train.lr: expected float, got '1e-3'"):
        load_params([f])
    f.write_text("train:\n  steps: 3\nmodel: {}\ntrain:\n  lr: 0.5\n")
    with pytest.raises(ConfigError, match=r"p.yaml, line 4, column 1: not valid YAML: key "
                                          r"'train' given twice \(first on line 1\)"):
        load_params([f])
