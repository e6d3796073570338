"""The dense weights' moving average (train.ema_decay): the average itself, and a run that
validates, restores, saves and resumes it."""

from __future__ import annotations

import pytest
import torch

from lrm.checkpoint import Store
from lrm.config import CheckpointConfig
from lrm.train import TrainJob, evaluate, train
from lrm.train.average import DenseAverage
from lrm.train.steps import dense_parameters
from tests.conftest import LOADER, SMALL_MODEL, tiny_train


def _by_hand(seq: list[dict[str, torch.Tensor]], decay: float) -> list[dict[str, torch.Tensor]]:
    """The average after each update, in float64: seq[0] the starting weights, seq[t] the
    weights after step t; the t-th update's decay is min(decay, (1 + t) / (10 + t))."""
    avg = {k: v.double() for k, v in seq[0].items()}
    out = [dict(avg)]
    for t, w in enumerate(seq[1:], start=1):
        d = min(decay, (1 + t) / (10 + t))
        avg = {k: d * avg[k] + (1 - d) * w[k].double() for k in avg}
        out.append(avg)
    return out


def test_the_average_follows_its_formula_and_swaps_in_place():
    torch.manual_seed(0)
    p = {"a": torch.nn.Parameter(torch.randn(3, 4)), "b": torch.nn.Parameter(torch.randn(5))}
    seq = [{k: v.detach().clone() for k, v in p.items()}]
    avg = DenseAverage(p, 0.9)
    for _ in range(40):  # past the ramp: (1 + t) / (10 + t) reaches 0.9 at t = 80
        with torch.no_grad():
            for v in p.values():
                v.add_(torch.randn_like(v))
        avg.update()
        seq.append({k: v.detach().clone() for k, v in p.items()})
    want = _by_hand(seq, 0.9)[-1]
    for k in p:
        torch.testing.assert_close(avg.shadow[k].double(), want[k], rtol=1e-5, atol=1e-6)

    storage = {k: v.data_ptr() for k, v in p.items()}
    with avg.applied():  # the average in the parameters' own storage, then back
        assert avg.in_model and all(v.data_ptr() == storage[k] for k, v in p.items())
        torch.testing.assert_close(p["a"].detach().double(), want["a"], rtol=1e-5, atol=1e-6)
        with avg.applied():  # nested: as it is
            assert avg.in_model
        with pytest.raises(RuntimeError, match="update"):
            avg.update()
    assert not avg.in_model and torch.equal(p["b"].detach(), seq[-1]["b"])

    again = DenseAverage({k: torch.nn.Parameter(v.detach().clone()) for k, v in p.items()}, 0.9)
    again.load_state_dict(avg.state_dict())
    assert again.updates == avg.updates == 40
    assert all(torch.equal(again.shadow[k], avg.shadow[k]) for k in p)

    # after a swap and after a load, an update still moves the average `shadow` holds (the
    # update's tensor lists are built once: nothing may put new tensors in their place)
    with torch.no_grad():
        for k, v in p.items():
            v.add_(1.0)
            again.params[k].copy_(v)
    rate = avg.rate()
    want = {k: avg.shadow[k] * rate + p[k].detach() * (1 - rate) for k in p}
    avg.update()
    again.update()
    for k in p:
        torch.testing.assert_close(avg.shadow[k], want[k])
        assert torch.equal(again.shadow[k], avg.shadow[k])


def _run(datasets, tmp_path, name, cfg, **kw):
    """Train `cfg`; the dense weights after every step (the trained ones, read at each log
    point, log_every 1) and the run's result."""
    seen: list[dict[str, torch.Tensor]] = []
    held: list[torch.nn.Module] = []

    def weights() -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in dense_parameters(held[0]).items()}

    def keep(model):  # the model the run trains: its dense parameters are the run's
        held.append(model)
        seen.append({k: v.detach().clone() for k, v in model.named_parameters()
                     if not v.is_meta})  # where the run starts (the tables are not made yet)
        return model, []

    def log_fn(point, step):
        if "loss" in point:
            assert step == len(seen)
            seen.append(weights())

    r = train(TrainJob(kind="student", train=cfg, model=SMALL_MODEL, data=datasets["sessions"],
                       loader=LOADER, out=tmp_path / name, transform=keep, **kw),
              log_fn=log_fn)
    return r, seen


def _saved(path):
    return torch.load(path / "state_dict.pt", weights_only=True)


@pytest.mark.parametrize("val_fraction", [0.0, 0.1], ids=["no-validation", "early-stopping"])
def test_a_run_saves_and_validates_the_average_not_its_last_steps(datasets, tmp_path,
                                                                  val_fraction):
    # six passes at a high learning rate: with validation it stops early and restores (the
    # slice held out to the end: what the run saves is the restored average itself)
    cfg = tiny_train(epochs=6, embedding_lr=0.5, lr=0.03, patience=2, log_every=1,
                     val_fraction=val_fraction, ema_decay=0.9, device="cpu", val_tail=False)
    r, seq = _run(datasets, tmp_path, "m", cfg)
    assert len(seq) == r.steps + 1
    avg = _by_hand(seq, 0.9)
    at = r.validation["restored"] if val_fraction else None
    if val_fraction:
        assert r.validation["stopped_early"] and at is not None and at < r.steps
    else:
        at = r.steps
    saved = _saved(tmp_path / "m")
    for k, want in avg[at].items():
        got = saved[k.removeprefix("module.")].double()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    # the average, not the weights trained at that step
    assert any(not torch.allclose(saved[k.removeprefix("module.")], w, atol=1e-4)
               for k, w in seq[at].items())
    if val_fraction:  # the NE validation chose it by is the average's
        vals = {h["step"]: h["val_ne"] for h in r.history if "val_ne" in h}
        assert r.validation["best_ne"] == vals[at]
    # the run's final eval is of the model it saved
    ev = evaluate(tmp_path / "m", datasets["raw"], day=-1, batch_size=1000)
    assert ev["ne"] == pytest.approx(r.eval["ne"], abs=1e-5)


@pytest.mark.parametrize("stopped", ["at-the-best", "after-the-best"])
def test_a_run_with_an_average_resumes_bit_for_bit(datasets, tmp_path, stopped):
    """The average is in the checkpoints: stopped mid-run and resumed, a run saves the model
    of the run never stopped, and its best state comes back averaged, whether the resume
    starts from the best state's own checkpoint (copied then) or a later one (read back at
    the end)."""
    # stopped early, a run stops patience x val_every = 6 steps past its best validation,
    # whichever step that is on this CPU's trajectory: a checkpoint every 4 steps puts one
    # strictly between the best and the stop on any trajectory (every 6 did not where the
    # best was step 30 and the stop 36)
    exact = CheckpointConfig(every=4, deltas=0, keep=1, quantize="none")
    cfg = tiny_train(epochs=6, embedding_lr=0.5, lr=0.03, patience=2, log_every=1,
                     val_every=3, ema_decay=0.9, device="cpu")
    assert exact.every < cfg.patience * cfg.val_every

    def job(name, **kw):
        return TrainJob(kind="student", train=cfg, model=SMALL_MODEL, data=datasets["sessions"],
                        loader=LOADER, checkpoint=exact, checkpoints=tmp_path / f"ck-{name}",
                        out=tmp_path / name, **kw)

    ref = train(job("ref"))
    # (then the newest rows train once from the best state: lrm.train.loop's tail)
    best, stop = ref.validation["best_step"], ref.validation["tail_from"]
    assert ref.validation["stopped_early"] and stop == best + cfg.patience * cfg.val_every
    kill = best if stopped == "at-the-best" else \
        next(s for s in range(best + 1, stop) if s % exact.every == 0)

    class _Stop(Exception):
        pass

    def log_fn(point, step):
        if step > kill:
            raise _Stop

    with pytest.raises(_Stop):
        train(job("k"), log_fn=log_fn)
    assert max(e.step for e in Store(tmp_path / "ck-k").entries()) == kill
    r = train(job("k", start="resume"))
    assert r.resumed_from == kill and r.steps == ref.steps and r.validation == ref.validation
    got, want = _saved(tmp_path / "k"), _saved(tmp_path / "ref")
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert r.eval == ref.eval
