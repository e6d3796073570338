"""Params: the params.yaml files laid over each other, dotted overrides, validated.

The library never opens params.yaml (lrm.config types and checks the values); stages and
flows load it here, once per run, and pass the validated `ParamsConfig` on.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from lrm.config import ParamsConfig, from_dict
from lrm.errors import ConfigError

PARAMS = Path("params.yaml")
log = logging.getLogger("lrm")


class ParamsLoader(yaml.SafeLoader):
    """PyYAML's safe loader, with YAML 1.2's floats and no duplicate keys.

    PyYAML reads YAML 1.1, where `1e-3` (no dot) is a string: `train.lr: 1e-3` was
    "expected float, got '1e-3'", though DVC (ruamel, YAML 1.2) reads it as the number. A
    key given twice in one mapping (two `train:` sections) silently kept the later one.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark.line)
            except TypeError:  # an unhashable key: the base class says so
                continue
            if first != key_node.start_mark.line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice (first on line {first + 1})",
                    key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


ParamsLoader.add_implicit_resolver(  # 1e-3, 5E+2: floats without a dot (YAML 1.2)
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def load_yaml(text: str) -> Any:
    """A params file's (or a params option's) YAML text, read by ParamsLoader."""
    return yaml.load(text, Loader=ParamsLoader)  # noqa: S506 (a SafeLoader)


def _where(e: yaml.YAMLError) -> str:
    """", line L, column C" of a parse error (PyYAML counts from 0)."""
    mark = getattr(e, "problem_mark", None)
    return f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _problem(e: yaml.YAMLError) -> str:
    """What is wrong (PyYAML's first line is only the context: "while parsing a flow
    sequence")."""
    return getattr(e, "problem", None) or str(e).splitlines()[0]


def read_params_file(path: Path, what: str = "params") -> dict[str, Any]:
    """One params YAML file (or another YAML mapping: `what` names its kind) as a mapping
    (exit-2 errors name the file)."""
    try:
        data = load_yaml(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the {what} file ({e})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}{_where(e)}: not valid YAML: {_problem(e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        of = "sections" if what == "params" else "keys"
        raise ConfigError(f"{path}: expected a mapping of {of} at the top level")
    return data


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`top` laid over `base`, mappings merged key by key (a later params file wins)."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) \
            else v
    return out


def _set_dotted(d: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for p in parents:
        nxt = d.get(p)
        if not isinstance(nxt, dict):
            nxt = d[p] = {}
        d = nxt
    d[last] = value


def load_params(files: Sequence[Path] | None = None,
                overrides: Mapping[str, Any] | None = None,
                origin: Mapping[str, str] | None = None) -> ParamsConfig:
    """The validated params: `files` laid over each other, then dotted `overrides` (flags,
    or where `origin` names another source for a key: a mapping file's "FILE: key").

    files None: ./params.yaml when present, else the built-in defaults (said in a log
    line). A named file that does not exist, an unknown section or key, or a bad value is
    a ConfigError naming the file and the key.
    """
    if files is None:
        files = [PARAMS] if PARAMS.exists() else []
        if not files:
            log.info("no %s here: using the built-in defaults", PARAMS)
    data: dict[str, Any] = {}
    for f in files:
        data = _merge(data, read_params_file(f))
    where = ", ".join(str(f) for f in files) or "params"
    known = [f.name for f in dataclasses.fields(ParamsConfig)]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown section(s) {unknown}; known sections: {known}")
    for key, value in (overrides or {}).items():
        _set_dotted(data, key, value)
    try:
        return from_dict(ParamsConfig, data, "")
    except ConfigError as e:  # "params.yaml: train.batch_size: must be >= 1"
        msg = str(e).lstrip(".: ")
        named = _keys(msg.split(": ", 1)[0])  # an item's or entry's key is its option's
        given = [k for k in (overrides or {})  # (tune.space.lr[0] is --tune.space.lr's)
                 if any(h == k or h.startswith((f"{k}.", f"{k}[")) for h in named)]
        if given:  # a value from the command line (or a mapping file), not the file: say so
            names = [(origin or {}).get(k, f"--{k}") for k in given]
            where = f"{', '.join(names)} (over {where})"
        raise ConfigError(f"{where}: {msg}") from None


def _keys(head: str) -> list[str]:
    """The dotted keys an error's head names: train.lr, or train.lr/embedding_lr (a check
    of two fields)."""
    section, _, fields = head.rpartition(".")
    return [f"{section}.{f}" if section else f for f in fields.split("/")]


