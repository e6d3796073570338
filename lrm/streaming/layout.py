"""Where a stream keeps everything: one root folder (`streaming.root`).

    ROOT/raw/day=D/          the day's impressions (+ _source.json: where it came from)
    ROOT/sessions/day=D/     the same deduplicated (RecD)
    ROOT/augmented/day=D/    + the teacher champion's logit (stage augment's folder)
    ROOT/work/day=D/         D's fit and held-out parts, when D + 1 is not there yet
                             (those of the newest done day only: older ones are removed)
    ROOT/checkpoints/        one chain per model: teacher/, students/NAME/
    ROOT/models/             teacher/until=D/, students/day=D/NAME/VARIANT/, registry/NAME/vN/
    ROOT/reports/day=D.md    the day's report (also the Prefect artifact)
    ROOT/days/day=D.json     the day's record: written last, it says the day is done
    ROOT/incoming/           the folder source's default inbox (files the user drops)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STAGE = "stream"  # what the stream's folders and files are marked as written by


@dataclass(frozen=True)
class StreamPaths:
    root: Path

    @property
    def raw(self) -> Path:
        return self.root / "raw"

    @property
    def sessions(self) -> Path:
        return self.root / "sessions"

    @property
    def augmented(self) -> Path:
        return self.root / "augmented"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def days(self) -> Path:
        return self.root / "days"

    @property
    def incoming(self) -> Path:
        return self.root / "incoming"

    # the folders the stream writes and claims (the stages claim theirs: `sessions` dedup's,
    # `augmented` augment's, the models' folders and chains their stage's)
    def owned(self) -> list[Path]:
        return [self.raw, self.work, self.reports, self.days]

    def teacher_chain(self) -> Path:
        return self.checkpoints / "teacher"

    def student_chains(self) -> Path:
        """The students' chains (NAME/: the student stage's --checkpoints with --day)."""
        return self.checkpoints / "students"

    def teacher_model(self, until: int) -> Path:
        return self.models / "teacher" / f"until={until}"

    def teacher_state(self) -> Path:
        return self.models / "teacher" / "state.json"

    def student_models(self, day: int) -> Path:
        """Day D's student models (NAME/VARIANT/, the student stage's --out)."""
        return self.models / "students" / f"day={day}"

    def registered(self, name: str, version: str) -> Path:
        return self.models / "registry" / name / f"v{version}"

    def record(self, day: int) -> Path:
        return self.days / f"day={day}.json"

    def report(self, day: int) -> Path:
        return self.reports / f"day={day}.md"

    def split(self, day: int) -> tuple[Path, Path]:
        """(fit, held-out) datasets of day D's last-slice evaluation."""
        return self.work / f"day={day}" / "fit", self.work / f"day={day}" / "holdout"
