"""bench/common.py: the line format, the machine it names, the smoke mode."""

from __future__ import annotations

import argparse
import json
import math
import os

import pytest
import torch

from bench import common
from bench.common import check_line, emit, machine


def _line(**over: object) -> dict[str, object]:
    rec: dict[str, object] = {"bench": "b", "case": "c", "unit": "s", "candidate": 1.0,
                              "baseline": 2.0, "ratio": 2.0, "better": "lower",
                              "machine": machine()}
    rec.update(over)
    return rec


def test_check_line_accepts_a_full_line_and_a_baseline_that_did_not_finish() -> None:
    check_line(_line())
    check_line(_line(baseline=None, ratio=None, baseline_outcome="timed out after 10 s"))


@pytest.mark.parametrize("bad", [
    {"machine": None}, {"machine": {"cpu": "x"}}, {"ratio": math.nan},
    {"candidate": math.inf}, {"candidate": None}, {"baseline": None}, {"better": "up"},
    {"case": ""}, {"ratio": True}, {"candidate": "1.0"}])
def test_check_line_rejects_what_a_reader_cannot_use(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        check_line(_line(**bad))
    missing = _line()
    del missing["unit"]
    with pytest.raises(ValueError, match="lacks"):
        check_line(missing)


def test_machine_names_the_cpu_its_isa_cores_torch_and_gpu() -> None:
    m = machine()
    assert m["torch"] == torch.__version__
    assert m["cores"] == len(os.sched_getaffinity(0))
    assert m["gpu"] is None if not torch.cuda.is_available() else m["gpu"]["name"]
    assert m["cpu"]
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next(x for x in f if x.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags here")
    # exactly the kernel-relevant extensions this CPU has, in ISA_FLAGS's order
    assert m["isa"] == [f for f in common.ISA_FLAGS if f in flags]
    assert m["torch_cpu_kernels"] == torch.backends.cpu.get_cpu_capability()


def test_every_line_names_the_machine_and_the_load(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(common.SMOKE_ENV, raising=False)
    rec = emit("b", "c", "rows/s", 10.0, 5.0, "higher")
    printed = json.loads(capsys.readouterr().out)
    assert printed == rec and rec["ratio"] == 2.0
    assert rec["machine"] == machine() and len(rec["load_avg"]) == 3
    assert "smoke" not in rec
    # a line that is not a result's a reader could use still prints outside smoke runs
    emit("b", "c", "rows/s", math.nan, 5.0, "higher")
    assert "NaN" in capsys.readouterr().out


def test_a_smoke_run_checks_its_lines(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(common.SMOKE_ENV, "1")
    assert emit("b", "c", "s", 1.0, 2.0, "lower")["smoke"] is True
    with pytest.raises(ValueError, match="candidate"):
        emit("b", "c", "s", math.nan, 2.0, "lower")
    assert capsys.readouterr().out.count("\n") == 1  # the bad line was not printed


def test_smoke_flag_implies_quick_and_reaches_child_processes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(common.SMOKE_ENV, raising=False)
    ap = argparse.ArgumentParser()
    common.add_mode_flags(ap)
    args = ap.parse_args([])
    assert common.use_mode(args) is False and not common.smoke()
    args = ap.parse_args(["--smoke"])
    assert common.use_mode(args) is True and args.quick
    assert os.environ[common.SMOKE_ENV] == "1"  # what a child process inherits
    with pytest.raises(SystemExit):
        ap.parse_args(["--smoke", "--quick"])
