"""bench/scaling.py --smoke: points of the FM's NE against compute, and the fit."""

from __future__ import annotations

from tests.bench._smoke import benches, cases, smoke


def test_scaling_prints_points_and_the_fit(tmp_path) -> None:
    plot = tmp_path / "scaling.png"
    lines = smoke("scaling", "--plot", str(plot))
    assert benches(lines) == {"scaling.fm"}
    assert any(c.startswith("fit") for c in cases(lines, "scaling.fm"))
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
