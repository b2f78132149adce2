"""The plateau stopping rule against an independent statement of it, and its resume logic."""

from __future__ import annotations

import itertools
import random

import pytest

from fairseq_tying.sweeps import plateau
from fairseq_tying.sweeps.plateau import Plateau
from tests.helpers import first_stop


def history(values: list[float], updates_per_epoch: int = 10) -> list[dict]:
    return [{"epoch": e, "update": e * updates_per_epoch, "value": v}
            for e, v in enumerate(values, start=1)]


def replay(rule: Plateau, values: list[float]) -> tuple[int, str]:
    for e in range(1, len(values) + 1):
        if reason := rule.decide(history(values[:e])):
            return e, reason
    return len(values), "running"


def test_rule_matches_an_independent_statement():
    rng = random.Random(0)
    for patience, gain in itertools.product((1, 2, 3), (0.0, 0.005, 0.05)):
        for _ in range(60):
            values, v = [], 5.0
            for _ in range(25):
                v *= 1 - rng.choice([0.0, 0.001, 0.004, 0.01, 0.03, -0.01])
                values.append(v)
            rule = Plateau(patience=patience, min_gain=gain, max_epoch=20)
            assert replay(rule, values) == first_stop(values, patience, gain, 20)


def test_small_steady_gains_stop_where_fairseq_patience_would_not():
    values = [4.0 * 0.999 ** e for e in range(30)]  # 0.1 % better every epoch
    assert replay(Plateau(patience=3, min_gain=0.005, max_epoch=50), values) == (4, "plateau")
    values = [4.0 * 0.99 ** e for e in range(30)]   # 1 % better every epoch: never a plateau
    assert replay(Plateau(patience=3, min_gain=0.005, max_epoch=25), values) == (25, "cap")


def test_min_epoch_delays_the_plateau():
    flat = [3.0] * 10
    assert replay(Plateau(patience=2, min_gain=0.01, max_epoch=50), flat) == (3, "plateau")
    assert replay(Plateau(patience=2, min_gain=0.01, min_epoch=6, max_epoch=50), flat) == \
        (6, "plateau")


def test_without_the_plateau_every_run_trains_its_budget():
    rule = Plateau(patience=2, min_gain=0.01, max_epoch=7, plateau=False)
    assert replay(rule, [3.0] * 10) == (7, "budget")
    assert rule.earliest_stop == 7


def test_maximized_metric():
    rule = Plateau(patience=2, min_gain=0.01, maximize=True, max_epoch=50)
    assert replay(rule, [10.0, 20.0, 30.0, 30.1, 30.2, 40.0]) == (5, "plateau")
    assert replay(rule, [10.0, 20.0, 30.0, 31.0, 32.0]) == (5, "running")


def test_rerun_epoch_replaces_its_entry():
    h = history([3.0, 2.5, 2.4])
    h = plateau.record_epoch(h, 2, 25, 2.2)  # epoch 2 validated again after a resume
    assert [x["epoch"] for x in h] == [1, 2] and h[-1]["value"] == 2.2


def _state(epoch_next: int, iters: int, val_loss: float | None, updates: int) -> dict:
    return {"extra_state": {"train_iterator": {"epoch": epoch_next, "iterations_in_epoch": iters},
                            "val_loss": val_loss},
            "optimizer_history": [{"num_updates": updates}]}


def test_resume_history_follows_the_checkpoint(tmp_path):
    plateau.write_history(tmp_path, history([3.0, 2.5, 2.4, 2.3]), "nll_loss")
    # the checkpoint holds 3 epochs: epoch 4's entry (validated, not saved) is dropped
    assert [h["epoch"] for h in plateau.resume_history(tmp_path, _state(4, 0, 2.4, 30))] == \
        [1, 2, 3]
    # killed between saving epoch 5 and writing the history: recovered from the checkpoint
    got = plateau.resume_history(tmp_path, _state(6, 0, 2.2, 50))
    assert got[-1] == {"epoch": 5, "update": 50, "value": 2.2} and len(got) == 5
    # saved mid-epoch 3: only complete epochs count
    assert [h["epoch"] for h in plateau.resume_history(tmp_path, _state(3, 7, 2.5, 27))] == \
        [1, 2]
    assert plateau.resume_history(tmp_path, None) == []


@pytest.mark.parametrize("value", [history([1.0]), []])
def test_no_decision_without_enough_epochs(value):
    assert Plateau(patience=3).decide(value) is None


def test_the_gain_is_the_rules_own_quantity():
    """``gain``: by how much the last ``patience`` epochs beat the best before them, written
    out; a run stops for a plateau exactly where it falls under ``min_gain``."""
    rule = Plateau(patience=3, min_gain=0.005, max_epoch=50)
    values = [6.0, 5.0, 4.6, 4.55, 4.52, 4.51]
    assert rule.gain(values) == pytest.approx((4.6 - 4.51) / 4.6)
    assert rule.still_learning(values) and not rule.still_learning([*values, 4.51, 4.50, 4.50])
    assert rule.gain(values[:3]) is None and rule.still_learning(values[:3])  # too few to tell
    assert rule.gain([4.0, 4.1, 4.2, 4.3]) < 0  # worse than before: not learning
    rng = random.Random(1)
    for _ in range(200):
        values = [5.0 * (1 - rng.uniform(-0.01, 0.03)) ** e for e in range(1, 12)]
        flat = all(v > min(values[:-3]) * (1 - 0.005) for v in values[-3:])  # helpers.first_stop
        assert rule.still_learning(values) == (not flat)
