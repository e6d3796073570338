"""ExFM benchmarks: `python bench/exfm.py [--quick]` prints one JSON line per case.

exfm.augment       augment rows/s (teacher forward + reading + writing the augmented days)
                   vs the teacher's bare inference rows/s on the same batches
exfm.student_gain  NE of the student with auxiliary head + adapter (candidate) vs the
                   labels-only student (baseline) on the same evaluation day, mean over 3
                   student seeds (same data and teacher), with every seed's figures, their
                   spread, the paired per-seed differences, and the full table of the four
                   variants and the teacher (NE, AUC, calibration: mean, spread) in one line

The default run uses params.yaml's generate / exfm / teacher / students sections (first
student only); --quick a small world (under a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cases import exfm_cases  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    ap.add_argument("--only", choices=["augment", "student_gain"], default=None)
    ap.add_argument("--seeds", type=int, default=3, help="student seeds for student_gain")
    args = ap.parse_args()
    with exfm_cases.world(args.quick) as w:
        if args.only in (None, "augment"):
            exfm_cases.run_augment(w)
        if args.only in (None, "student_gain"):
            exfm_cases.run_student_gain(w, seeds=args.seeds)


if __name__ == "__main__":
    main()
