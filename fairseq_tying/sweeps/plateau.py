"""Train until the validation loss stops improving: the stopping rule of a sweep's ``stopping:``.

With L_e the validation value of fairseq's ``--best-checkpoint-metric`` after epoch e (lower is
better unless ``--maximize-best-checkpoint-metric``), patience p and minimum gain g, a run stops
after epoch e ≥ max(p + 1, min_epoch) if

    min(L_{e-p+1}, …, L_e) > (1 − g) · min(L_1, …, L_{e-p})

(the last p epochs did not improve the best before them by at least a fraction g: "plateau"),
or after epoch ``max_epoch`` ("cap"). ``min_epoch`` guarantees the epoch checkpoints that an
evaluation averages (``--average-last N`` needs N). With ``plateau`` off, every run trains to
``max_epoch`` and stops there for its "budget" (equal training, with the same checkpoints and
history). fairseq's own
``--patience`` resets on any improvement, however small, so a curve creeping down by 0.1 % an
epoch would never stop.

The history lives in ``RUN/valid_history.json`` (one entry per validated epoch), written after
fairseq has saved that epoch's checkpoint. On resume it is cut back to the epochs the checkpoint
holds, and the entry of the checkpoint's own epoch is recovered from the checkpoint if the
process died between saving it and writing the history, so an interrupted run takes exactly the
decisions of an uninterrupted one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fairseq_tying.common import TRAIN_DONE, VALID_HISTORY
from fairseq_tying.common.atomic import write_json
from fairseq_tying.sweeps.sweep import Run


@dataclass(frozen=True)
class Plateau:
    patience: int = 3
    min_gain: float = 0.005
    min_epoch: int = 1
    max_epoch: int = 50
    plateau: bool = True  # off: a fixed budget of max_epoch epochs
    maximize: bool = False

    def decide(self, history: list[dict[str, Any]]) -> str | None:
        """``"plateau"``, ``"cap"``, ``"budget"`` or None (train on) after the last epoch of
        ``history``."""
        if not history:
            return None
        values = [h["value"] for h in history]
        epoch = history[-1]["epoch"]
        if self.plateau and epoch >= self.min_epoch and not self.still_learning(values):
            return "plateau"
        if epoch < self.max_epoch:
            return None
        return "cap" if self.plateau else "budget"

    def gain(self, values: list[float]) -> float | None:
        """The fraction by which the last ``patience`` values improved the best value before
        them, (min(L_1..L_{e-p}) − min(L_{e-p+1}..L_e)) / |min(L_1..L_{e-p})| for a loss
        (negative: they did worse); None with ``patience`` values or fewer."""
        if len(values) <= self.patience:
            return None
        sign = -1.0 if self.maximize else 1.0  # compare as "lower is better"
        before = min(sign * v for v in values[:-self.patience])
        recent = min(sign * v for v in values[-self.patience:])
        return (before - recent) / abs(before)

    def still_learning(self, values: list[float]) -> bool:
        """Whether the curve ``values`` (one per epoch) has not flattened by its last value:
        its last ``patience`` epochs gained at least ``min_gain``, or it is too short to tell."""
        gain = self.gain(values)
        return gain is None or gain >= self.min_gain

    @property
    def earliest_stop(self) -> int:
        """The first epoch after which the rule can stop a run."""
        if not self.plateau:
            return self.max_epoch
        return min(max(self.patience + 1, self.min_epoch), self.max_epoch)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_history(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / VALID_HISTORY
    return json.loads(path.read_text())["epochs"] if path.is_file() else []


def write_history(run_dir: Path, history: list[dict[str, Any]], metric: str) -> None:
    write_json(run_dir / VALID_HISTORY, {"metric": metric, "epochs": history}, indent=1)


def record_epoch(history: list[dict[str, Any]], epoch: int, update: int,
                 value: float) -> list[dict[str, Any]]:
    """The history with this epoch's validation as its last entry (a re-run epoch replaces it)."""
    kept = [h for h in history if h["epoch"] < epoch]
    return [*kept, {"epoch": epoch, "update": update, "value": float(value)}]


def completed_epochs(state: dict[str, Any]) -> tuple[int, bool]:
    """(epochs the checkpoint has completed, whether it was saved at an epoch's end)."""
    itr = state.get("extra_state", {}).get("train_iterator", {})
    at_end = itr.get("iterations_in_epoch", 0) == 0
    return int(itr.get("epoch", 1)) - 1, at_end


def resume_history(run_dir: Path, state: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The history as of ``checkpoint_last.pt`` (``state``; None: no checkpoint, a fresh run)."""
    if state is None:
        return []
    done, at_end = completed_epochs(state)
    history = [h for h in read_history(run_dir) if h["epoch"] <= done]
    val_loss = state.get("extra_state", {}).get("val_loss")
    last = history[-1]["epoch"] if history else 0
    if at_end and done > last and val_loss is not None:
        update = int(state["optimizer_history"][-1]["num_updates"])
        history = record_epoch(history, done, update, val_loss)
    return history


def epochs_done(run: Run) -> int:
    """Epochs the run has validated so far (its valid_history.json)."""
    history = read_history(run.run_dir)
    return history[-1]["epoch"] if history else 0


def stop_epoch(run: Run) -> int | None:
    """The epoch at which a finished run stopped (its train.done), None if not known."""
    done = run.run_dir / TRAIN_DONE
    if not done.is_file():
        return None
    return json.loads(done.read_text()).get("stop", {}).get("epoch")
