"""Online estimates: Welford's mean and t interval equal the batch formulas; tensor stats."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from lrm.fp8.stats import Running, TensorStats


def test_running_mean_and_interval_match_the_direct_formula():
    xs = [3.0, 5.5, 4.25, 6.0, 2.5]
    r = Running()
    for x in xs:
        r.add(x)
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    h = stats.t.ppf(0.975, len(xs) - 1) * sd / math.sqrt(len(xs))
    assert math.isclose(r.mean, mean) and math.isclose(r.std, sd)
    assert math.isclose(r.half_width(0.95), h)
    s = r.summary()
    assert math.isclose(s["ci"][0], mean - h) and math.isclose(s["ci"][1], mean + h)


def test_one_sample_has_no_interval():
    r = Running()
    r.add(1.0)
    assert r.half_width() == math.inf and r.summary()["ci"] == [None, None]


def test_tensor_stats_over_batches_match_the_concatenated_tensor():
    g = torch.Generator().manual_seed(1)
    parts = [torch.randn(4000, generator=g) * 2 + 1 for _ in range(3)]
    parts[1][7] = 40.0  # one outlier
    st = TensorStats(outlier_k=6.0)
    for p in parts:
        st.add(p)
    s = st.summary()
    allx = torch.cat(parts).double()
    c = allx - allx.mean()
    kurt = float((c ** 4).mean() / (c ** 2).mean() ** 2)
    assert s["count"] == 12000 and s["amax"] == 40.0
    assert math.isclose(s["mean"], float(allx.mean()), rel_tol=1e-9)
    assert math.isclose(s["kurtosis"], kurt, rel_tol=1e-6)
    assert s["outlier_share"] == 1 / 12000
    one = TensorStats()
    one.add(parts[0])
    assert math.isclose(one.summary()["abs_p50"], float(parts[0].abs().double().quantile(0.5)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (a tensor off the CPU)")
def test_tensor_stats_of_a_gpu_tensor_match_the_same_values_on_the_cpu():
    # the probe hooks see the model's own tensors: on a GPU they live there
    x = torch.randn(5000, generator=torch.Generator().manual_seed(2)) * 3
    on_gpu, on_cpu = TensorStats(), TensorStats()
    on_gpu.add(x.cuda())
    on_cpu.add(x)
    a, b = on_gpu.summary(), on_cpu.summary()
    assert a.keys() == b.keys()
    for k in a:
        assert math.isclose(a[k], b[k], rel_tol=1e-6), k
