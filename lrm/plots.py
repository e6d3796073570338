"""Plots that read offline: a CSV for `dvc plots` and a PNG of the same lines beside it.

`dvc plots show` renders vega from a CDN, which is blank without internet; the PNG
(matplotlib, no network) is listed in dvc.yaml too, so DVC's page shows it either way.

Each quantity gets an axis of its own, labelled (a loss of ~0.13 and an NE of ~0.95 on one
axis both look flat), over a shared x axis whose ticks are whole numbers when x is (days,
steps). Lines named GROUP/NAME (a student and its variant) take their colour from NAME and
their dash from GROUP, so a legend of many lines still reads.
"""

from __future__ import annotations

import csv
import io as _io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lrm import io

DASHES = ("-", "--", ":", "-.")
NE = "NE (lower is better)"
# a training run's history (lrm.train: per logged step): the loss and the NEs apart
TRAINING = {"loss (log loss)": ["loss"], NE: ["ne_window", "eval_ne"]}


def write_lines(rows: Sequence[Mapping[str, Any]], x: str, panels: Mapping[str, Sequence[str]],
                path: Path, *, title: str = "", stage: str | None = None,
                force: bool = False) -> Path:
    """Write `rows` as CSV to `path` (columns x and every panel's) and their lines as
    `path`.png: one axis per panel (its label -> its columns)."""
    path = Path(path)
    panels = {label: [y for y in ys if any(y in r for r in rows)]
              for label, ys in panels.items()}
    panels = {label: ys for label, ys in panels.items() if ys}
    ys = [y for cols in panels.values() for y in cols]
    buf = _io.StringIO()
    w = csv.DictWriter(buf, fieldnames=[x, *ys], lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        if any(r.get(y) is not None for y in ys):
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    io.write_text(buf.getvalue(), path, stage=stage, force=force)
    png = path.with_suffix(".png")
    io.write_bytes(_png(rows, x, panels, title), png, stage=stage, force=force)
    return png


def _styles(names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Colour and dash per line: GROUP/NAME lines by NAME's colour and GROUP's dash."""
    import matplotlib

    colours = matplotlib.colormaps["tab10"].colors
    keys = list(dict.fromkeys(n.rsplit("/", 1)[-1] for n in names))
    groups = list(dict.fromkeys(n.rsplit("/", 1)[0] for n in names if "/" in n))
    out = {}
    for n in names:
        style: dict[str, Any] = {"color": colours[keys.index(n.rsplit("/", 1)[-1]) % 10]}
        if "/" in n:
            style["linestyle"] = DASHES[groups.index(n.rsplit("/", 1)[0]) % len(DASHES)]
        out[n] = style
    return out


def figure(rows: Sequence[Mapping[str, Any]], x: str, panels: Mapping[str, Sequence[str]],
           title: str = "") -> Any:
    """The matplotlib Figure of the lines (`write_lines` saves it as the PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # no display, no network
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    n = max(len(panels), 1)
    fig, axes = plt.subplots(n, 1, figsize=(8, 2.6 * n + 0.6), dpi=100, sharex=True,
                             squeeze=False)
    styles = _styles([y for ys in panels.values() for y in ys])
    whole = all(isinstance(r.get(x), int) for r in rows)
    for ax, (label, ys) in zip(axes[:, 0], panels.items(), strict=False):
        for y in ys:
            pts = [(r[x], r[y]) for r in rows if r.get(y) is not None and
                   not (isinstance(r[y], float) and math.isnan(r[y]))]
            if pts:
                xs, vs = zip(*pts, strict=True)
                ax.plot(xs, vs, marker="o" if len(pts) < 30 else None, markersize=3,
                        label=y, **styles[y])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ys:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                      borderaxespad=0.0)
        if whole:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1, 0].set_xlabel(x)
    if title:
        axes[0, 0].set_title(title)
    return fig


def _png(rows: Sequence[Mapping[str, Any]], x: str, panels: Mapping[str, Sequence[str]],
         title: str) -> bytes:
    import matplotlib.pyplot as plt

    fig = figure(rows, x, panels, title)
    try:
        buf = _io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        return buf.getvalue()
    finally:
        plt.close(fig)
