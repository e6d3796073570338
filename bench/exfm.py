"""ExFM benchmarks: `python bench/exfm.py [--quick | --smoke]` prints one JSON line per case.

exfm.teacher_gain   a line per vertical: the foundation model's mean NE over its seeds on the
                    vertical's held-out last day (candidate; `fm_per_seed`, `fm_spread`)
                    against the best labels-only vertical model's (its size with the lowest
                    mean NE over the seeds), ratio = labels-only / FM
exfm.student_gain   a line per vertical x size: labels-only NE (baseline) against the served
                    variant's (candidate, picked on the validation day by registry.variant
                    auto), every seed's figures, their spread, `gain_over_spread` (mean NE
                    gain / the larger seed spread of the two NEs), `gain_over_gain_spread`
                    (mean NE gain / the spread of the gain itself, seed by seed: a seed's
                    variants share its init and data order) and the full variant table
exfm.augment        augment rows/s against the teacher's bare forward on the same batches

The labels-only vertical model is trained on every day of its vertical: the user's real
alternative. The default run uses params.yaml's world and models with 3 seeds, each the
whole procedure's (its FM, the days it augments, the students distilled from them; minutes
to hours on 2 cores: it prints how long each part took); --quick a small world (under a
minute).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common  # noqa: E402
from bench.cases import exfm_cases  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    common.add_mode_flags(ap)
    ap.add_argument("--only", choices=["augment", "gains"], default=None)
    ap.add_argument("--seeds", type=int, default=None,
                    help="seeds (default: 3; --quick: 1)")
    ap.add_argument("--fm-seeds", type=int, default=None,
                    help="FM seeds; student seed s distils from FM seed s mod this "
                         "(default: as many as --seeds, so each seed is the whole procedure's)")
    args = ap.parse_args()
    common.use_mode(args)
    for flag, value in (("--seeds", args.seeds), ("--fm-seeds", args.fm_seeds)):
        if value is not None and value < 1:
            ap.error(f"{flag} must be >= 1, got {value}")
    seeds = args.seeds or (1 if args.quick else 3)
    if (args.fm_seeds or 0) > seeds:  # seed s distils from FM s mod N: FM seeds >= N unused
        ap.error(f"--fm-seeds {args.fm_seeds} exceeds --seeds {seeds} (seed s distils from "
                 "FM seed s mod --fm-seeds: the rest would train for nothing)")
    # augment's case reads one FM's versions: --only augment trains no more
    fm_seeds = 1 if args.only == "augment" else args.fm_seeds or seeds
    with exfm_cases.world(args.quick, fm_seeds) as w:
        if args.only in (None, "gains"):
            exfm_cases.run_gains(w, seeds=seeds)
        if args.only in (None, "augment"):
            exfm_cases.run_augment(w)


if __name__ == "__main__":
    main()
