"""The training loop in one process: learning, exact resume, NaN handling, the saved model."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import traceback

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from lrm.data.loader import BatchLoader
from lrm.errors import ConfigError, LrmError
from lrm.metrics import normalized_entropy
from lrm.models.saved import load_model
from lrm.train import NonFiniteLossError, TrainJob, evaluate, train
from lrm.train.job import bce_loss
from lrm.train.data import eval_batch
from lrm.train.evaluate import predict
from lrm.checkpoint import Store
from lrm.config import CheckpointConfig, SplitConfig
from lrm.data import parquet
from lrm.data.schema import day_files
from tests.conftest import LOADER, SMALL_MODEL, poison_day, tiny_train


def _weights(path):
    return torch.load(path / "state_dict.pt", weights_only=True)


def test_short_run_lowers_ne_and_saves_a_loadable_model(datasets, tmp_path):
    out = tmp_path / "model"
    r = train(TrainJob(kind="student", train=tiny_train(epochs=2, val_fraction=0.0),
                       model=SMALL_MODEL, data=datasets["sessions"], loader=LOADER, out=out))
    losses = [h for h in r.history if "loss" in h]
    assert r.steps == losses[-1]["step"] > 40
    # train NE over the latest window falls, and the last period beats the first
    assert losses[-1]["ne_window"] < losses[0]["ne_window"]
    assert losses[-1]["loss"] < losses[0]["loss"]
    assert r.eval["ne"] < 1.0 and r.eval["auc"] > 0.6
    assert r.eval["rows"] == BatchLoader(datasets["sessions"], 512, days=[2]).num_rows()
    assert r.train_days == [0, 1] and r.eval_day == 2

    model, card = load_model(out)  # torch.load(weights_only=True), strict load
    assert card.kind == "student" and card.info["steps"] == r.steps
    assert not any(p.is_meta for p in model.parameters())
    # the unsharded model scores the held-out day as the sharded one did, and the run
    # reports what `lrm evaluate` of the model it saved says (scored the same way, streamed)
    ev = evaluate(out, datasets["raw"], day=-1, batch_size=1000)
    assert ev["rows"] == r.eval["rows"] and ev["day"] == 2
    assert ev["ne"] == pytest.approx(r.eval["ne"], rel=1e-6)
    assert ev["auc"] == pytest.approx(r.eval["auc"], abs=1e-9)
    assert ev["calibration"] == pytest.approx(r.eval["calibration"], rel=1e-6)
    # its intervals too, from the same batches (the same rows' bootstrap weights): the run
    # scored batch after batch, keeping no score (a held-out day of any size)
    same = evaluate(out, datasets["sessions"], day=-1,
                    batch_size=eval_batch(r.eval["rows"], 1, 512))
    for k in ("ne_ci", "auc_ci", "calibration_ci"):
        assert same[k] == pytest.approx(r.eval[k], rel=1e-6), k

    # cold ids: the held-out day's impressions of ads that no train day showed (the world's
    # arrivals) are still scored better than their own base rate
    days = {d: pa.concat_tables(parquet.read_table(f, columns=["ad_id", "label"]) for f in files)
            for d, files in day_files(datasets["raw"]).items()}
    ads = {d: t.column("ad_id").to_numpy() for d, t in days.items()}
    cold = torch.from_numpy(~np.isin(ads[2], np.concatenate([ads[0], ads[1]])))
    logits, labels = predict(model, BatchLoader(datasets["raw"], 4096, days=[2], dedup=False,
                                                hash_sizes=card.hash_sizes), torch.device("cpu"))
    # the loader's rows are the files' rows, in order (so `cold` marks the scored rows)
    assert (labels.numpy() == days[2].column("label").to_numpy()).all()
    assert 0.02 < cold.float().mean() < 0.2
    assert normalized_entropy(logits[cold], labels[cold]) < 1.0


def _steps(ck):
    return [(e.step, e.kind) for e in Store(ck).entries()]


def test_resume_reproduces_the_uninterrupted_run_exactly(datasets, tmp_path):
    data = datasets["sessions"]
    exact = CheckpointConfig(every=20, quantize="none")
    # on the CPU, as lrm.train.loop promises: a GPU's nondeterministic kernels (atomic
    # adds) differ run to run (seen on an H100: bottom.0.bias), resumed or not
    # 46 steps an epoch: 60 steps cross an epoch boundary; the interruption is mid-epoch
    full = train(TrainJob(kind="student", train=tiny_train(steps=60, device="cpu"),
                          model=SMALL_MODEL, data=data, checkpoint=exact, loader=LOADER,
                          out=tmp_path / "a", checkpoints=tmp_path / "ck-a"))
    assert _steps(tmp_path / "ck-a")[:2] == [(20, "baseline"), (40, "delta")]

    ck = tmp_path / "ck-b"  # --resume of an empty folder is a fresh start, bit for bit
    first = train(TrainJob(kind="student", train=tiny_train(steps=30, device="cpu"),
                           model=SMALL_MODEL, data=data, checkpoint=exact, loader=LOADER,
                           out=tmp_path / "b0", checkpoints=ck, start="resume"))
    assert first.steps == 30 and first.checkpoint == ck / "000002-step-30"
    (ck / ".tmp-000003-step-50-0badc0de").mkdir()  # a save that never finished: ignored
    second = train(TrainJob(kind="student", train=tiny_train(steps=60, device="cpu"),
                            model=SMALL_MODEL, data=data, checkpoint=exact, loader=LOADER,
                            out=tmp_path / "b", checkpoints=ck, start="resume"))
    assert second.resumed_from == 30 and second.steps == 60
    assert second.samples == full.samples

    a, b = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k  # bit for bit, tables and dense layers
    assert second.eval == full.eval
    # the resumed run's deltas go on from step 30's checkpoint
    assert _steps(ck)[:3] == [(20, "baseline"), (30, "delta"), (40, "delta")]
    assert [s for s, _ in _steps(ck)] == [20, 30, 40, 60]
    assert not (ck / ".tmp-000003-step-50-0badc0de").exists()


def test_resume_from_a_quantized_chain_stays_close(datasets, tmp_path):
    """int8 rows: the resumed run differs from the uninterrupted one by a bounded amount
    (printed; int4 and the NE after longer training: tests/checkpoint, checkpoint.ne).
    On the CPU, deterministic: the difference is the quantization's alone (on an H100 the
    runs' own nondeterminism added to it: weights 6.8e-2 apart)."""
    data = datasets["sessions"]
    full = train(TrainJob(kind="student", train=tiny_train(steps=20, device="cpu"),
                          model=SMALL_MODEL, data=data, loader=LOADER, out=tmp_path / "a"))
    ck, cfg = tmp_path / "ck", CheckpointConfig(every=10, quantize="int8")
    train(TrainJob(kind="student", train=tiny_train(steps=10, device="cpu"), model=SMALL_MODEL,
                   data=data, checkpoint=cfg, loader=LOADER, checkpoints=ck))
    r = train(TrainJob(kind="student", train=tiny_train(steps=20, device="cpu"), model=SMALL_MODEL,
                       data=data, checkpoint=cfg, loader=LOADER, out=tmp_path / "b",
                       checkpoints=ck, start="resume"))
    assert r.resumed_from == 10
    a, b = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    rel = max(float((b[k] - a[k]).norm() / a[k].norm()) for k in a)
    dne = abs(r.eval["ne"] - full.eval["ne"])
    print(f"int8 chain: weights within {rel:.2e} (relative), held-out NE {dne:.2e} from the "
          f"uninterrupted run")
    assert 0 < rel <= 0.05 and dne <= 0.005, (rel, dne)


@pytest.mark.parametrize("change, says", [
    ("batch", "batch_size"),
    ("average", "ema_decay: null then, 0.9 now"),
    ("kind", "kind"),
    ("tables", "table_rows"),
    # the ops probe: the model's whole JSON, cut at 120 characters, hid the key that changed
    ("dim", "model.embedding_dim: 8 then, 4 now"),
    ("data", "data: day 1's part-00000.parquet changed its rows"),
    ("labels", r"data: day 1's part-00000.parquet changed its content \(sha256\)"),
])
def test_resume_of_another_run_says_what_differs(datasets, tmp_path, change, says):
    data, ck = datasets["sessions"], tmp_path / "ck"
    # "average": the checkpoint's run kept no average (ema_decay 0), the resuming one does
    first = tiny_train(steps=4, ema_decay=0.0) if change == "average" else tiny_train(steps=4)
    train(TrainJob(kind="student", train=first, model=SMALL_MODEL, data=data,
                   loader=LOADER, checkpoints=ck))
    kind, cfg, model = "student", tiny_train(steps=8), SMALL_MODEL
    if change == "batch":
        cfg = tiny_train(steps=8, batch_size=256)
    elif change == "average":  # a run that keeps a dense average, from one that kept none
        cfg = tiny_train(steps=8, ema_decay=0.9)
    elif change == "kind":
        kind = "teacher"
    elif change == "dim":
        model = dataclasses.replace(SMALL_MODEL, student=dataclasses.replace(
            SMALL_MODEL.student, embedding_dim=4))
    elif change == "tables":
        model = dataclasses.replace(SMALL_MODEL, tables=dataclasses.replace(
            SMALL_MODEL.tables, max_rows=100))
    else:  # the same day folders, one file rewritten: fewer rows, or its labels inverted
        import shutil

        data = tmp_path / "changed"
        shutil.copytree(datasets["sessions"], data)
        f = sorted((data / "day=1").glob("*.parquet"))[0]
        t = parquet.read_table(f)
        if change == "labels":  # the same names and counts: only the content tells
            lab = t.column("label").combine_chunks()
            flipped = pa.ListArray.from_arrays(lab.offsets, pc.subtract(
                pa.scalar(1, pa.int8()), lab.flatten()))
            t = t.set_column(t.schema.get_field_index("label"), "label", flipped)
        else:
            t = t.slice(0, 50)
        pq.write_table(t.replace_schema_metadata(pq.read_schema(f).metadata), f)
    with pytest.raises(ConfigError, match=f"cannot resume .*{says}") as err:
        train(TrainJob(kind=kind, train=cfg, model=model, data=data, loader=LOADER, checkpoints=ck,
                       start="resume"))
    assert "\n" not in str(err.value)  # one line


def test_nan_loss_stops_with_a_clear_error_and_keeps_the_last_good_checkpoint(datasets,
                                                                              tmp_path):
    data = poison_day(datasets["sessions"], tmp_path / "poisoned", day=1)
    day0_steps = len(BatchLoader(data, 512, days=[0], drop_last=True))
    ck, out = tmp_path / "ck", tmp_path / "model"
    with pytest.raises(NonFiniteLossError) as err:
        train(TrainJob(kind="student", train=tiny_train(steps=40), model=SMALL_MODEL, data=data,
                       checkpoint=CheckpointConfig(every=5), loader=LOADER, out=out,
                       checkpoints=ck))
    assert isinstance(err.value, LrmError)
    msg = str(err.value)
    bad_step = int(msg.split("at step ")[1].split()[0])
    assert day0_steps <= bad_step <= day0_steps + 1  # the first batch that reaches day 1
    stopped = int(msg.split("stopped at step ")[1].split(")")[0])
    assert bad_step < stopped <= bad_step + 4  # seen on the host within log_every (4) steps
    good = list(range(5, bad_step + 1, 5))  # the chains of a baseline and deltas, all kept
    assert "nan" in msg and f"step-{good[-1]}" in msg
    assert [s for s, _ in _steps(ck)] == good
    assert not out.exists()  # no final model from a failed run

    # the kept checkpoint is usable: resumed (on its own data) it makes a model
    r = train(TrainJob(kind="student", train=tiny_train(steps=good[-1]), model=SMALL_MODEL,
                       data=data, loader=LOADER, checkpoints=ck, start="resume"))
    assert r.resumed_from == good[-1] and math.isfinite(r.eval["ne"])
    # data fixed is other data: a resume would mix two datasets, so it starts afresh
    with pytest.raises(ConfigError, match="day 1's part-00000.parquet changed its content"):
        train(TrainJob(kind="student", train=tiny_train(steps=40), model=SMALL_MODEL,
                       data=datasets["sessions"], loader=LOADER, checkpoints=ck,
                       start="resume"))


def test_bad_split_is_a_config_error(datasets):
    with pytest.raises(ConfigError, match="eval_day"):
        train(TrainJob(kind="student", train=tiny_train(), model=SMALL_MODEL,
                       data=datasets["sessions"], split=SplitConfig(days=[1, 2], eval_day=2),
                       loader=LOADER))
    with pytest.raises(ConfigError, match="no data for days"):
        train(TrainJob(kind="student", train=tiny_train(), model=SMALL_MODEL,
                       data=datasets["sessions"], split=SplitConfig(days=[0, 7]), loader=LOADER))


def test_warm_start_custom_loss_and_teacher_column(datasets, tmp_path):
    first = train(TrainJob(kind="student", train=tiny_train(steps=10), model=SMALL_MODEL,
                           data=datasets["sessions"], loader=LOADER, out=tmp_path / "a"))

    # a copy of the raw data with a teacher logit per impression (as augment writes it)
    aug = tmp_path / "aug"
    for f in sorted(datasets["raw"].rglob("*.parquet")):
        t = parquet.read_table(f)
        t = t.append_column(pa.field("teacher_logit", pa.float32()),
                            pa.array(np.full(t.num_rows, -3.5, np.float32)))
        dst = aug / f.relative_to(datasets["raw"])
        dst.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(t.replace_schema_metadata(pq.read_schema(f).metadata), dst)

    seen = []

    def loss_fn(model, batch):  # distill toward the teacher; report the label loss
        assert batch.teacher_logits is not None
        seen.append(float(batch.teacher_logits.mean()))
        logits = model(batch)
        serving = F.binary_cross_entropy_with_logits(logits, batch.labels)
        return serving + 0.0 * F.mse_loss(logits, batch.teacher_logits), serving

    tiny = dict(lr=1e-12, embedding_lr=1e-12)  # the warm start must carry the weights over
    r = train(TrainJob(kind="student", train=tiny_train(steps=2, **tiny), model=SMALL_MODEL,
                       data=aug, loader=LOADER, init_from=tmp_path / "a", loss=loss_fn,
                       teacher_column="teacher_logit", out=tmp_path / "b", start="warm"))
    assert seen == [-3.5, -3.5]
    assert r.eval["ne"] == pytest.approx(first.eval["ne"], abs=1e-5)
    assert load_model(tmp_path / "b")[1].info["init_from"] == str(tmp_path / "a")
    other = dataclasses.replace(SMALL_MODEL, student=dataclasses.replace(
        SMALL_MODEL.student, top_mlp=[8]))
    with pytest.raises(ConfigError, match="init_from"):
        train(TrainJob(kind="student", train=tiny_train(steps=2), model=other, data=aug,
                       loader=LOADER, init_from=tmp_path / "a", start="warm"))


def test_an_overfitting_run_stops_early_and_keeps_its_best_validated_state(datasets,
                                                                           tmp_path):
    data, out = datasets["sessions"], tmp_path / "model"
    # six passes at a high table learning rate overfit the tiny data within two
    # (the slice held out to the end: the saved model is the best state as validated)
    cfg = tiny_train(epochs=6, embedding_lr=0.5, lr=0.03, patience=2, log_every=8,
                     val_tail=False)
    r = train(TrainJob(kind="student", train=cfg, model=SMALL_MODEL, data=data, loader=LOADER,
                       out=out))
    s, v = r.schedule, r.validation
    assert s["val_batches"] > 0 and v["stopped_early"] and r.steps < s["steps"]
    vals = [(h["step"], h["val_ne"]) for h in r.history if "val_ne" in h]
    best = min(vals, key=lambda x: x[1])
    assert (v["best_step"], v["best_ne"]) == best and v["restored"] == best[0] < r.steps
    assert all(ne >= best[1] for _, ne in vals[-2:])  # patience 2: two without a new best
    # the saved model is the best state: it scores the validation slice at the best NE
    model, card = load_model(out)
    val = BatchLoader(data, 512, days=[0, 1], drop_last=True, hash_sizes=card.hash_sizes)
    val.load_state_dict({"batch": s["epoch_batches"], "batch_size": 512, "world_size": 1})
    with torch.no_grad():
        logits, labels = zip(*[(model(b), b.labels) for b in val])
    assert normalized_entropy(torch.cat(logits), torch.cat(labels)) == pytest.approx(
        v["best_ne"], abs=1e-5)


class _Stop(Exception):
    pass


def test_a_run_stopped_after_its_best_validation_resumes_to_the_same_model(datasets,
                                                                          tmp_path):
    """The early-stopping state is part of what a checkpoint restores: stopped after its
    best validation (at a checkpoint that is not the best step) and resumed, a run stops
    where the uninterrupted one stopped and keeps the same best state, bit for bit."""
    ck_cfg = CheckpointConfig(every=6, deltas=0, keep=1)  # one chain kept, and the pinned

    def job(name, **kw):
        return TrainJob(kind="student", train=cfg, model=SMALL_MODEL, data=datasets["sessions"],
                        loader=LOADER, checkpoint=ck_cfg, checkpoints=tmp_path / f"ck-{name}",
                        out=tmp_path / name, **kw)

    # the first seed whose run stops early with its best step on no periodic checkpoint and
    # a kill point after it: the first checkpoint of a validation step after the best (the
    # periodic save comes before that step's validation, which the resumed run must run)
    for seed in range(8):
        cfg = tiny_train(epochs=6, embedding_lr=0.5, lr=0.03, patience=2, log_every=1,
                         val_every=3, seed=seed)
        ref = train(job(f"ref{seed}"))
        best, stop = ref.validation["best_step"], ref.steps
        kill = next((s for s in range(best + 1, stop)
                     if s % ck_cfg.every == 0 and s % cfg.val_every == 0), None)
        if ref.validation["stopped_early"] and best % ck_cfg.every and kill is not None:
            break
    else:
        pytest.fail("no seed stops early after a kill point: the test cannot run")
    assert ref.validation["restored"] == best < stop

    def log_fn(point, step):
        if step > kill:
            raise _Stop

    with pytest.raises(_Stop):
        train(job("k"), log_fn=log_fn)
    assert max(s for s, _ in _steps(tmp_path / "ck-k")) == kill
    r = train(job("k", start="resume"))
    assert r.resumed_from == kill and r.steps == stop
    assert r.validation == ref.validation
    got, want = _weights(tmp_path / "k"), _weights(tmp_path / f"ref{seed}")
    assert all(torch.equal(got[k], want[k]) for k in want)


def _fingerprint(b) -> bytes:
    """A batch by its rows' dense values and labels (not its hashed ids: table sizes apart)."""
    return hashlib.blake2b(b.dense.detach().cpu().numpy().tobytes()
                           + b.labels.detach().cpu().numpy().tobytes(), digest_size=16).digest()


def test_a_run_of_several_passes_trains_on_every_row_the_newest_last(datasets, tmp_path):
    """A run that validates (several passes) holds out its train days' newest batches to
    stop early on; once the best state is back they train too, in time order: every batch
    of the train days reaches the optimizer, and the run's last step is the newest one.
    (Red with the pass over the validation slice dropped: its batches never train.)"""
    data, seen = datasets["sessions"], []

    def loss(model, b):
        seen.append(_fingerprint(b))
        return bce_loss(model, b)

    cfg = tiny_train(epochs=3, patience=1, log_every=8)
    r = train(TrainJob(kind="student", train=cfg, model=SMALL_MODEL, data=data, loader=LOADER,
                       out=tmp_path / "m", loss=loss))
    assert r.schedule["val_batches"] > 0 and r.validation["best_ne"] is not None
    batch, card = r.schedule["batch_size"], load_model(tmp_path / "m")[1]
    rows = [_fingerprint(b) for b in BatchLoader(data, batch, days=[0, 1], drop_last=True,
                                                  hash_sizes=card.hash_sizes)]
    assert len(rows) == r.schedule["epoch_batches"] + r.schedule["val_batches"]
    assert set(rows) <= set(seen), f"{len(set(rows) - set(seen))} batches never trained"
    assert seen[-1] == rows[-1]  # the newest rows last
    # off, the slice is held out as before: its batches never train
    seen.clear()
    off = train(TrainJob(kind="student", train=dataclasses.replace(cfg, val_tail=False),
                         model=SMALL_MODEL, data=data, loader=LOADER, loss=loss))
    assert not set(rows[-off.schedule["val_batches"]:]) & set(seen)


@pytest.mark.parametrize("ema", [0.0, 0.9])
def test_a_run_killed_in_its_pass_over_the_newest_rows_resumes_to_the_same_model(
        datasets, tmp_path, ema):
    """Killed after the best state is back, in the pass over the validation slice (and the
    rows after a best state of the first pass), a run resumed from its checkpoints ends
    with the weights of the run never stopped, bit for bit: the delta checkpoints after the
    best state was put back hold every row (red when the restore is not announced to the
    checkpoints: the next delta holds only the rows a step moved), and the resumed pass
    reads on from where it was (with a dense average too)."""
    ck_cfg = CheckpointConfig(every=1, deltas=50, keep=1, quantize="none")

    def job(name, **kw):
        return TrainJob(kind="student", train=cfg, model=SMALL_MODEL, data=datasets["sessions"],
                        loader=LOADER, checkpoint=ck_cfg, checkpoints=tmp_path / f"ck-{name}",
                        out=tmp_path / name, **kw)

    for seed in range(8):  # the first seed whose best state is not its last: one put back
        cfg = tiny_train(epochs=6, embedding_lr=0.5, lr=0.03, patience=2, log_every=1,
                         val_every=3, seed=seed, device="cpu", ema_decay=ema)
        ref = train(job(f"ref{seed}"))
        v = ref.validation
        if v["restored"] is not None and ref.steps - v["tail_from"] >= 3:
            break
    else:
        pytest.fail("no seed puts a best state back: the test cannot run")
    kill = v["tail_from"] + 2

    def log_fn(point, step):
        if step > kill:
            raise _Stop

    with pytest.raises(_Stop):
        train(job("k"), log_fn=log_fn)
    r = train(job("k", start="resume"))
    assert r.resumed_from == kill and r.steps == ref.steps and r.validation == v
    got, want = _weights(tmp_path / "k"), _weights(tmp_path / f"ref{seed}")
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_the_output_starts_at_the_training_ctr(datasets, tmp_path):
    tiny = dict(lr=1e-12, embedding_lr=1e-12)  # one step that moves nothing measurable
    train(TrainJob(kind="student", train=tiny_train(steps=1, **tiny), model=SMALL_MODEL,
                   data=datasets["sessions"], loader=LOADER, out=tmp_path / "m"))
    model, _ = load_model(tmp_path / "m")
    labels = torch.cat([b.labels for b in BatchLoader(datasets["raw"], 4096, days=[0, 1])])
    ctr = float(labels.mean())
    assert float(model.head.bias) == pytest.approx(math.log(ctr / (1 - ctr)), abs=1e-5)


@pytest.mark.parametrize("steps, warns", [(1, False), (5, True), (0, False)])
def test_literal_steps_over_several_passes_warn_that_nothing_validates(datasets, steps,
                                                                       warns, caplog):
    """train.steps is taken literally (no validation slice): a user whose steps make
    several passes is told, since repeated passes can overfit with nothing to stop them.
    Passes given as epochs (steps 0) validate, and say nothing."""
    cfg = tiny_train(steps=steps, batch_size=8192, epochs=2, min_steps=0)
    with caplog.at_level("WARNING", logger="lrm"):
        r = train(TrainJob(kind="student", train=cfg, model=SMALL_MODEL, data=datasets["sessions"],
                           loader=LOADER))
    assert r.schedule["epochs"] == (2 if steps == 0 else math.ceil(steps / 2))
    assert (r.schedule["val_batches"] > 0) == (steps == 0)
    said = [m for m in caplog.messages if "no validation slice" in m]
    assert bool(said) == warns and (not warns or f"train.steps={steps} is " in said[0])


# -- no host sync inside a step --------------------------------------------------------
# On a GPU the host runs ahead of the device until Python reads a value back: a tensor
# turned into a number, list, bool or numpy array, or an op whose output size depends on
# the values. Between log points a step must do neither (lrm.train.loop's promise: the
# guard and the meter stay on the device). No GPU is needed to check it: torch's function
# mode sees every torch call made from Python, on any device.
_READS = {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__",
          "nonzero", "argwhere", "unique", "unique_consecutive", "masked_select", "equal",
          "allclose"}
# Reads inside the libraries' own machinery, which torchrec's DLRM pays alike: fbgemm's
# iteration counter (a host tensor), torchrec's splits all-to-all (it needs the sizes on
# the host) and its log of them, its KJT checks on the first batches. Matched as (file,
# function) of the frame that reads, past torchrec's tolist helpers (which also serve the
# reads lrm avoids, e.g. a KJT's length per key computed from its lengths).
_LIBRARY_READS = {
    ("fbgemm_gpu/split_table_batched_embeddings_ops_training.py", "forward"),
    ("fbgemm_gpu/split_table_batched_embeddings_ops_training.py", "_generate_vbe_metadata"),
    ("torchrec/distributed/embedding_sharding.py", "__init__"),
    ("torchrec/distributed/dist_data.py", "_wait_impl"),
    ("torchrec/sparse/jagged_tensor_validator.py", "*"),
}
_HELPERS = ("_safe_tolist", "_safe_tolist_2d")


class _ReadRecorder(torch.overrides.TorchFunctionMode):
    """Records every read (see _READS) not on the _LIBRARY_READS list, with its stack."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        sized_by_values = (  # output sizes the host must read from the device first
            name == "__getitem__" and any(  # a boolean mask
                isinstance(i, torch.Tensor) and i.dtype == torch.bool
                for i in (args[1] if isinstance(args[1], tuple) else (args[1],)))
            or name == "where" and len(args) + len(kwargs or {}) == 1  # where(cond)
            or name == "repeat_interleave" and (kwargs or {}).get("output_size") is None
            and isinstance(args[1] if len(args) > 1 else (kwargs or {}).get("repeats", args[0]),
                           torch.Tensor)
            or name == "bincount")
        if name in _READS or sized_by_values:
            stack = [f for f in traceback.extract_stack()[:-1]
                     if "/torch/" not in f.filename.replace("\\", "/")]
            reader = next((f for f in reversed(stack) if f.name not in _HELPERS), None)
            where = reader.filename.replace("\\", "/") if reader else ""
            if reader is None or not any(where.endswith(path) and fn in ("*", reader.name)
                                         for path, fn in _LIBRARY_READS):
                self.reads.append(f"{name}:\n" + "".join(
                    f"    {f.filename}:{f.lineno} {f.name}\n" for f in stack[-8:]))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", ["student", "teacher"])
def test_steps_between_log_points_read_nothing_back_from_the_device(kind, datasets, tmp_path,
                                                                      monkeypatch):
    """Every optimizer step (the pipeline's progress: next batch, input dist, forward, loss,
    guard, meter, backward, both optimizers) runs with no read back to the host; the log
    points, evaluations and checkpoint saves between steps may read (a save finds the rows
    that changed in the optimizer's state: lrm.checkpoint.tracker)."""
    from lrm.train.steps import Steps

    recorder, step = _ReadRecorder(), Steps.step

    def recorded(self, batches):
        with recorder:
            return step(self, batches)

    monkeypatch.setattr(Steps, "step", recorded)
    log_every, steps = 5, 12
    r = train(TrainJob(kind=kind, train=tiny_train(steps=steps, log_every=log_every),
                       model=SMALL_MODEL, data=datasets["sessions"], loader=LOADER,
                       checkpoint=CheckpointConfig(every=10), checkpoints=tmp_path / "ck"))
    assert r.steps == steps
    assert not recorder.reads, "a step reads back from the device:\n" + \
        "\n".join(recorder.reads[:5])
