"""Start a sweep's runs from another sweep's epoch checkpoints (the sweep's ``continue_from:``).

A run of, say, the equal-training sweep is the command of the like-named run of the plateau
sweep with another training length. Batches of epoch e come from seed + e alone
(``--update-epoch-batch-itr``), so a run resumed at an epoch boundary trains exactly like an
uninterrupted one, and starting from the other run's checkpoints gives the model that training
from epoch 1 would give, without training its first epochs again. It is a cache: where it
cannot serve (no finished run there, or one that trained past this run's last epoch), the run
trains from epoch 1 and the plan says so. A run there whose command differs is refused.
The launch's plan (``plan.py``) decides (:func:`source_epochs`), its executor copies
(:func:`copy_from`).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from fairseq_tying.common import CONTINUED_FROM, RANKS, RUN_JSON, TRAIN_DONE, VALID_HISTORY
from fairseq_tying.common.atomic import atomic_write, building_dir, write_json
from fairseq_tying.common.run_spec import read_run_json
from fairseq_tying.sweeps.config import Run, SweepError, data_bin

LENGTH_FLAGS = {"--max-epoch"}  # what may differ between the two runs' commands
TRAIN_LOG = Path("logs") / "train.rank0.log"
TRAINING_CHECKPOINT = re.compile(r"checkpoint(\d+|_last|_best)\.pt")  # what fairseq wrote


def without_length(args: list[str]) -> list[str]:
    """A run's fairseq arguments without those that set its training length."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in LENGTH_FLAGS:
            skip = True
        else:
            out.append(a)
    return out


def check_source(run: Run, source: Path) -> None:
    """Refuse a run at ``source`` that is still training, or is not ``run`` up to its
    training length."""
    if not (source / TRAIN_DONE).is_file():
        raise SweepError(f"continue_from: {source} has not finished training; finish its sweep "
                         f"first (or remove that folder, and {run.name} trains from epoch 1)")
    theirs = read_run_json(source)
    ours = without_length(run.identity.train_args)
    other = without_length(theirs.identity.train_args or [])
    if ours != other:
        raise SweepError(f"continue_from: {source} was trained with another command than "
                         f"{run.name} ({'; '.join(differences(ours, other))}); continue only "
                         "from the same sweep with another `stopping:`, or remove continue_from")
    mine, theirs_bin = data_bin(run.data_dir), Path(theirs.data_bin or "")
    if mine != theirs_bin and not same_dictionaries(mine, theirs_bin):
        raise SweepError(f"continue_from: {source} was trained on {theirs_bin}, whose "
                         f"dictionaries differ from (or are missing beside) {mine}'s")


def _flags(args: list[str]) -> dict[str, str]:
    """``--flag value`` pairs (a flag without a value maps to "")."""
    out: dict[str, str] = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else ""
            out[a] = "" if nxt.startswith("--") else nxt
    return out


def _show(flags: dict[str, str], flag: str) -> str:
    return flags.get(flag, "(absent)") or "(set)"


def differences(ours: list[str], theirs: list[str], here: str = "here",
                there: str = "there") -> list[str]:
    """Each flag whose value differs, e.g. ``--lr 0.004 here, 0.005 there``; the same flags in
    another order say so."""
    a, b = _flags(ours), _flags(theirs)
    diff = [f"{f} {_show(a, f)} {here}, {_show(b, f)} {there}"
            for f in sorted(set(a) | set(b)) if a.get(f) != b.get(f)]
    if not diff and ours != theirs:
        diff = [f"the same flags in another order {here} than {there}"]
    return diff


def same_dictionaries(a: Path, b: Path) -> bool:
    """Whether the data dirs ``a`` and ``b`` hold the same dictionaries (``dict*.txt``)."""
    dicts = sorted(p.name for p in a.glob("dict*.txt"))
    return bool(dicts) and all((b / d).is_file() and (a / d).read_bytes() == (b / d).read_bytes()
                               for d in dicts)


def source_epochs(run: Run, source: Path) -> tuple[int | None, str]:
    """The epochs ``run`` continues from at ``source`` (checked: ``check_source``), or None and
    why it trains from epoch 1 instead (no run there, no checkpoints, no validation history, or
    trained past this run's last epoch). Decides only: :func:`copy_from` copies."""
    if not (source / RUN_JSON).is_file():
        return None, f"no run at {source} to continue"
    check_source(run, source)
    if not (source / "checkpoints" / "checkpoint_last.pt").is_file():
        return None, f"{source} has no checkpoints left"
    history_file = source / VALID_HISTORY
    valid = json.loads(history_file.read_text()) if history_file.is_file() else {"epochs": []}
    if not valid["epochs"]:
        return None, f"{source} has no validation history"
    trained, last = valid["epochs"][-1]["epoch"], run.stopping["max_epoch"]
    if trained > last:
        return None, f"{source} trained {trained} epochs, past this sweep's max_epoch {last}"
    return trained, ""


def copy_from(run: Run, source: Path) -> str:
    """Copy the checkpoints, validation history, log and rank files of the finished run
    ``source`` (planned: :func:`source_epochs`) into ``run``'s folder; the line that says so."""
    (run.run_dir / CONTINUED_FROM).unlink(missing_ok=True)  # from an attempt cut short
    valid = json.loads((source / VALID_HISTORY).read_text())
    trained = valid["epochs"][-1]["epoch"]
    write_json(run.run_dir / VALID_HISTORY, valid, indent=1)
    if (source / TRAIN_LOG).is_file():
        # the log goes on where the other run's ends, as a resumed run's does: its record
        # reads every validation and the whole training time from it
        atomic_write(run.run_dir / TRAIN_LOG,
                     lambda tmp: shutil.copyfile(source / TRAIN_LOG, tmp))
    # the processors, device and torch that trained those epochs (the record's train facts);
    # an epoch trained here adds this machine's (job.rank_facts), none leaves them as they are
    for ranks in sorted((source / RANKS).glob("rank*.json")):
        (run.run_dir / RANKS).mkdir(exist_ok=True)
        atomic_write(run.run_dir / RANKS / ranks.name,
                     lambda tmp, ranks=ranks: shutil.copyfile(ranks, tmp))
    write_json(run.run_dir / CONTINUED_FROM, {"output_dir": str(source.parent),
                                              "run": source.name, "epochs": trained})
    with building_dir(run.run_dir / "checkpoints") as work:  # last: it marks the run started
        for ckpt in sorted((source / "checkpoints").iterdir()):
            if TRAINING_CHECKPOINT.fullmatch(ckpt.name):  # not the evaluation's averages
                shutil.copy2(ckpt, work / ckpt.name)
    return f"{run.name}: continues from epoch {trained} of {source}"
