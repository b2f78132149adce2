"""``--local``: the same jobs without SLURM (submitit's local executor), no root needed."""

from __future__ import annotations

import contextlib
import json

import pytest

from tests.helpers import launch, write_sweep

pytestmark = pytest.mark.slow


def test_local_two_workers(tiny_data, tmp_path):
    sweep = write_sweep(tmp_path / "local.yaml", grid={"output_layer": ["l2norm"], "seed": [3]},
                        resources={"tasks_per_node": 2}, evaluation={"enabled": False})
    out = tmp_path / "runs"
    launch(str(sweep), "--local", "--output-dir", str(out), data=tiny_data)
    (run,) = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")]
    ranks = [json.loads((run / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["param_sum"] == ranks[1]["param_sum"]
    assert json.loads((run / "train.done").read_text())["num_updates"] == 12
    argv = json.loads((run / "command.json").read_text())["argv"]
    assert argv[argv.index("--distributed-world-size") + 1] == "2"
    assert argv[argv.index("--distributed-backend") + 1] == "gloo"
    assert argv[argv.index("--update-freq") + 1] == "1"  # target_gpus 2 on 2 workers


HOLD = """import sys, time
from pathlib import Path
from fairseq_tying.launch.job import hold_run
lock = hold_run(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(120)
"""


def _holder(run_dir):
    """A process that trains ``run_dir`` as far as the lock is concerned, until killed."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_run_is_trained_by_one_process_at_a_time(tmp_path):
    """RUN/train.lock: a second holder fails naming the first one's pid; the lock goes with
    its process, even one killed with SIGKILL, and the run can then be taken again."""
    from fairseq_tying.launch.job import RunBusy, hold_run

    run_dir = tmp_path / "bible.transformer_twwt.three_way.dot.s1"
    proc = _holder(run_dir)
    try:
        with pytest.raises(RunBusy, match=rf"three_way.dot.s1 is being trained by pid {proc.pid} "):
            hold_run(run_dir)
    finally:
        proc.kill()
        proc.wait()
    hold_run(run_dir).close()


def test_launcher_refuses_a_run_another_process_trains(tiny_data, tmp_path):
    """A launcher started again while a job of the last one still trains a run stops with an
    error naming the run, and trains nothing."""
    sweep = write_sweep(tmp_path / "local.yaml", grid={"output_layer": ["dot"], "seed": [1]},
                        evaluation={"enabled": False})
    out = tmp_path / "runs"
    dry = launch(str(sweep), "--dry-run", "--output-dir", str(out), data=tiny_data)
    lines = dry.stdout.splitlines()
    (name,) = [lines[i - 1][2:] for i, line in enumerate(lines) if line.startswith("fairseq-train")]
    proc = _holder(out / name)
    try:
        refused = launch(str(sweep), "--local", "--output-dir", str(out), data=tiny_data,
                         check=False)
    finally:
        proc.kill()
        proc.wait()
    assert refused.returncode == 2
    assert f"{name} is being trained by pid {proc.pid}" in refused.stderr
    assert not (out / name / "checkpoints").exists()


def test_no_start_after_leaves_runs_whole_for_the_next_call(tiny_data, tmp_path):
    """``--no-start-after 0``: nothing is started, jobs.json names the runs left; the same
    command without it then trains them (one of them here)."""
    sweep = write_sweep(tmp_path / "s.yaml", grid={"output_layer": ["dot"], "seed": [1, 2]},
                        evaluation={"enabled": False})
    out = tmp_path / "runs"
    proc = launch(str(sweep), "--local", "--no-start-after", "0", "--output-dir", str(out),
                  data=tiny_data)
    jobs = json.loads((out / "jobs.json").read_text())
    assert jobs["train"] == {} and len(jobs["not_started"]) == 2
    assert "not started (--no-start-after 0 min)" in proc.stderr
    assert not any((out / name / "train.done").exists() for name in jobs["not_started"])
    launch(str(sweep), "--local", "--only", "*.s1", "--output-dir", str(out), data=tiny_data)
    jobs = json.loads((out / "jobs.json").read_text())
    assert list(jobs["train"]) == [n for n in jobs["train"] if n.endswith(".s1")] != []
    assert jobs["not_started"] == []
    bad = launch(str(sweep), "--no-start-after", "5", "--output-dir", str(out), data=tiny_data,
                 check=False)
    assert bad.returncode == 2 and "--no-start-after" in bad.stderr and "--local" in bad.stderr


def _gone(pgid: int, seconds: float = 20) -> bool:
    """Every process of the group has ended (killpg(…, 0) finds none)."""
    import os
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize(("sig", "background"),
                         [("SIGINT", False), ("SIGTERM", False), ("SIGTERM", True)],
                         ids=["SIGINT", "SIGTERM", "SIGTERM-background"])
def test_stopping_the_local_launcher_stops_its_jobs(tiny_data, tmp_path, sig, background):
    """Ctrl-C (SIGINT) or SIGTERM sent to ``launch --local`` alone stops the training job it
    started, which would otherwise train on (submitit's local jobs ignore SIGTERM): the
    launcher says so and exits 130 within seconds, no process of its group is left, the run's
    lock is free and its checkpoint is whole for the next call. So does SIGTERM to a launcher
    started as a background job (`&`, nohup), which inherits SIGINT ignored: its jobs must not,
    as submitit cancels a job with SIGINT."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from fairseq_tying.common import checkpoints
    from fairseq_tying.launch.job import hold_run

    sweep = write_sweep(tmp_path / "s.yaml", grid={"output_layer": ["dot"], "seed": [1]},
                        fairseq={"max_update": 100000}, evaluation={"enabled": False})
    out = tmp_path / "runs"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FAIRSEQ_TYING_TINY_DATA": str(tiny_data)}
    disposition = "SIG_IGN" if background else "SIG_DFL"  # whatever pytest was started with
    start = (f"import os, signal, sys; signal.signal(signal.SIGINT, signal.{disposition}); "
             "os.execv(sys.argv[1], sys.argv[1:])")  # exec keeps SIG_IGN and SIG_DFL
    proc = subprocess.Popen([sys.executable, "-c", start, sys.executable, "-m",
                             "fairseq_tying.launch", str(sweep), "--local", "--output-dir",
                             str(out)], env=env, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        last = []
        while not last and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            last = list(out.glob("*/checkpoints/checkpoint_last.pt"))
        assert last, "no checkpoint within 3 minutes"
        run_dir = last[0].parent.parent
        trainer = int((run_dir / "train.lock").read_text().split()[1])  # "pid N on HOST"
        proc.send_signal(getattr(signal, sig))
        signalled = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        stopping = time.monotonic() - signalled
        assert proc.returncode == 130, stderr
        gone = _gone(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):  # what a failed check left running
            os.killpg(proc.pid, signal.SIGKILL)
    why = "Ctrl-C" if sig == "SIGINT" else sig
    assert f"stopped by {why}; the jobs of {run_dir.name} were stopped with it" in stderr
    assert "resumes each unfinished run from its last checkpoint" in stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    # where the cancelled job's controller wrote its KeyboardInterrupt instead
    assert "KeyboardInterrupt" in (out / ".submitit" / "controllers.log").read_text()
    assert gone, "a job of the stopped launcher was still running"
    assert stopping < 15, f"{stopping:.0f} s to stop: submitit's wait for a cancelled job's result"
    with pytest.raises(ProcessLookupError):
        os.kill(trainer, 0)
    hold_run(run_dir).close()  # free for the next call
    assert not (run_dir / "train.done").exists()
    state = checkpoints.load(run_dir / "checkpoints" / "checkpoint_last.pt")
    assert state["optimizer_history"][-1]["num_updates"] >= 6
