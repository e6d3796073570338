"""The served variant is not picked by noise (lrm.exfm.pick, issue 44 item 6): on a world
whose truth is known, a tiny surface serves the variant that distils while the evidence is
thin, moves off it when the evidence says so, and serves the foundation model where no VM
comes near it; judged on held-out days later than every day the pick saw."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lrm.config import GenerateConfig, VerticalConfig
from lrm.data import synthetic
from lrm.data.synthetic.days import hidden_logit
from lrm.exfm.pick import (
    FM,
    Scores,
    choose,
    load_scores,
    pool,
    prior_of,
    save_scores,
    stored_days,
)

# a big surface and a tiny one (about 1% of the sessions: ~100 impressions a day)
WORLD = GenerateConfig(users=3000, ads=400, advertisers=40, categories=8, days=10,
                       sessions_per_day=1500, mean_session_length=6.0, max_history=10,
                       seed=11, verticals=[VerticalConfig(name="big", share=0.99),
                                           VerticalConfig(name="tiny", share=0.012,
                                                          base_ctr=0.05)])
VALIDATION, HELD_OUT = (5, 6, 7), (8, 9)


@pytest.fixture(scope="module")
def truth():
    """day -> (true click logits, sampled labels) of each surface's impressions."""
    out = {}
    for d in range(WORLD.days):
        t = synthetic.generate_day(WORLD, d)
        logit = torch.from_numpy(hidden_logit(WORLD, t, d)).double()
        y = torch.from_numpy(t.column("label").to_numpy().astype(np.float64))
        v = t.column("vertical").to_numpy()
        out[d] = {k: (logit[torch.from_numpy(v == k)], y[torch.from_numpy(v == k)])
                  for k in (0, 1)}
    return out


def _model(t: torch.Tensor, skill: float, noise: float, bias: float,
           g: torch.Generator) -> torch.Tensor:
    """A model's logits: `skill` of the truth, the rest the surface's mean, plus its own
    error on each row."""
    return skill * t + (1 - skill) * t.mean() + bias + noise * torch.randn(len(t), generator=g,
                                                                           dtype=t.dtype)


# the candidates of a tiny surface, as the log found them: the VM alone learns less
# from ~100 rows a day than the variants that distil (about 5% worse on held-out days), and
# the FM itself, level with the best of them, is noisier (trained on every surface)
TINY = {"labels_only": (0.66, 0.4, 0.0), "distill_serving": (0.75, 0.35, 0.0),
        "aux_head": (0.72, 0.35, 0.0), FM: (0.75, 0.45, 0.0)}
# a big surface where the FM is off (a biased teacher): labels only is truly best
BIG = {"labels_only": (0.9, 0.2, 0.0), "distill_serving": (0.78, 0.3, 0.2),
       "aux_head": (0.78, 0.3, 0.25), FM: (0.75, 0.3, 0.3)}


def _expected_ne(q: torch.Tensor, t: torch.Tensor) -> float:
    """The NE of logits `q` in expectation over the labels the truth `t` draws."""
    p = torch.sigmoid(t)
    ll = -(p * torch.nn.functional.logsigmoid(q) + (1 - p) * torch.nn.functional.logsigmoid(-q))
    c = float(p.mean())
    return float(ll.mean()) / -(c * math.log(c) + (1 - c) * math.log1p(-c))


def _draw(truth, vertical, spec, seed):
    """A seed's candidates: their scores on the validation days, and their NE on the held-out
    days in expectation over the labels (the truth)."""
    g = torch.Generator().manual_seed(seed)
    per_day = {}
    for d in VALIDATION:
        t, y = truth[d][vertical]
        per_day[d] = Scores(y, {c: _model(t, *spec[c], g) for c in spec})
    t = torch.cat([truth[d][vertical][0] for d in HELD_OUT])
    held = {c: _expected_ne(_model(t, *spec[c], g), t) for c in spec}
    return per_day, held


def _old_rule(day: Scores) -> str:
    """Before issue 44: the lowest NE on one validation day, never worse than labels only."""
    from lrm.metrics import normalized_entropy

    ne = {c: normalized_entropy(x, day.labels) for c, x in day.logits.items() if c != FM}
    best = min(ne, key=lambda v: (ne[v], v != "labels_only"))
    return best if ne[best] < ne["labels_only"] else "labels_only"


def test_a_tiny_surface_serves_what_distils_or_the_fm_never_labels_only(truth):
    """~100 impressions a validation day: one day's NEs are noise (the old rule serves
    labels only, truly ~5% worse, on some seeds, and often the weaker distilled variant);
    pooled days against the prior serve a variant that distils or the FM, each better than
    labels only on the held-out days, within 1% of the best on average.
    Red with the prior ignored (the lowest pooled NE served)."""
    rows = sum(len(truth[d][1][1]) for d in VALIDATION)
    assert 150 < rows < 600  # a tiny surface indeed
    regret_new, regret_old, labels_old = [], [], 0
    for seed in range(40):
        per_day, held = _draw(truth, 1, TINY, seed)
        assert held["labels_only"] > held["distill_serving"]  # the truth
        pooled, days = _pooled(per_day)
        p = choose(pooled, "distill_serving", days=days)
        assert p.served != "labels_only", (seed, p.reason)
        old = _old_rule(per_day[VALIDATION[-1]])
        labels_old += old == "labels_only"
        best = min(held.values())
        regret_new.append(held[p.served] / best)
        regret_old.append(held[old] / best)
    assert labels_old >= 3  # the noise the issue met
    assert np.mean(regret_new) < 1.01 < np.mean(regret_old)


# a tiny surface where no VM comes near the FM (the surface E: the FM 12% ahead)
FAR = {"labels_only": (0.4, 0.4, 0.0), "distill_serving": (0.55, 0.35, 0.0),
       "aux_head": (0.5, 0.35, 0.0), FM: (0.95, 0.15, 0.0)}


def test_where_no_vm_comes_near_the_fm_the_pooled_days_serve_the_fm(truth):
    """The FM ~17% ahead of every VM on held-out days: the three pooled validation days
    find it on most seeds, one day's rows on few (both beyond the noise or not at all).
    Red with the FM left out of the candidates."""
    found = {1: 0, 3: 0}
    for seed in range(40):
        per_day, held = _draw(truth, 1, FAR, seed)
        assert held[FM] < 0.9 * min(v for c, v in held.items() if c != FM)
        for k in found:
            pooled, days = pool(per_day, list(FAR), k)
            p = choose(pooled, "distill_serving", days=days)
            assert p.served != "labels_only", p.reason
            found[k] += p.served == FM
    assert found[3] >= 25 and found[1] <= 10, found


def test_with_enough_evidence_the_pick_leaves_the_prior(truth):
    """The big surface, where the FM is off and labels only is truly best by a margin: over
    ~27,000 pooled impressions every seed serves labels only. Red with the interval's sign
    test inverted (the prior kept whatever the evidence)."""
    for seed in range(5):
        per_day, held = _draw(truth, 0, BIG, seed)
        assert held["labels_only"] < held["distill_serving"]
        pooled, days = _pooled(per_day)
        p = choose(pooled, "distill_serving", days=days)
        assert p.served == "labels_only", p.reason
        lo, hi = p.against["labels_only"]
        assert lo < hi < 0


# a tiny surface where the FM leads every VM by ~10% (the issue-shaped world's surfaces of
# 1,000 rows a day: the FM 5-10% ahead on most held-out days)
NEAR = {"labels_only": (0.4, 0.4, 0.0), "distill_serving": (0.55, 0.35, 0.0),
        "aux_head": (0.5, 0.35, 0.0), FM: (0.7, 0.3, 0.0)}


def test_the_default_pools_enough_days_to_find_a_lead_on_a_tiny_surface(truth):
    """registry.pick.days' default pools the days a tiny surface needs: with the FM ~10%
    ahead on held-out days, the five days before them find it on more seeds than the last
    three, and what serves is nearer the best (the old default of 3 left 1-2% of NE on the
    table on average). Red with the default back at 3."""
    from lrm.config import PickConfig

    days = PickConfig().days
    assert days > 3
    regret, found = {3: [], days: []}, {3: 0, days: 0}
    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        per_day = {d: Scores(truth[d][1][1], {c: _model(truth[d][1][0], *NEAR[c], g)
                                              for c in NEAR}) for d in range(8 - days, 8)}
        t = torch.cat([truth[d][1][0] for d in HELD_OUT])
        held = {c: _expected_ne(_model(t, *NEAR[c], g), t) for c in NEAR}
        assert held[FM] < 0.95 * min(v for c, v in held.items() if c != FM)
        for k in regret:
            pooled, used = pool(per_day, list(NEAR), k)
            p = choose(pooled, "distill_serving", days=used)
            regret[k].append(held[p.served] / min(held.values()))
            found[k] += p.served == FM
    assert found[days] > found[3] + 4, found
    assert np.mean(regret[days]) < 1.015 < np.mean(regret[3]), regret


def _pooled(per_day):
    pooled, days = pool(per_day, list(next(iter(per_day.values())).logits), 3)
    return pooled, days


def test_choose_keeps_the_prior_on_thin_or_no_evidence_and_ties_go_to_the_vm():
    g = torch.Generator().manual_seed(0)
    y = (torch.rand(60, generator=g) < 0.1).double()
    x = torch.randn(60, generator=g, dtype=torch.float64) - 2
    better = x + 1.5 * (2 * y - 1)  # far better, on 60 rows
    p = choose(Scores(y, {"labels_only": better, "distill_serving": x}), "distill_serving")
    assert p.ne["labels_only"] < p.ne["distill_serving"]
    # 60 rows, 6 clicks: better by a lot is still better beyond the noise? the interval says
    assert p.served == ("labels_only" if p.against["labels_only"][1] < 0 else "distill_serving")
    # no clicks: every NE undefined, the prior serves
    none = choose(Scores(torch.zeros(50, dtype=torch.float64),
                         {"labels_only": x[:50], "distill_serving": x[:50]}), "distill_serving")
    assert none.served == "distill_serving" and math.isnan(none.ne["labels_only"])
    empty = choose(Scores(torch.zeros(0), {"labels_only": torch.zeros(0),
                                           "distill_serving": torch.zeros(0), FM: torch.zeros(0)}),
                   "distill_serving")
    assert empty.served == "distill_serving" and empty.rows == 0
    # the FM a little lower but within the noise: the VM serves (the FM costs more to
    # serve). Red with the FM served on a lower NE alone
    fm = x + 0.3 * torch.randn(60, generator=torch.Generator().manual_seed(102),
                               dtype=torch.float64)
    level = choose(Scores(y, {"distill_serving": x, FM: fm}), "distill_serving")
    assert level.ne[FM] < level.ne["distill_serving"] and level.against[FM][0] < 0
    assert level.served == "distill_serving"
    with pytest.raises(ValueError, match="prior"):
        choose(Scores(y, {"labels_only": x}), "aux_head")


def test_pool_takes_the_last_days_every_candidate_was_scored_on():
    def day(n, names):
        return Scores(torch.full((n,), 1.0), {c: torch.full((n,), float(n)) for c in names})

    per_day = {3: day(1, ["a", "b"]), 4: day(2, ["a", "b"]), 5: day(3, ["a"]),
               6: day(4, ["a", "b", "c"])}
    s, days = pool(per_day, ["a", "b"], 2)
    assert days == [4, 6] and s.rows == 6 and s.logits["b"].tolist() == [2.0] * 2 + [4.0] * 4
    assert pool(per_day, ["a", "b"], 10)[1] == [3, 4, 6]
    assert pool({}, ["a"], 3)[1] == [] and pool({}, ["a"], 3)[0].rows == 0


def test_the_prior_is_the_first_variant_that_distils_unless_named():
    distils = {"labels_only": False, "distill_serving": True, "aux_head": True}
    assert prior_of(list(distils), distils) == "distill_serving"
    assert prior_of(["aux_head", "labels_only"], distils) == "aux_head"
    assert prior_of(["labels_only"], distils) == "labels_only"
    assert prior_of(list(distils), distils, "aux_head") == "aux_head"


def test_stored_scores_round_trip_and_only_the_newest_days_stay(tmp_path, monkeypatch):
    from lrm.exfm import pick

    monkeypatch.setattr(pick, "KEEP_DAYS", 2)
    y = torch.tensor([0.0, 1.0, 0.0])
    for d in (3, 4, 5):
        save_scores(tmp_path / "s", d, Scores(y, {"a": y + d, FM: y - d}), "test")
    assert stored_days(tmp_path / "s") == [4, 5]
    back = load_scores(tmp_path / "s", before=5)
    assert list(back) == [4] and torch.equal(back[4].logits[FM], y - 4)
    assert torch.equal(back[4].labels, y)


def test_with_fm_ties_the_fm_serves_unless_a_vm_beats_it_beyond_the_noise():
    """registry.pick.fm_ties: a tie between the FM and the chosen VM goes to the FM; a VM
    better beyond the noise still serves. Planted bugs that turn this red (tried): the
    fm_ties branch dropped (the VM serves the tie); its check inverted (the FM serves where
    the VM beats it)."""
    g = torch.Generator().manual_seed(0)
    y = (torch.rand(4000, generator=g) < 0.1).double()
    x = torch.randn(4000, generator=g, dtype=torch.float64) - 2
    noise = torch.randn(4000, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    level = Scores(y, {"distill_serving": x, FM: x + 0.05 * noise})
    tie = choose(level, "distill_serving", fm_ties=True)
    assert tie.against[FM][0] < 0 < tie.against[FM][1]  # within the noise either way
    assert tie.served == FM and "fm_ties" in tie.reason
    assert choose(level, "distill_serving").served == "distill_serving"  # the default: the VM
    vm_better = Scores(y, {"distill_serving": x + 1.5 * (2 * y - 1), FM: x})
    beat = choose(vm_better, "distill_serving", fm_ties=True)
    assert beat.against[FM][0] > 0 and beat.served == "distill_serving"
