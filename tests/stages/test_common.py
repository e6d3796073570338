"""The stage framework: CLI options derived from the configs, params loading, the runner."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
from typer.testing import CliRunner

import stages._common as common
from flows.dag import STAGES
from lrm.config import ParamsConfig
from lrm.errors import ConfigError, LrmError
from stages._common import Arg, Stage, _options, app, execute, load_params

# values that pass validation and differ from the built-in default, for str keys
STR_VALUES = {"device": "cpu", "seq_pooling": "sum", "adapter_context": "dense+features",
              "recipe": "rowwise", "backend": "scaled_mm", "quantize": "int8",
              "days": "one", "compute_device": "cuda", "planner": "greedy",
              "format": "csv", "time_unit": "ms", "history_order": "newest_first",
              "session_gap": "30m", "evaluate.days": "1..2"}
MAPPING_VALUES = {"students.models": "{x: {embedding_dim: 4}}",
                  "students.variants": "{v: {distill: false}}",
                  "model.tables.shared": "{user_history: ad_id}"}


def _sample(key: str, tp: object, default: object) -> tuple[str | None, list[str]]:
    """(option value text, or None for a flag; the words to pass)."""
    name = key.rsplit(".", 1)[-1]
    origin = typing.get_origin(tp)
    if tp is bool:
        return None, [f"--{key}" if not default else f"--no-{key}"]
    if tp is int:
        return str((default or 0) + 1), []
    if tp == int | str and default == "auto":  # a count, or "auto"
        return "3", []
    if tp is float:
        return str(default * 0.9 if default else 0.1), []
    if tp is str:
        return STR_VALUES.get(key, STR_VALUES.get(name, "x")), []
    if origin is list:
        inner = typing.get_args(tp)[0]
        return ("a.tsv,b.tsv" if inner is str else "1,2"), []
    if origin is dict:
        return MAPPING_VALUES[key], []
    raise AssertionError(f"no sample for {key}: {tp}")


def _capture(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Stage, dict, ParamsConfig]]:
    seen: list[tuple[Stage, dict, ParamsConfig]] = []
    monkeypatch.setattr(common, "execute", lambda st, args, params, **kw: seen.append(
        (st, args, params)) or {})
    return seen


def _base_args(stage: Stage) -> list[str]:
    need = {"train": ["--model", "student"], "evaluate": ["--model-dir", "m"]}
    return need.get(stage.name, [])


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_config_option_reaches_the_params_the_stage_runs_with(name, monkeypatch,
                                                                    tmp_path):
    """Each `--section.key` lands at its key: none can be silently dropped."""
    monkeypatch.chdir(tmp_path)  # no params.yaml here: the built-in defaults
    stage = STAGES[name]
    seen = _capture(monkeypatch)
    defaults = ParamsConfig()
    opts, names = _options(stage)
    assert opts or not stage.reads
    for o in opts:
        default = defaults.get(o.key)
        text, flag = _sample(o.key, o.type, default)
        words = [*(flag or [names[o.key][0], text])]
        argv = ([stage.group] if stage.group else []) + _base_args(stage) + words
        r = CliRunner().invoke(app(stage), argv)
        assert r.exit_code == 0, (o.key, r.output, r.stderr)
        got = seen[-1][2].get(o.key)
        assert got != default, f"{names[o.key][0]} did not reach {o.key}"


@pytest.mark.parametrize("name", ["train", "generate", "evaluate"])
def test_an_option_no_config_has_does_not_exist(name):
    stage = STAGES[name]
    r = CliRunner().invoke(app(stage), [*_base_args(stage), f"--{stage.name}.bogus", "1"])
    assert r.exit_code == 2 and "No such option" in r.output + r.stderr


def test_short_options_and_old_names_still_work(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    seen = _capture(monkeypatch)
    r = CliRunner().invoke(app(STAGES["train"]), [
        "--model", "teacher", "--lr", "0.5", "--weight-decay", "0.25", "--days", "0,1",
        "--eval-day", "2", "--no-dedup", "--checkpoint-every", "7"])
    assert r.exit_code == 0, r.output
    stage, args, p = seen[-1]
    assert args["kind"] == "teacher"
    assert (p.train.lr, p.train.weight_decay) == (0.5, 0.25)
    assert (p.split.days, p.split.eval_day) == ([0, 1], 2)
    assert p.loader.recd is False and p.checkpoint.every == 7
    configs = stage.configs(p, stage.complete(args))
    assert configs["model"] == p.model.teacher  # model.{kind}


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
    b.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="b.yaml: not valid YAML"):
        load_params([b])


def _toy_stage(tmp_path: Path, calls: list) -> Stage:
    def run(*, src: Path, out: Path, metrics: Path | None = None) -> dict:
        calls.append((src, out))
        out.mkdir()
        return {"n": 1}

    return Stage(name="toy", run=run, reads={},
                 args={"src": Arg("--in", "in", "in"), "out": Arg("--out", "out", "out"),
                       "metrics": Arg("--metrics", "m", "metrics")})


@pytest.mark.parametrize("src, out", [("d", "d"), ("d", "d/out"), ("d/inner", "d")])
def test_an_output_overlapping_an_input_is_refused_before_anything_runs(tmp_path, src, out):
    (tmp_path / "d" / "inner").mkdir(parents=True)
    calls: list = []
    with pytest.raises(LrmError, match="input") as err:
        execute(_toy_stage(tmp_path, calls), {"src": tmp_path / src, "out": tmp_path / out},
                ParamsConfig())
    assert calls == [] and "\n" not in str(err.value)


def test_the_runner_writes_the_metrics_the_run_returns(tmp_path):
    calls: list = []
    (tmp_path / "src").mkdir()
    m = execute(_toy_stage(tmp_path, calls), {"src": tmp_path / "src", "out": tmp_path / "o",
                                              "metrics": tmp_path / "m" / "toy.json"},
                ParamsConfig())
    assert m == {"n": 1} and (tmp_path / "m" / "toy.json").read_text().strip().startswith("{")
    assert dataclasses.is_dataclass(ParamsConfig())
