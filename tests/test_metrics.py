"""NE, AUC and calibration against hand computations, brute force and torchrec; their
bootstrap confidence intervals."""

from __future__ import annotations

import math

import pytest
import torch

from lrm import metrics
from lrm.metrics import StreamingMetrics, auc, bootstrap_ci, calibration, normalized_entropy


def test_ne_by_hand():
    # p = (0.8, 0.4, 0.1, 0.3), y = (1, 0, 0, 1); c = 0.5
    # log loss = -(ln .8 + ln .6 + ln .9 + ln .3) / 4
    #          = (0.223144 + 0.510826 + 0.105361 + 1.203973) / 4 = 0.510826
    # entropy  = -(.5 ln .5 + .5 ln .5) = ln 2 = 0.693147;  NE = 0.736966
    p = torch.tensor([0.8, 0.4, 0.1, 0.3], dtype=torch.float64)
    y = torch.tensor([1.0, 0.0, 0.0, 1.0])
    want = (-(math.log(0.8) + math.log(0.6) + math.log(0.9) + math.log(0.3)) / 4) / math.log(2)
    assert want == pytest.approx(0.736966, abs=1e-6)
    assert normalized_entropy(p, y, probs=True) == pytest.approx(want, rel=1e-12)
    assert normalized_entropy(torch.logit(p.double()), y) == pytest.approx(want, rel=1e-12)


def test_ne_matches_torchrec():
    from torchrec.metrics.metrics_config import RecTaskInfo
    from torchrec.metrics.ne import NEMetric

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 500, generator=g) * 2 - 1
    y = (torch.rand(4, 500, generator=g) < torch.sigmoid(logits)).float()
    task = RecTaskInfo(name="ctr", label_name="y", prediction_name="p", weight_name="w")
    ref = NEMetric(world_size=1, my_rank=0, batch_size=500, tasks=[task], window_size=10_000)
    for i in range(4):
        ref.update(predictions={"ctr": torch.sigmoid(logits[i])}, labels={"ctr": y[i]},
                   weights={"ctr": torch.ones(500)})
    want = float(ref.compute()["ne-ctr|lifetime_ne"])
    assert normalized_entropy(logits, y) == pytest.approx(want, rel=1e-6)


def test_ne_base_rate_is_one_and_degenerate_is_nan():
    y = torch.tensor([1.0, 0, 0, 0, 1, 0, 0, 0])  # c = 0.25
    assert normalized_entropy(torch.full((8,), 0.25), y, probs=True) == pytest.approx(1.0)
    assert normalized_entropy(torch.full((8,), math.log(0.25 / 0.75)), y) == pytest.approx(1.0)
    assert math.isnan(normalized_entropy(torch.zeros(3), torch.zeros(3)))


def test_ne_logits_stay_finite_when_confident():
    y = torch.tensor([1.0, 0.0])
    ne = normalized_entropy(torch.tensor([-200.0, 200.0]), y)  # p underflows to 0 / 1
    assert ne == pytest.approx(200 / math.log(2), rel=1e-9)


def _brute_auc(p: torch.Tensor, y: torch.Tensor) -> float:
    pos, neg = p[y == 1], p[y == 0]
    gt = (pos[:, None] > neg[None, :]).double().sum()
    eq = (pos[:, None] == neg[None, :]).double().sum()
    return float((gt + 0.5 * eq) / (len(pos) * len(neg)))


def test_auc_exact_with_ties():
    g = torch.Generator().manual_seed(1)
    p = torch.randint(0, 12, (400,), generator=g).float()  # many ties
    y = (torch.rand(400, generator=g) < 0.3).float()
    assert auc(p, y) == pytest.approx(_brute_auc(p, y), abs=1e-12)
    q = torch.randn(300, generator=g)
    z = (torch.rand(300, generator=g) < torch.sigmoid(2 * q)).float()
    assert auc(q, z) == pytest.approx(_brute_auc(q, z), abs=1e-12)
    assert auc(torch.sigmoid(q), z) == pytest.approx(auc(q, z), abs=1e-12)


def test_auc_small_cases():
    assert auc(torch.tensor([0.1, 0.9]), torch.tensor([0.0, 1.0])) == 1.0
    assert auc(torch.tensor([0.9, 0.1]), torch.tensor([0.0, 1.0])) == 0.0
    assert auc(torch.tensor([0.5, 0.5, 0.5]), torch.tensor([0.0, 1.0, 1.0])) == 0.5
    assert math.isnan(auc(torch.tensor([0.3, 0.4]), torch.tensor([1.0, 1.0])))


def test_calibration():
    p = torch.tensor([0.2, 0.4, 0.1, 0.3])
    y = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert calibration(p, y, probs=True) == pytest.approx(1.0)
    assert calibration(torch.logit(p), y) == pytest.approx(1.0, rel=1e-6)
    assert calibration(p, torch.tensor([1.0, 1.0, 0.0, 0.0]), probs=True) == pytest.approx(0.5)


def test_streaming_equals_one_shot_and_window():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(1000, generator=g) - 1.5
    y = (torch.rand(1000, generator=g) < torch.sigmoid(logits)).float()
    m = StreamingMetrics(window=300)
    for chunk in (slice(0, 130), slice(130, 500), slice(500, 510), slice(510, 1000)):
        m.update(logits[chunk], y[chunk])
    out = m.compute()
    assert out["rows"] == 1000
    assert out["ne"] == pytest.approx(normalized_entropy(logits, y), rel=1e-12)
    assert out["auc"] == pytest.approx(auc(logits, y), abs=1e-12)
    assert out["calibration"] == pytest.approx(calibration(logits, y), rel=1e-9)
    assert out["ctr"] == pytest.approx(float(y.mean()))
    assert out["log_loss"] == pytest.approx(
        float(torch.nn.functional.binary_cross_entropy_with_logits(logits, y)), rel=1e-6)
    assert m.window_ne() == pytest.approx(normalized_entropy(logits[-300:], y[-300:]), rel=1e-9)
    assert out["window_ne"] == m.window_ne()

    small = StreamingMetrics(window=5000, keep_auc=False)  # window not yet full
    small.update(logits[:200], y[:200])
    assert small.window_ne() == pytest.approx(normalized_entropy(logits[:200], y[:200]))
    assert math.isnan(small.compute()["auc"])
    small.reset()
    assert small.rows == 0 and math.isnan(small.compute()["ne"])


def test_weighted_metrics_equal_the_metrics_of_repeated_rows():
    """The bootstrap's weighted NE, AUC (ties included) and calibration: a row of weight k
    counts as k copies of it."""
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 15, (300,), generator=g).double() / 4 - 2  # many ties
    y = (torch.rand(300, generator=g) < torch.sigmoid(x)).double()
    w = torch.randint(0, 4, (5, 300), generator=g).double()
    xs, order = torch.sort(x)
    ys = y[order]
    ends = torch.cumsum(torch.unique_consecutive(xs, return_counts=True)[1], 0)
    ne, a, cal = metrics._weighted(w[:, order], metrics.log_losses(xs, ys), ys,
                                   torch.sigmoid(xs), ends)
    for r in range(5):
        idx = torch.repeat_interleave(torch.arange(300), w[r].long())
        assert float(ne[r]) == pytest.approx(normalized_entropy(x[idx], y[idx]), rel=1e-12)
        assert float(a[r]) == pytest.approx(auc(x[idx], y[idx]), abs=1e-12)
        assert float(cal[r]) == pytest.approx(calibration(x[idx], y[idx]), rel=1e-12)


def test_bootstrap_intervals_cover_the_truth_and_narrow_with_more_rows():
    g = torch.Generator().manual_seed(4)

    def day(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, generator=g) - 2.5
        return x, (torch.rand(n, generator=g) < torch.sigmoid(x)).double()

    truth = day(500_000)  # the population's metrics, to about 1e-3
    true = {"ne": normalized_entropy(*truth), "auc": auc(*truth),
            "calibration": calibration(*truth)}
    covered = {k: 0 for k in true}
    for _ in range(30):  # 30 small days: a 95% interval misses about 1.5 of them
        ci = bootstrap_ci(*day(2000), resamples=100)
        for k, (lo, hi) in ci.items():
            covered[k] += lo <= true[k] <= hi
    assert all(c >= 25 for c in covered.values()), covered  # 0.6% chance below at 95%

    small, big = bootstrap_ci(*day(1000)), bootstrap_ci(*day(40_000))
    for k in true:
        assert big[k][1] - big[k][0] < (small[k][1] - small[k][0]) / 3, k  # ~1/sqrt(40)
    x, y = day(500)
    assert bootstrap_ci(x, y) == bootstrap_ci(x, y)  # seeded
    assert all(lo < m < hi for (lo, hi), m in zip(
        bootstrap_ci(x, y).values(), (normalized_entropy(x, y), auc(x, y),
                                      calibration(x, y)), strict=True))
    nan = bootstrap_ci(torch.zeros(3), torch.zeros(3))  # no click: NE, AUC, calibration NaN
    assert all(math.isnan(v) for b in nan.values() for v in b)


def test_streaming_score_agrees_with_score_in_the_memory_of_a_batch():
    """`lrm evaluate`'s scorer: batch after batch, the NE, calibration, log loss and CTR of
    all rows at once, and the exact AUC where no two different scores share a bin (a grid
    of 0.001, ties included); the intervals those of the same Poisson weights on the rows
    in one piece (AUC's within its coarser bins); its memory the same after 10 batches as
    after 1."""

    g = torch.Generator().manual_seed(5)
    x = torch.randint(-6000, 1000, (60_000,), generator=g).double() * 0.001
    y = (torch.rand(60_000, generator=g) < torch.sigmoid(x)).double()
    s = metrics.StreamingScore(resamples=50, seed=7)
    sizes = []
    for xb, yb in zip(x.split(6_000), y.split(6_000), strict=True):
        s.update(xb, yb)
        sizes.append(sum(t.numel() for t in (s._hist, s._sums, s._ci_hist)))
    assert len(set(sizes)) == 1
    got, want = s.compute(), metrics.score(x, y)
    assert got["rows"] == want["rows"] == 60_000
    for k in ("ne", "calibration", "log_loss", "ctr"):
        assert got[k] == pytest.approx(want[k], rel=1e-9), k
    assert got["auc"] == pytest.approx(want["auc"], abs=1e-12)
    # the same weights, drawn batch by batch, on the rows sorted at once
    w_g = torch.Generator().manual_seed(7)
    w = torch.cat([metrics._poisson1(50, 6_000, w_g) for _ in range(10)], 1)
    xs, order = torch.sort(x)
    ends = torch.cumsum(torch.unique_consecutive(xs, return_counts=True)[1], 0)
    each = metrics._weighted(w[:, order], metrics.log_losses(xs, y[order]), y[order],
                             torch.sigmoid(xs), ends)
    q = torch.tensor([0.025, 0.975], dtype=torch.float64)
    for k, v in zip(("ne", "auc", "calibration"), each, strict=True):
        lo, hi = got[f"{k}_ci"]
        assert lo < got[k] < hi, k
        assert [lo, hi] == pytest.approx(torch.quantile(v, q).tolist(),
                                         abs=2e-4 if k == "auc" else 1e-9), k
    none = metrics.StreamingScore(resamples=0)
    none.update(x, y)
    assert "ne_ci" not in none.compute() and math.isnan(metrics.StreamingScore().compute()["ne"])


def test_streaming_scores_of_ranks_add_up_to_the_score_of_all_their_rows():
    """A training job's ranks each score their share of a day and add up their states
    (`reduce` with the sum over ranks): every rank then has the score of all the rows, as one
    StreamingScore of every row gives (the intervals from each rank's own weights)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(30_000, generator=g) * 1.5 - 3.0
    y = (torch.rand(30_000, generator=g) < torch.sigmoid(x)).double()
    whole = metrics.StreamingScore(resamples=40)
    for xb, yb in zip(x.split(3_000), y.split(3_000), strict=True):
        whole.update(xb, yb)
    ranks = [metrics.StreamingScore(resamples=40, seed=r) for r in range(2)]
    for i, (xb, yb) in enumerate(zip(x.split(3_000), y.split(3_000), strict=True)):
        ranks[i % 2].update(xb, yb)  # rank r reads batches r, r + 2, ...
    states: list[torch.Tensor] = []
    for r in ranks:  # what each rank puts into the all-reduce
        r.reduce(lambda t: states.append(t.clone()) or t)
    for r in ranks:  # and what it hands back to every rank
        r.reduce(lambda t: states[0] + states[1])
    want = whole.compute()
    for got in (r.compute() for r in ranks):
        assert got["rows"] == 30_000
        for k in ("ne", "auc", "calibration", "log_loss", "ctr"):
            assert got[k] == pytest.approx(want[k], rel=1e-12), k
        for k in ("ne", "auc", "calibration"):
            lo, hi = got[f"{k}_ci"]
            assert lo < got[k] < hi and hi - lo == pytest.approx(
                want[f"{k}_ci"][1] - want[f"{k}_ci"][0], rel=0.5), k
    alone = metrics.StreamingScore(resamples=0)
    alone.update(x[:3_000], y[:3_000])
    alone.reduce(lambda t: t)  # one process: its own score
    assert alone.compute()["rows"] == 3_000


@pytest.mark.parametrize("how", ["score", "streaming"])
def test_each_scorer_reports_every_metric_under_its_name(how):
    """Both scorers build their dict in one place (lrm.metrics._summary): each value checked
    against its own formula here, not against the other scorer. Plant: swap two values
    there (log_loss and ctr), report rows for an empty day, or drop the intervals' level."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5_000, generator=g)
    y = (torch.rand(5_000, generator=g) < torch.sigmoid(x - 2)).double()

    def scored(logits, labels):
        if how == "score":
            return metrics.score(logits, labels, ci=True, resamples=40)
        s = metrics.StreamingScore(resamples=40)
        s.update(logits, labels)
        return s.compute()

    got = scored(x, y)
    ctr = float(y.mean())
    log_loss = float(torch.nn.functional.binary_cross_entropy_with_logits(
        x.double(), y))
    assert got["rows"] == 5_000
    assert got["ctr"] == pytest.approx(ctr, rel=1e-12)
    assert got["log_loss"] == pytest.approx(log_loss, rel=1e-9)
    assert got["ne"] == pytest.approx(log_loss / metrics.entropy(ctr), rel=1e-9)
    assert got["calibration"] == pytest.approx(float(torch.sigmoid(x.double()).mean()) / ctr,
                                               rel=1e-9)
    assert 0.5 < got["auc"] < 1
    assert (got["ci_level"], got["ci_resamples"]) == (metrics.CI_LEVEL, 40)
    for k in ("ne", "auc", "calibration"):
        low, high = got[f"{k}_ci"]
        assert math.isfinite(low) and low < high, k
    empty = scored(torch.zeros(0), torch.zeros(0))
    assert empty["rows"] == 0 and set(empty) == set(got)
    assert all(math.isnan(v) for k, v in empty.items() if k in ("ne", "auc", "calibration",
                                                                  "log_loss", "ctr"))
    assert all(math.isnan(x) for k in ("ne", "auc", "calibration") for x in empty[f"{k}_ci"])


def test_paired_ne_scores_every_model_on_the_same_resampled_rows():
    """paired_ne: the point NEs are normalized_entropy's; in each resample the models are
    scored on the same weighted rows, so two copies of one model differ by exactly 0 in
    every resample and the interval of a difference is far narrower than either NE's own.
    Red with weights drawn per model (unpaired), and with the resample's CTR taken from
    unweighted labels."""
    g = torch.Generator().manual_seed(7)
    n = 4000
    truth = torch.randn(n, generator=g) - 2.5
    y = (torch.rand(n, generator=g) < torch.sigmoid(truth)).float()
    good = truth + 0.2 * torch.randn(n, generator=g)
    bad = good + 0.3 * torch.randn(n, generator=g)  # a model close to it, worse
    point, boot = metrics.paired_ne([good, bad, good.clone()], y, resamples=300, seed=3)
    assert boot.shape == (300, 3)
    for i, p in enumerate((good, bad, good)):
        assert point[i].item() == pytest.approx(normalized_entropy(p, y), rel=1e-12)
    assert torch.equal(boot[:, 0], boot[:, 2])  # the same model: the same rows, every time
    q = torch.tensor([0.025, 0.975], dtype=torch.float64)
    diff = (boot[:, 1] - boot[:, 0]).quantile(q)
    own = boot[:, 0].quantile(q)
    assert 0 < diff[0] < point[1] - point[0] < diff[1]  # bad is worse, surely
    assert (diff[1] - diff[0]) < 0.5 * (own[1] - own[0])
    # each column is a bootstrap of that model's NE: its interval is bootstrap_ci's, roughly
    lo, hi = bootstrap_ci(good, y, resamples=300)["ne"]
    assert abs(own[0] - lo) < 0.3 * (hi - lo) and abs(own[1] - hi) < 0.3 * (hi - lo)
    # seeded: the same resamples again
    assert torch.equal(metrics.paired_ne([good, bad], y, resamples=50, seed=3)[1],
                       metrics.paired_ne([good, bad], y, resamples=50, seed=3)[1])
