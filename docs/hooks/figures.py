"""MkDocs hook: every figure of the site, drawn at build time by the code that measures it.

* `figures/dag-dvc.svg`, `dag-criteo.svg`, `dag-logs.svg`: each pipeline as DVC sees it
  (`dvc dag` of the dvc.yaml files that flows/dvc_yaml.py renders from the tables of
  flows/dag.py: `make dag`), each stage with its first output.
* the results' figures, from the records in docs/records/ (small CSV / JSON-lines files
  written by the runs that measured them; `python docs/hooks/record.py` writes them):
  `exfm_ne` (the `student` stage's plots/exfm_ne.csv of a `make run`, drawn by lrm.plots,
  as the stage draws it), `scaling` (the JSON lines of `python bench/scaling.py`, drawn by
  bench/scaling.py's own figure), `stream` (the NE of each vertical model's @champion and
  @challenger per day of a stream run, from its day records, drawn by lrm.plots).

No picture is committed: a fresh clone's `make docs` draws them all. A page places a figure
with a line `[[figure NAME]]`: the picture and, under it, the record's date, commit, machine
and command. A page placing a figure no code draws or no run recorded, a record that does not
parse, or a figure that cannot be drawn fails the build.
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "docs" / "records"
FIGURES = "figures"
MARKER = re.compile(r"^\[\[figure (?P<name>[\w-]+)\]\]$", re.M)
PROVENANCE = ("date", "commit", "machine", "command")



# -- records ---------------------------------------------------------------------------

def read_record(path: Path) -> tuple[dict[str, str], list[str]]:
    """A record's provenance (its leading `# key: value` lines) and its data lines."""
    meta: dict[str, str] = {}
    lines = path.read_text().splitlines()
    body = 0
    for body, line in enumerate(lines):  # noqa: B007
        if not line.startswith("#"):
            break
        key, _, value = line[1:].partition(":")
        meta[key.strip()] = value.strip()
    else:
        body = len(lines)
    missing = [k for k in PROVENANCE if not meta.get(k)]
    if missing:
        raise PluginError(f"{path}: no {', '.join(missing)} in its header "
                          "(# key: value lines)")
    return meta, lines[body:]


def _number(v: str) -> Any:
    if v == "":
        return None
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return v


def csv_rows(lines: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    rows = [{k: _number(v) for k, v in r.items()} for r in reader]
    return list(reader.fieldnames or []), rows


# -- the figures -----------------------------------------------------------------------

def _svg(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", bbox_inches="tight")
        return buf.getvalue()
    finally:
        plt.close(fig)


def lines_figure(lines: list[str], title: str) -> Any:
    """A CSV of lrm.plots' shape (x, then one column per line) as lrm.plots draws it."""
    from lrm import plots

    columns, rows = csv_rows(lines)
    return plots.figure(rows, columns[0], {plots.NE: columns[1:]}, title)


def exfm_ne(lines: list[str]) -> Any:
    return lines_figure(lines, "ExFM: NE per day (each vertical model's variants)")


def stream(lines: list[str]) -> Any:
    return lines_figure(lines, "The stream: each vertical model's @champion and @challenger")


def scaling(lines: list[str]) -> Any:
    """bench/scaling.py's points and the law fitted to their frontier, as it draws them."""
    if str(ROOT) not in sys.path:  # bench/ is a package of the repo, not of the install
        sys.path.insert(0, str(ROOT))
    from bench import scaling as bench

    recs = [json.loads(line) for line in lines if line.strip()]
    points = []
    for r in recs:
        m = re.fullmatch(r"(?P<shape>\S+) x (?P<days>\d+)d", r.get("case", ""))
        if r.get("bench") == bench.BENCH and m:
            points.append({"shape": m["shape"], "days": int(m["days"]), "ne": r["candidate"],
                           "compute": r["compute"],
                           "flops_per_example": r["flops_per_example"]})
    if not points:
        raise PluginError("the scaling record holds no point (bench scaling.fm lines)")
    import numpy as np

    front = bench.frontier(points)
    with warnings.catch_warnings():  # scipy on a short frontier: no covariance, said as INFO
        warnings.simplefilter("ignore")
        law = bench.fit_law(np.array([p["compute"] for p in front]),
                            np.array([p["ne"] for p in front]))
    return bench.figure(points, law, (front[0]["compute"], front[-1]["compute"]))


def dvc_dags() -> dict[str, Any]:
    """Each dvc.yaml's stages and the edges `dvc dag` finds between them (networkx graphs, by
    the dvc.yaml's path)."""
    import networkx as nx

    proc = subprocess.run([sys.executable, "-m", "dvc", "dag", "--mermaid"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise PluginError(f"dvc dag failed:\n{proc.stderr}")
    names = dict(re.findall(r'^\s*(node\d+)\["([^"]+)"\]', proc.stdout, re.M))
    graphs: dict[str, nx.DiGraph] = {}
    for name in names.values():
        dvc_file, _, stage = name.rpartition(":")
        graphs.setdefault(dvc_file or "dvc.yaml", nx.DiGraph()).add_node(stage)
    for a, b in re.findall(r"^\s*(node\d+)-->(node\d+)", proc.stdout, re.M):
        (fa, _, sa), (_, _, sb) = names[a].rpartition(":"), names[b].rpartition(":")
        graphs[fa or "dvc.yaml"].add_edge(sa, sb)
    return graphs


def pipeline_figure(dvc_file: str, full: Any) -> Any:
    """One pipeline left to right: a box per stage (its name and first output), an arrow
    where a stage reads another's output, but none that a longer path already implies (the
    transitive reduction: `dvc dag` lists them all)."""
    import matplotlib.pyplot as plt
    import networkx as nx
    import yaml

    g = nx.transitive_reduction(full)
    stages = (yaml.safe_load((ROOT / dvc_file).read_text()) or {})["stages"]
    cols = list(nx.topological_generations(g))
    pos: dict[str, tuple[float, float]] = {}
    for x, col in enumerate(cols):
        def height(n: str) -> float:  # a column in its inputs' order: fewer crossings
            ys = [pos[m][1] for m in g.predecessors(n)]
            return -sum(ys) / len(ys) if ys else 0.0
        col = sorted(col, key=lambda n: (height(n), n))
        pos |= {n: (x, (len(col) - 1) / 2 - y) for y, n in enumerate(col)}
    tall = max(len(c) for c in cols)
    fig, ax = plt.subplots(figsize=(1.75 * len(cols), 0.3 + 0.75 * tall))
    boxes = {}
    for n, (x, y) in pos.items():
        outs = stages.get(n, {}).get("outs") or [""]
        first = outs[0] if isinstance(outs[0], str) else next(iter(outs[0]))
        boxes[n] = ax.text(x, y, f"{n}\n{first}", ha="center", va="center", fontsize=7,
                           bbox=dict(boxstyle="round,pad=0.3", fc="#e8eef7", ec="#4a6fa5"))
    for a, b in g.edges:
        skip = pos[b][0] - pos[a][0] > 1  # an edge past a column bends around it
        ax.annotate("", xy=pos[b], xytext=pos[a],
                    arrowprops=dict(arrowstyle="-|>", color="#666666", lw=0.7,
                                    patchA=boxes[a].get_bbox_patch(),
                                    patchB=boxes[b].get_bbox_patch(),
                                    connectionstyle=f"arc3,rad={0.25 if skip else 0.0}"))
    t = max(abs(y) for _, y in pos.values())
    ax.set_xlim(-0.55, len(cols) - 0.45)
    ax.set_ylim(-t - 0.5, t + 0.5)
    ax.axis("off")
    return fig


def pipeline_name(dvc_file: str) -> str:
    """figures/dag-NAME.svg: `dvc` for the root dvc.yaml, else the pipeline's folder."""
    parent = Path(dvc_file).parent
    return "dvc" if parent == Path(".") else parent.name


DRAW: dict[str, Callable[[list[str]], Any]] = {"exfm_ne": exfm_ne, "scaling": scaling,
                                                "stream": stream}


def record_path(name: str) -> Path:
    found = sorted(RECORDS.glob(f"{name}.*"))
    found = [p for p in found if p.suffix in (".csv", ".jsonl")]
    if len(found) != 1:
        raise PluginError(f"figure {name}: expected one record docs/records/{name}.csv or "
                          f".jsonl, found {[p.name for p in found]}")
    return found[0]


# -- the hook --------------------------------------------------------------------------

def on_files(files: Files, config: Any) -> Files:
    import matplotlib

    matplotlib.use("Agg")  # no display, no network
    for dvc_file, graph in dvc_dags().items():
        files.append(File.generated(config, f"{FIGURES}/dag-{pipeline_name(dvc_file)}.svg",
                                    content=_svg(pipeline_figure(dvc_file, graph))))
    for name, draw in DRAW.items():
        if not any(RECORDS.glob(f"{name}.*")):
            continue  # no run recorded yet: a page that places it fails (on_page_markdown)
        _, lines = read_record(record_path(name))
        try:
            fig = draw(lines)
        except PluginError:
            raise
        except Exception as e:  # a record the figure cannot be drawn from
            raise PluginError(f"figure {name}: {type(e).__name__}: {e}") from e
        files.append(File.generated(config, f"{FIGURES}/{name}.svg", content=_svg(fig)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """`[[figure NAME]]` -> the picture and its provenance, linked relative to the page."""
    depth = page.file.src_uri.count("/")
    up = "../" * depth

    def figure(m: re.Match[str]) -> str:
        name = m["name"]
        if name not in DRAW:
            raise PluginError(f"{page.file.src_uri}: [[figure {name}]]: no such figure "
                              f"(known: {', '.join(DRAW)})")
        path = record_path(name)
        meta, _ = read_record(path)
        rel = path.relative_to(RECORDS.parent)
        note = f" ({meta['note']})" if meta.get("note") else ""
        return (f"![{name}]({up}{FIGURES}/{name}.svg)\n\n"
                f"*Measured {meta['date']} at commit `{meta['commit']}` on {meta['machine']}"
                f"{note}: `{meta['command']}`. Drawn from [its record]({up}{rel.as_posix()}).*")

    return MARKER.sub(figure, markdown)
