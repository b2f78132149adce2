"""What runs inside a job: fairseq training of one run, its evaluation, the sweep's summary.

``TrainJob`` is called once per task (one task per GPU, or per CPU worker) by submitit. It takes
rank, world size and the master address from submitit's ``JobEnvironment`` and calls fairseq's
training entry point in this process. On SIGUSR2 (SLURM's timeout/preemption signal, sent
``signal_delay_s`` before the time limit) all ranks agree to stop after the current update, save
``checkpoint_last.pt`` and submitit requeues the job, which resumes from that checkpoint.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import torch
from fairseq import checkpoint_utils
from fairseq.distributed import utils as dist_utils

from fairseq_tying.common import EVAL_JSON, PLUGIN_DIR, RANKS, TRAIN_DONE, atomic, checkpoints
from fairseq_tying.common.eval_options import EvalOptions, LMEvalOptions
from fairseq_tying.common.extras import configure_logging, require
from fairseq_tying.common.reproducible import cpu_name
from fairseq_tying.common.run_spec import RunSpec
from fairseq_tying.launch import FOR_WHAT, fairseq_hooks
from fairseq_tying.sweeps import plateau
from fairseq_tying.sweeps.sweep import Sweep

submitit = require("submitit", "launch", FOR_WHAT)

logger = logging.getLogger("fairseq_tying.launch")
DONE = TRAIN_DONE  # marker of a finished training run
LOCK = "train.lock"  # held by the process that trains the run (its rank 0)


class RunBusy(RuntimeError):
    """Another process is training this run."""


def hold_run(run_dir: Path) -> IO[str]:
    """Take ``RUN/train.lock`` for as long as the returned file stays open. Two trainers of one
    run would write the same checkpoints (a launcher started again while a job of the last one
    still runs: submitit's jobs ignore SIGTERM), so the second stops here. The kernel drops
    the lock when its process ends, however it ends: no stale lock to clean up."""
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = open(run_dir / LOCK, "a+")  # noqa: SIM115 - held open for the training's length
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RunBusy(f"{run_dir.name} is being trained by {holder} ({run_dir / LOCK}): wait "
                      "for it to end, or stop that process, then launch again") from None
    handle.truncate(0)
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    return handle


class Preempted(Exception):
    """Raised in fairseq's loop once all ranks saw the stop request and the checkpoint is saved."""


def write_json(path: Path, data: Any) -> None:
    """The launcher's run files: sorted keys, compact indent, written atomically."""
    atomic.write_json(path, data, indent=1, sort_keys=True, ensure_ascii=True)


def resolve_master(host: str) -> str:
    """An address for ``host``: DNS/hosts if it resolves, else SLURM's NodeAddr for the node."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        pass
    out = subprocess.run(["scontrol", "-o", "show", "node", host], capture_output=True,
                         text=True, check=True).stdout
    for field in out.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    raise RuntimeError(f"cannot resolve the master node {host!r} (no DNS entry, no NodeAddr)")


def master_port(job_id: str) -> int:
    digest = hashlib.sha1(job_id.encode()).digest()
    return 20000 + int.from_bytes(digest[:4], "big") % 20000


def distributed_args(env: submitit.JobEnvironment, gpu: bool, ddp_backend_set: bool) -> list[str]:
    """fairseq flags for this task's rank, from the SLURM/submitit environment."""
    gpu = gpu and torch.cuda.is_available()  # backend follows the device: CPU torch has no NCCL
    world = env.num_tasks
    if world == 1:
        return []
    host = env.hostnames[0] if env.hostnames else "127.0.0.1"
    addr = "127.0.0.1" if host in ("localhost", socket.gethostname()) else resolve_master(host)
    args = ["--distributed-world-size", str(world), "--distributed-rank", str(env.global_rank),
            "--distributed-init-method", f"tcp://{addr}:{master_port(str(env.job_id))}",
            "--distributed-no-spawn", "--device-id", str(env.local_rank if gpu else 0),
            "--distributed-backend", "nccl" if gpu else "gloo"]
    if not gpu and not ddp_backend_set:
        args += ["--ddp-backend", "legacy_ddp"]  # c10d passes device_ids=[0] and fails on CPU
    return args


class _StopFlag:
    requested = False

    @classmethod
    def handler(cls, signum: int, frame: Any) -> None:
        logger.warning("caught %s: stopping after this update", signal.Signals(signum).name)
        cls.requested = True


class _Stopping:
    """The plateau rule's state in this process (None: the run has a fixed budget)."""

    rule: plateau.Plateau | None = None
    history: list[dict] = []
    reason: str | None = None


def _after_validation(cfg, run_dir: Path, rank: int, epoch_itr, updates: int,
                      valid_losses: list) -> bool:
    """Record this epoch's validation; True when the plateau rule says stop."""
    rule = _Stopping.rule
    if rule is None or not valid_losses or valid_losses[0] is None:
        return False
    _Stopping.history = plateau.record_epoch(_Stopping.history, epoch_itr.epoch, updates,
                                             valid_losses[0])
    if rank == 0:
        plateau.write_history(run_dir, _Stopping.history, cfg.checkpoint.best_checkpoint_metric)
    _Stopping.reason = rule.decide(_Stopping.history)
    if _Stopping.reason:
        logger.info("stopping after epoch %d (%s): %s %s", epoch_itr.epoch, _Stopping.reason,
                    cfg.checkpoint.best_checkpoint_metric,
                    [round(h["value"], 4) for h in _Stopping.history[-rule.patience - 1:]])
    return _Stopping.reason is not None


def _install_fairseq_hook(run_dir: Path, rank: int) -> None:
    """Wrap fairseq's validate_and_save (``fairseq_hooks``): record progress, apply the plateau
    rule at the end of each epoch, stop and save on a stop request."""

    def validate_and_save(original, cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch):
        valid_losses, should_stop = original(cfg, trainer, task, epoch_itr, valid_subsets,
                                             end_of_epoch)
        updates = trainer.get_num_updates()
        if end_of_epoch and _after_validation(cfg, run_dir, rank, epoch_itr, updates,
                                              valid_losses):
            should_stop = True  # the epoch's checkpoint is saved: stop after it
        device = next(trainer.model.parameters()).device  # NCCL reduces CUDA tensors only
        stop = torch.tensor([1.0 if _StopFlag.requested else 0.0], device=device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            stop = dist_utils.all_reduce(stop, group=dist_utils.get_data_parallel_group())
        if rank == 0:
            write_json(run_dir / "progress.json", {"num_updates": updates})
        if should_stop or end_of_epoch or stop.item() > 0:
            params = sum(float(p.detach().double().sum()) for p in trainer.model.parameters())
            ranks = run_dir / RANKS / f"rank{rank}.json"
            before = json.loads(ranks.read_text()).get("cpu") if ranks.is_file() else None
            write_json(ranks, {"rank": rank, "num_updates": updates, "param_sum": params,
                               **rank_facts(device, before), "pid": os.getpid()})
        if stop.item() > 0 and not should_stop:
            checkpoint_utils.save_checkpoint(cfg.checkpoint, trainer, epoch_itr, valid_losses[0])
            logger.warning("stop requested: saved checkpoint_last.pt at update %d", updates)
            raise Preempted(updates)
        return valid_losses, should_stop

    fairseq_hooks.wrap_validate_and_save(validate_and_save)


def rank_facts(device: torch.device, before: str | None) -> dict[str, str]:
    """What a rank's file says of the machine, for the run's record (``train``): the node, the
    device, the processors so far (``before``: the file's ``cpu`` of an earlier epoch), torch's
    version and the day (ISO 8601, UTC) of this write; the last write is the run's end."""
    return {"node": os.environ.get("SLURMD_NODENAME", socket.gethostname()),
            "device": device_name(device), "cpu": machines(before, cpu_name()),
            "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat()}


def machines(before: str | None, now: str) -> str:
    """The processors that trained a run, in order: a run resumed on another machine names
    both (``"A, AVX2 kernels; then B, AVX2 kernels"``), as its numbers depend on both."""
    if not before or before.rsplit("; then ", 1)[-1] == now:
        return before or now
    return f"{before}; then {now}"


def device_name(device) -> str:
    """What trained the run, for its record: the GPU's name, or "cpu"."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _log_to(path: Path) -> logging.Handler:
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s"))
    logging.getLogger().addHandler(handler)
    return handler


class TrainJob(submitit.helpers.Checkpointable):
    """Train one run (called in every task of its job)."""

    def __init__(self, run: RunSpec, user_dir: str) -> None:
        self.run = run
        self.user_dir = user_dir

    def command(self, env: submitit.JobEnvironment | None = None) -> list[str]:
        run_dir = Path(self.run.run_dir)
        args = [self.run.data_bin, "--user-dir", self.user_dir,
                "--save-dir", str(run_dir / "checkpoints"), *self.run.identity.train_args]
        if env is not None:
            args += distributed_args(env, bool(self.run.gpu), "--ddp-backend" in args)
        return ["fairseq-train", *args]

    def __call__(self) -> dict:
        configure_logging()  # a process of its own: its log holds fairseq's INFO lines
        run_dir = Path(self.run.run_dir)
        done = run_dir / DONE
        if done.exists():  # finished before (e.g. requeued after the end): never retrain
            return json.loads(done.read_text())
        env = submitit.JobEnvironment()
        rank = env.global_rank
        lock = hold_run(run_dir) if rank == 0 else None
        try:
            return self._train(run_dir, env, rank)
        finally:
            if lock is not None:
                lock.close()

    def _train(self, run_dir: Path, env: submitit.JobEnvironment, rank: int) -> dict:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (run_dir / RANKS).mkdir(exist_ok=True)
        if self._resume_stopping(run_dir):  # stopped before, killed before train.done
            ranks = run_dir / RANKS / f"rank{rank}.json"
            return self._finish(run_dir, rank, json.loads(ranks.read_text()) if ranks.is_file()
                                else {"rank": rank})
        handler = _log_to(run_dir / "logs" / f"train.rank{rank}.log")
        argv = self.command(env)
        if rank == 0:
            write_json(run_dir / "command.json", {"argv": argv, "job_id": env.job_id,
                                                  "hostnames": list(env.hostnames)})
        logger.info("job %s rank %d/%d on %s: %s", env.job_id, rank, env.num_tasks,
                    socket.gethostname(), " ".join(argv))
        submitit_handler = signal.getsignal(signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, _StopFlag.handler)
        _install_fairseq_hook(run_dir, rank)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        try:
            fairseq_hooks.run_fairseq_train(argv)
        except Preempted:
            self._requeue(submitit_handler, rank)
        finally:
            logging.getLogger().removeHandler(handler)
        result = json.loads((run_dir / RANKS / f"rank{rank}.json").read_text())
        return self._finish(run_dir, rank, result)

    def _resume_stopping(self, run_dir: Path) -> bool:
        """Set up the plateau rule from the run's history as of checkpoint_last.pt; True if
        that history already ends the run."""
        stopping = self.run.stopping
        _Stopping.rule, _Stopping.history, _Stopping.reason = None, [], None
        if not stopping:
            return False
        maximize = "--maximize-best-checkpoint-metric" in self.run.identity.train_args
        _Stopping.rule = plateau.Plateau(**stopping, maximize=maximize)
        last = run_dir / "checkpoints" / "checkpoint_last.pt"
        state = None
        if last.is_file():
            state = checkpoints.load(last)
        _Stopping.history = plateau.resume_history(run_dir, state)
        _Stopping.reason = _Stopping.rule.decide(_Stopping.history)
        return _Stopping.reason is not None

    @staticmethod
    def _finish(run_dir: Path, rank: int, result: dict) -> dict:
        """``train.done``: the result and, under the plateau rule, when and why it stopped."""
        if _Stopping.rule is not None:
            last = _Stopping.history[-1] if _Stopping.history else {"epoch": 0, "update": 0}
            result["stop"] = {"epoch": last["epoch"], "update": last["update"],
                              "reason": _Stopping.reason or "budget"}
        if rank == 0:
            write_json(run_dir / DONE, {**result, "finished": time.strftime("%Y-%m-%dT%H:%M:%S")})
        return result

    @staticmethod
    def _requeue(submitit_handler: Any, rank: int) -> None:
        if callable(submitit_handler) and "SLURM_JOB_ID" in os.environ:
            # rank 0 checkpoints this submission, runs `scontrol requeue` and exits
            submitit_handler(signal.SIGUSR2, None)
        if rank != 0:
            time.sleep(120)  # the requeue ends this task
        sys.exit(-1)

    def __submitit_checkpoint__(self) -> submitit.helpers.DelayedSubmission:
        # fairseq finds checkpoint_last.pt in the run's save dir: the same call resumes it
        return submitit.helpers.DelayedSubmission(self)

    checkpoint = __submitit_checkpoint__


class LocalRunJob(TrainJob):
    """Train one run, then evaluate it, in the same process: a local run of one task need not
    pay a second process's start (Python, torch and fairseq: about 4 s of CPU)."""

    def __init__(self, run: RunSpec, user_dir: str, evaluation: EvalJob) -> None:
        super().__init__(run, user_dir)
        self.evaluation = evaluation

    def __call__(self) -> dict:
        result = super().__call__()
        self.evaluation()
        return result


class EvalJob:
    """Evaluate one run: ``RUN/eval.TAG.json`` for each extra evaluation, then the main
    ``RUN/eval.json`` (written last: it marks the run as evaluated)."""

    def __init__(self, run: RunSpec, options: EvalOptions,
                 also: dict[str, EvalOptions] | None = None) -> None:
        self.run = run
        self.options = options
        self.also = also or {}

    def __call__(self) -> str:
        configure_logging()
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        run_dir, cpu = Path(self.run.run_dir), not self.run.gpu
        for tag, options in self.also.items():
            if not (run_dir / f"eval.{tag}.json").exists():
                evaluate(run_dir, options, cpu=cpu, tag=tag)
        return str(evaluate(run_dir, self.options, cpu=cpu))


def evaluate(run_dir: Path, options: EvalOptions, cpu: bool, tag: str | None = None) -> Path:
    """Evaluate ``run_dir`` in this process (fairseq-generate, or fairseq-eval-lm for a
    language model's :class:`LMEvalOptions`, runs as a child process) with the sweep's
    evaluation ``options``; the data dir comes from RUN/run.json unless they name one. Returns
    ``RUN/eval.json`` (``RUN/eval.TAG.json`` with a tag)."""
    # imported when a run is evaluated: a training job does not load sacremoses (0.7 s)
    from fairseq_tying.evaluation.evaluate import eval_json_name, evaluate_run
    from fairseq_tying.evaluation.perplexity import evaluate_lm_run

    options = replace(options, cpu=options.cpu or cpu, user_dir=options.user_dir or PLUGIN_DIR,
                      tag=tag or options.tag)
    out = run_dir / (f"eval.{options.tag}.json" if options.tag else EVAL_JSON)
    if (name := eval_json_name(options.subset, options.tag)) != out.name:
        raise ValueError(f"evaluation.args: --subset {options.subset} would write {name}, not "
                         f"the {out.name} that marks a run evaluated; leave --subset out of the "
                         "sweep")
    lm = isinstance(options, LMEvalOptions)
    (evaluate_lm_run if lm else evaluate_run)(run_dir, options.data, **options.keywords())
    if not out.exists():
        raise RuntimeError(f"evaluation of {run_dir} with {options} wrote no {out.name}")
    return out


class SummaryJob:
    """A translation sweep's summary after its last evaluation: its answer, or why there is none
    (``studies.sweep_summary``), in ``OUTPUT/results.md``; ``skipped``: the records folder of
    ``--skip-recorded``."""

    def __init__(self, sweep: Sweep, skipped: Path | None = None) -> None:
        self.sweep, self.skipped = sweep, skipped

    def __call__(self) -> str:
        # imported when it runs: a training job does not load matplotlib (1 s)
        from fairseq_tying.studies.sweep_summary import summarize

        configure_logging()
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        path, what = summarize(self.sweep, self.skipped)
        print(what, file=sys.stderr, flush=True)
        return str(path)
