"""A stage's command line: one option per config field, each reaching its params key."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
from typer.testing import CliRunner

import stagekit.cli as cli
from flows.dag import STAGES
from lrm.config import ParamsConfig
from lrm.errors import ConfigError
from stagekit import Stage
from stagekit.cli import _options, app

# values that pass validation and differ from the built-in default, for str keys
STR_VALUES = {"device": "cpu", "seq_pooling": "sum", "adapter_context": "dense+features",
              "recipe": "rowwise", "backend": "scaled_mm", "quantize": "int8",
              "days": "one", "compute_device": "cuda", "planner": "greedy",
              "format": "csv", "time_unit": "ms", "history_order": "newest_first",
              "session_gap": "30m", "evaluate.days": "1..2", "norm": "layer"}
LIST_VALUES = {"tune.space.embedding_dim": "4,8"}  # a list whose items must pass a check
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
        if dataclasses.is_dataclass(inner):  # a list of mappings, in YAML (the verticals)
            return "[{name: a}]", []
        return LIST_VALUES.get(key, "a.tsv,b.tsv" if inner is str else "1,2"), []
    if origin is dict:
        return MAPPING_VALUES[key], []
    raise AssertionError(f"no sample for {key}: {tp}")


def _capture(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Stage, dict, ParamsConfig]]:
    seen: list[tuple[Stage, dict, ParamsConfig]] = []
    monkeypatch.setattr(cli, "execute", lambda st, args, params, **kw: seen.append(
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


def test_every_option_a_stage_shows_says_what_it_is():
    """`--help` of every stage: each config option has a help text (its field's trailing
    comment in lrm/config.py; a comment above the field is not one)."""
    bare = sorted({o.key for st in STAGES.values() for o in _options(st)[0] if not o.help})
    assert not bare, f"options with no help: {bare}"


@pytest.mark.parametrize("name", ["generate", "dedup", "ingest_logs", "teacher"])
def test_the_help_says_where_a_run_with_another_out_puts_its_metrics(name):
    """`--help` gives the metrics' default and where a run with another --out puts them:
    the name `Stage.beside_outputs` gives them."""
    stage = STAGES[name]
    out_key = next(k for k, a in stage.args.items() if a.flag == "--out")
    moved = Path(stage.beside_outputs({out_key: "/x/o"})["metrics"])
    r = CliRunner().invoke(app(stage), [*([stage.group] if stage.group else []), "--help"],
                           terminal_width=400)
    assert r.exit_code == 0, r.output
    help_text = " ".join(r.output.split())
    assert moved.parent == Path("/x") and moved.name.startswith("o.")
    assert f"beside it, OUT.{moved.name[2:]}" in help_text, help_text


def test_an_output_file_is_never_said_to_move_beside_itself():
    """`lrm evaluate --out X.json` writes X.json: its help says no "beside it"."""
    r = CliRunner().invoke(app(STAGES["evaluate"]), ["--help"], terminal_width=400)
    text = " ".join(r.output.replace("│", " ").split())
    entry = text[text.index("--out "):text.index("--name ")]  # the --out option's help
    assert "metrics/eval.json" in entry and "beside" not in entry, entry


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


@pytest.mark.parametrize("name", sorted(STAGES))
def test_a_missing_argument_is_named_not_a_crash(name):
    """`lrm train` without --model crashed with KeyError 'kind' (its default paths are built
    from it). Planted bug that turns this red (tried): the KeyError raised again."""
    stage = STAGES[name]
    try:
        stage.complete({})
    except ConfigError as e:
        assert str(e).startswith(f"{stage.name}: missing "), str(e)
        if name == "train":
            assert str(e) == "train: missing --model"
    else:
        assert name != "train", "lrm train ran without --model"


def test_a_stage_whose_default_path_names_no_argument_raises_its_bug():
    """A derived default built from a name that is no argument is the stage's own bug: it
    raises, not "missing"."""
    stage = dataclasses.replace(STAGES["train"], derived={"out": "models/{kidn}"})
    with pytest.raises(KeyError, match="kidn"):
        stage.complete({"kind": "student"})
