"""lrm.plots: one labelled axis per quantity (a loss of ~0.13 and an NE of ~0.95 are not on
one axis), whole-number ticks for days, and a legend whose lines tell students (dash) and
variants (colour) apart; the CSV beside the PNG keeps every column."""

from __future__ import annotations

import matplotlib.pyplot as plt

from lrm import plots

HISTORY = [{"step": s, "loss": 0.13 + 0.01 / s, "ne_window": 0.95 + 0.02 / s,
            **({"eval_ne": 0.96} if s % 4 == 0 else {})} for s in range(1, 13)]
VARIANTS = ("labels_only", "distill_serving", "aux_head", "aux_adapter")
DAYS = [{"day": d, "teacher": 0.93, **{f"{s}/{v}": 0.95 - 0.001 * i
                                       for s in ("small", "tiny")
                                       for i, v in enumerate(VARIANTS)}} for d in (4, 5, 6)]


def test_the_training_plot_puts_loss_and_ne_on_axes_of_their_own(tmp_path):
    fig = plots.figure(HISTORY, "step", plots.TRAINING)
    try:
        axes = fig.axes
        assert [a.get_ylabel() for a in axes] == list(plots.TRAINING)
        assert [[ln.get_label() for ln in a.get_lines()] for a in axes] == \
            [["loss"], ["ne_window", "eval_ne"]]
        lo, hi = axes[0].get_ylim()
        assert hi - lo < 0.1  # the loss fills its own axis, not one shared with NE ~0.95
    finally:
        plt.close(fig)
    png = plots.write_lines(HISTORY, "step", plots.TRAINING, tmp_path / "train.csv")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "train.csv").read_text().splitlines()[0] == "step,loss,ne_window,eval_ne"


def test_the_exfm_plot_has_whole_days_and_a_legend_that_reads():
    ys = [k for k in DAYS[0] if k != "day"]
    fig = plots.figure(DAYS, "day", {plots.NE: ys})
    try:
        (ax,) = fig.axes
        fig.canvas.draw()
        ticks = [t for t in ax.get_xticks() if 4 <= t <= 6]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        colour = {k: ln.get_color() for k, ln in lines.items()}
        dash = {k: ln.get_linestyle() for k, ln in lines.items()}
        for v in VARIANTS:  # a variant: one colour for both students, none shared
            assert colour[f"small/{v}"] == colour[f"tiny/{v}"]
        assert len({colour[f"small/{v}"] for v in VARIANTS} | {colour["teacher"]}) == 5
        for s in ("small", "tiny"):  # a student: one dash for its variants, not the other's
            assert len({dash[f"{s}/{v}"] for v in VARIANTS}) == 1
        assert dash["small/aux_head"] != dash["tiny/aux_head"]
        assert ax.get_legend() is not None and ax.get_ylabel() == plots.NE
    finally:
        plt.close(fig)
