"""Plots that read offline: a CSV for `dvc plots` and a PNG of the same lines beside it.

`dvc plots show` renders vega from a CDN, which is blank without internet; the PNG
(matplotlib, no network) is listed in dvc.yaml too, so DVC's page shows it either way.
"""

from __future__ import annotations

import csv
import io as _io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lrm import io


def write_lines(rows: Sequence[Mapping[str, Any]], x: str, ys: Sequence[str], path: Path, *,
                title: str = "", ylabel: str = "", stage: str | None = None,
                force: bool = False) -> Path:
    """Write `rows` as CSV to `path` (columns x, *ys) and their lines as `path`.png."""
    path = Path(path)
    ys = [y for y in ys if any(y in r for r in rows)]
    buf = _io.StringIO()
    w = csv.DictWriter(buf, fieldnames=[x, *ys], lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        if any(r.get(y) is not None for y in ys):
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    io.write_text(buf.getvalue(), path, stage=stage, force=force)
    png = path.with_suffix(".png")
    io.write_bytes(_png(rows, x, ys, title, ylabel), png, stage=stage, force=force)
    return png


def _png(rows: Sequence[Mapping[str, Any]], x: str, ys: Sequence[str], title: str,
         ylabel: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")  # no display, no network
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    try:
        for y in ys:
            pts = [(r[x], r[y]) for r in rows
                   if r.get(y) is not None and not (isinstance(r[y], float) and math.isnan(r[y]))]
            if pts:
                xs, vs = zip(*pts, strict=True)
                ax.plot(xs, vs, marker="o" if len(pts) < 30 else None, markersize=3, label=y)
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ys:
            ax.legend(fontsize=7)
        buf = _io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        return buf.getvalue()
    finally:
        plt.close(fig)
