"""The saved model folder (lrm.models.saved) and its pyfunc wrapper (without an MLflow store)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from lrm import io
from lrm.config import TrainConfig, from_dict
from lrm.data import synthetic
from lrm.data.loader import BatchLoader
from lrm.errors import ConfigError, DataError
from lrm.io import MARKER
from lrm.models.saved import CARD, WEIGHTS, load_model, load_weights, model_hash, read_card, \
    save_model
from lrm.serving.pyfunc import OUTPUT, column_types, example_frame, input_columns, log_model, \
    predict_frame
from lrm.train import evaluate
from tests.conftest import SMALL_MODEL, TINY, other_weights


@pytest.fixture(scope="module")
def model_dir(student_dir):  # noqa: F811
    return student_dir


def test_card_round_trips_and_rejects_other_formats(model_dir, tmp_path):
    card = read_card(model_dir)
    assert card.kind == "student" and card.model == SMALL_MODEL
    # the user table is as large as the tiny world's user id space
    assert card.hash_sizes["user_id"] == synthetic.vocab(TINY)["user_id"] == 4000
    assert card.info["steps"] == 6
    with io.atomic_dir(tmp_path / "m") as tmp:  # a card lrm wrote, of another format
        (tmp / CARD).write_text(json.dumps({**json.loads(card.to_json()), "format": 99}))
    with pytest.raises(DataError, match="format 99"):
        read_card(tmp_path / "m")
    with io.atomic_dir(tmp_path / "k") as tmp:  # a kind this lrm cannot build: one line
        (tmp / CARD).write_text(json.dumps({**json.loads(card.to_json()), "kind": "wide"}))
    with pytest.raises(DataError, match=r"k/model\.json, field kind: unknown model kind "
                                        r"'wide'; this lrm builds teacher, student"):
        read_card(tmp_path / "k")


def test_the_content_hash_follows_what_predicts_not_the_training_log(model_dir, tmp_path):
    """Two folders hash alike exactly when they predict alike (the registry's "registered
    already", augment's teacher version). Plant: keep `info` in the hashed card, or hash
    the card alone."""
    import dataclasses

    card = read_card(model_dir)
    weights = load_weights(model_dir)
    logged = save_model(tmp_path / "a", dataclasses.replace(card, info={"steps": 999}),
                        weights)
    assert model_hash(logged) == model_hash(model_dir)  # another training summary
    k = next(k for k, v in weights.items() if v.is_floating_point())
    other = save_model(tmp_path / "b", card, {**weights, k: weights[k] + 1})
    assert model_hash(other) != model_hash(model_dir)  # another weight
    sizes = save_model(tmp_path / "c", dataclasses.replace(
        card, hash_sizes={**card.hash_sizes, "user_id": 1}), weights)
    assert model_hash(sizes) != model_hash(model_dir)  # fed otherwise


def test_pyfunc_scores_rows_as_the_loader_feeds_them(datasets, model_dir):
    model, card = load_model(model_dir)
    frame = example_frame(datasets["sessions"], day=2, rows=64)
    assert list(frame.columns) == input_columns(card.schema)
    assert list(column_types(card.schema)) == list(frame.columns)
    got = predict_frame(model, card, frame)[OUTPUT].to_numpy()
    # the same first 64 impressions (the sessions layout's order: a user's sessions together)
    batch = next(iter(BatchLoader(datasets["sessions"], 64, days=[2], dedup=False,
                                  hash_sizes=card.hash_sizes)))
    with torch.no_grad():
        want = torch.sigmoid(model(batch)).double().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_pyfunc_takes_missing_values_and_columns(datasets, model_dir):
    model, card = load_model(model_dir)
    frame = example_frame(datasets["sessions"], day=2, rows=8)
    frame.loc[0, "user_id"] = None
    frame.loc[1, "d_bid"] = np.nan
    frame.at[2, "user_history"] = None
    p = predict_frame(model, card, frame.drop(columns=["ad_format", "session_id"]))[OUTPUT]
    assert len(p) == 8 and p.between(0, 1).all()
    assert len(predict_frame(model, card, frame.iloc[:0])) == 0
    frame["ad_id"] = frame["ad_id"].astype(object)
    frame.loc[3, "ad_id"] = "x"
    with pytest.raises(DataError, match="ad_id"):
        predict_frame(model, card, frame)


def test_the_pyfunc_names_a_column_it_does_not_read(datasets, model_dir):
    from mlflow.exceptions import MlflowException

    from lrm.serving.pyfunc import LrmModel

    served = LrmModel()
    served.model, served.card = load_model(model_dir)
    frame = example_frame(datasets["sessions"], day=2, rows=4)
    frame.loc[0, "user_id"] = None  # a missing id: scored
    assert served.predict(None, frame)[OUTPUT].between(0, 1).all()
    with pytest.raises(MlflowException, match="field usr_id: unknown column") as e:
        served.predict(None, frame.rename(columns={"user_id": "usr_id"}))
    assert e.value.get_http_status_code() == 400


def _parsed(split: dict) -> "pd.DataFrame":
    """A dataframe_split request body as MLflow's scoring server parses it (the same calls)."""
    from mlflow.pyfunc.scoring_server import _split_data_and_params, infer_and_parse_data

    return infer_and_parse_data(_split_data_and_params(json.dumps({"dataframe_split": split}))[0])


@pytest.mark.parametrize("edit, says", [
    (lambda s: s["data"][1].__setitem__(s["columns"].index("user_id"), 2**70),
     r"field user_id: row 2: 1180591620717411303424 is outside the 64-bit id range"),
    (lambda s: s["data"][0].__setitem__(s["columns"].index("user_history"), 5),
     r"field user_history: row 1: '5' is not a list of ids"),
    (lambda s: s["data"][2].__setitem__(s["columns"].index("user_history"), [3, True]),
     r"field user_history: row 3: in the list: true is not an id"),
    (lambda s: [r.__setitem__(s["columns"].index("ad_id"), True) for r in s["data"]],
     r"field ad_id: row 1: true is not an id"),
    (lambda s: s["data"][3].__setitem__(s["columns"].index("ad_id"), "7"),
     r"field ad_id: row 4: str '7' is not an id"),
    (lambda s: s["data"][0].__setitem__(s["columns"].index("d_bid"), "high"),
     r"field d_bid: row 1: 'high' is not a number"),
    (lambda s: (s["columns"].append("ad_id"), [r.append(1) for r in s["data"]]),
     r"field ad_id: column named twice"),
])
def test_a_bad_request_is_a_400_naming_the_field_and_row(datasets, model_dir, edit, says):
    """The probe's serving bodies (issue 45): an id past 64 bits, a scalar for a list, a
    column named twice each got a 400 "unexpected error" carrying a Python stack trace with
    server paths, and true was taken as id 1. Parsed as the scoring server parses them.
    Red with _check_values dropped (the traceback, or true scored) or check_frame's
    duplicate check."""
    from mlflow.exceptions import MlflowException

    from lrm.serving.pyfunc import LrmModel

    served = LrmModel()
    served.model, served.card = load_model(model_dir)
    split = json.loads(example_frame(datasets["sessions"], day=2, rows=4)
                       .to_json(orient="split", index=False))
    assert served.predict(None, _parsed(split))[OUTPUT].between(0, 1).all()
    edit(split)
    with pytest.raises(MlflowException, match=f"^request, {says}$") as e:
        served.predict(None, _parsed(split))
    assert e.value.get_http_status_code() == 400 and "Traceback" not in e.value.message
    assert "stack_trace" not in json.loads(e.value.serialize_as_json())


def test_an_internal_failure_answers_without_a_trace(datasets, model_dir, monkeypatch):
    """Whatever else fails while scoring is logged on the server, and the client gets one
    line (a 500), not the server's paths. Red with the catch-all dropped."""
    from mlflow.exceptions import MlflowException

    from lrm.serving import pyfunc

    served = pyfunc.LrmModel()
    served.model, served.card = load_model(model_dir)
    monkeypatch.setattr(pyfunc, "predict_frame", lambda *a: 1 / 0)
    with pytest.raises(MlflowException, match="could not score the request") as e:
        served.predict(None, example_frame(datasets["sessions"], day=2, rows=2))
    assert e.value.get_http_status_code() == 500
    assert "stack_trace" not in json.loads(e.value.serialize_as_json())


def test_train_config_validates_at_load():
    with pytest.raises(ConfigError, match="train.batch_size: must be >= 1"):
        from_dict(TrainConfig, {"batch_size": 0}, "train")
    with pytest.raises(ConfigError, match="unknown keys"):
        from_dict(TrainConfig, {"batchsize": 8}, "train")
    with pytest.raises(ConfigError, match="device"):
        TrainConfig(device="tpu")


def test_a_model_folder_is_loaded_only_as_lrm_wrote_it(model_dir, datasets, tmp_path):
    """Another model's weights copied in were scored (NE 0.9639 against the folder's own
    0.9477), served and trained on: every load checks the card and the weights against the
    hashes .lrm-output.json recorded, and names the file. Red with the check dropped from
    load_weights (the weights) or read_card (the card)."""
    copy = shutil.copytree(model_dir, tmp_path / "copy")  # a whole copy: loads
    assert load_model(copy)[1] == read_card(model_dir)
    swapped = shutil.copytree(model_dir, tmp_path / "swapped")
    other_weights(swapped)
    says = r"swapped/state_dict\.pt: changed since lrm wrote it \(sha256 [0-9a-f]{12} " \
           r"recorded in \.lrm-output\.json, [0-9a-f]{12} now\)"
    with pytest.raises(DataError, match=says):
        load_model(swapped)
    with pytest.raises(DataError, match=says):
        evaluate(swapped, datasets["sessions"], day=-1, batch_size=1000)
    with pytest.raises(DataError, match=says):  # packaged for serving: refused first
        log_model(swapped, datasets["sessions"], 2)
    edited = shutil.copytree(model_dir, tmp_path / "edited")
    card = json.loads((edited / CARD).read_text())
    (edited / CARD).write_text(json.dumps({**card, "info": {**card["info"], "steps": 1}}))
    with pytest.raises(DataError, match=r"edited/model\.json: changed since lrm wrote it"):
        read_card(edited)
    (copy / MARKER).unlink()  # copied without its record: nothing to check against
    with pytest.raises(DataError, match=r"copy/\.lrm-output\.json: missing: lrm cannot tell"):
        load_model(copy)
