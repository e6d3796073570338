"""The documentation's shell commands, as a reader copies them: fenced bash blocks (a line
continued by a backslash joined, comments dropped) and inline `lrm ...` spans in tables."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?P<lang>\w*)[^\n]*\n(?P<body>.*?)^```", re.S | re.M)
INLINE = re.compile(r"`(lrm [^`]+)`")


@dataclass(frozen=True)
class Command:
    page: str  # the page's path, relative to the repo
    line: int  # 1-based line of the command's first line
    text: str  # as written (continuations joined)
    block: int  # index of its fenced block on the page (-1: inline)

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text, comments=True)


def blocks(page: Path, lang: str = "bash") -> Iterator[tuple[int, int, str]]:
    """(index, first line, body) of each fenced block of `lang` on the page."""
    text = page.read_text()
    for i, m in enumerate(m for m in FENCE.finditer(text) if m["lang"] == lang):
        yield i, text.count("\n", 0, m.start("body")) + 1, m["body"]


def commands(page: Path) -> Iterator[Command]:
    """Every command line of every bash block of `page` (env assignments and all)."""
    rel = str(page.relative_to(REPO))
    for i, first, body in blocks(page):
        pending, start = "", 0
        for n, line in enumerate(body.splitlines()):
            if not pending:
                start = first + n
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            whole = (pending + line).strip()
            if _open_quote(whole):  # a quoted argument over several lines (curl -d '{...}')
                pending = whole + "\n"
                continue
            pending = ""
            if whole and not whole.startswith("#"):
                yield Command(rel, start, whole, i)


def _open_quote(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return True
    return False


def inline_lrm(page: Path) -> Iterator[Command]:
    """`lrm ...` spans outside code blocks (the stage table's synopses)."""
    text = FENCE.sub(lambda m: "\n" * m[0].count("\n"), page.read_text())
    rel = str(page.relative_to(REPO))
    for m in INLINE.finditer(text):
        yield Command(rel, text.count("\n", 0, m.start()) + 1, m[1], -1)


def block_with(page: Path, needle: str) -> list[Command]:
    """The commands of the one bash block of `page` holding a line that starts with
    `needle`."""
    found = [c for c in commands(page) if c.text.startswith(needle)]
    assert len(found) == 1, f"{page.name}: {len(found)} commands start with {needle!r}"
    return [c for c in commands(page) if c.block == found[0].block]


def yaml_block(page: Path, first_line: str) -> str:
    """The body of the yaml block of `page` whose first line is `first_line`."""
    found = [body for _, _, body in blocks(page, "yaml") if body.startswith(first_line)]
    assert len(found) == 1, f"{page.name}: {len(found)} yaml blocks start with {first_line!r}"
    return found[0]
