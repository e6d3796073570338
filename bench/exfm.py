"""ExFM benchmarks: `python bench/exfm.py [--quick | --smoke]` prints one JSON line per case.

exfm.teacher_gain       a line per vertical: the foundation model's mean NE over its seeds on
                        the vertical's held-out last day (candidate) against the best
                        labels-only vertical model's, ratio = labels-only / FM (the FM's lead)
exfm.table              a line per vertical x size: every candidate's mean held-out NE
                        (`variants`, the FM's own prediction as `fm`), the served one per seed
                        (registry.variant auto, lrm.exfm.pick) and the one the old rule served
exfm.pick_regret        served NE / the best candidate's NE on each held-out full day (aim
                        <= 1.005; the mean over seeds x days, each figure and their spread;
                        candidate: lrm.exfm.pick's choice from the days before that day,
                        baseline: the old rule's, one validation day, the lowest NE never
                        worse than labels only; the data's last day alone beside)
exfm.served_vs_labels   labels-only NE / served NE (aim >= 1.0), the old rule's beside it
exfm.student_gain       labels-only NE (baseline) against the served variant's (candidate),
                        every seed's figures, their spread and the gain over it
exfm.augment            augment rows/s against the teacher's bare forward on the same batches
exfm.stream_day         (--only stream) a stream day's seconds against the number of surfaces
                        (1, 3, 9), default and production settings (bench/cases/exfm_stream.py)

The held-out day of exfm.table and student_gain is the data's last, later than every day
the pick saw (the validation days before it, registry.pick.days of them). The pick is also
judged on every full day H with registry.pick.days scored days before it, as if H were the
last (exfm_cases.held_out): an export's last day, cut mid-day, is too noisy a judge. The
labels-only vertical model is trained on every day of its vertical: the user's real
alternative. The data: params.yaml's world
(--world tiny: with a 1.2% surface, where distillation helps, and a 0.3% one under
students.min_share that serves the FM), or any click log through its column mapping
(--log FILE... --map MAP: the logs pipeline's procedure, ingest logs -> dedup -> the FM's
versions -> augment -> the vertical models; --params FILE laid over params.yaml). 3 seeds,
each the whole procedure's (its FM, the days it augments, the students distilled from them;
minutes to hours on 2 cores: it prints how long each part took); --quick a small world
(about a minute).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common  # noqa: E402
from bench.cases import exfm_cases  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_mode_flags(ap, "small sizes, about a minute")
    ap.add_argument("--only", choices=["augment", "gains", "stream"], default=None)
    ap.add_argument("--seeds", type=int, default=None,
                    help="seeds (default: 3; --quick: 1)")
    ap.add_argument("--fm-seeds", type=int, default=None,
                    help="FM seeds; student seed s distils from FM seed s mod this "
                         "(default: as many as --seeds, so each seed is the whole procedure's)")
    ap.add_argument("--world", choices=["default", "tiny"], default="default",
                    help="tiny: the world with two tiny surfaces added (see above)")
    ap.add_argument("--log", type=Path, nargs="+", default=None,
                    help="a click log's files: the logs pipeline's procedure on them")
    ap.add_argument("--map", type=Path, default=None, dest="mapping",
                    help="the log's column mapping (lrm ingest logs --map)")
    ap.add_argument("--params", type=Path, action="append", default=None,
                    help="params files laid over params.yaml (repeat; later win)")
    ap.add_argument("--keep-scores", type=Path, default=None,
                    help="write every candidate's logits per seed, VM and evaluation day "
                         "there (to replay a pick rule on them)")
    args = ap.parse_args()
    common.use_mode(args)
    for flag, value in (("--seeds", args.seeds), ("--fm-seeds", args.fm_seeds)):
        if value is not None and value < 1:
            ap.error(f"{flag} must be >= 1, got {value}")
    if args.log and args.world != "default":
        ap.error("--world tiny is a synthetic world; --log brings its own data")
    if args.mapping and not args.log:
        ap.error("--map maps a --log")
    if args.only == "stream":
        from bench.cases.exfm_stream import run_stream

        run_stream(args.quick)
        return
    seeds = args.seeds or (1 if args.quick else 3)
    if (args.fm_seeds or 0) > seeds:  # seed s distils from FM s mod N: FM seeds >= N unused
        ap.error(f"--fm-seeds {args.fm_seeds} exceeds --seeds {seeds} (seed s distils from "
                 "FM seed s mod --fm-seeds: the rest would train for nothing)")
    # augment's case reads one FM's versions: --only augment trains no more
    fm_seeds = 1 if args.only == "augment" else args.fm_seeds or seeds
    with exfm_cases.world(args.quick, fm_seeds,
                          tiny=args.world == "tiny", log=args.log, mapping=args.mapping,
                          params=args.params) as w:
        if args.only in (None, "gains"):
            exfm_cases.run_gains(w, seeds=seeds, keep=args.keep_scores)
        if args.only in (None, "augment"):
            exfm_cases.run_augment(w)


if __name__ == "__main__":
    main()
