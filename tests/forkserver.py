"""The CLI processes of the tests, forked from a server that has imported torch and its kin once.

Every fairseq console script and ``python -m fairseq_tying…`` tool spends about 3.5 s of CPU
importing torch and fairseq (sklearn, scipy, pandas and every fairseq task among them) before it
reads its first argument; the tests start a few hundred of them. Here each one is a new process
forked from a server (``python -m tests.forkserver``, one per test process) that imported the
libraries fairseq loads (PRELOAD) and nothing of fairseq or of this package. The forked process
runs the console script's entry point, or the module as ``__main__``, with its own argv,
``sys.path[0]``, environment, working directory, stdin, stdout and stderr, and exits as the
installed script would (non-daemon threads joined, ``atexit`` handlers run, the exit status of
its ``SystemExit``, or 1 with the traceback). What a library reads from the environment when it
is loaded (the OpenMP thread count, torch's kernel choice, warning filters) is the server's: a
call whose environment differs there runs as a plain subprocess instead. multiprocessing's
forkserver is not used: its children import the parent's ``__main__`` (pytest's), which a CLI
process never does.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Mapping
from pathlib import Path

# The libraries ``import fairseq`` loads (3 of its 3.5 s), not fairseq itself: some of fairseq's
# modules call logging.basicConfig when imported (wav2vec2_classification at DEBUG), which a CLI
# that configures logging first (fairseq-train, fairseq-generate) overrides; imported in the
# server they would configure every forked process instead.
PRELOAD = ("torch", "torch.onnx", "torch.utils.tensorboard", "sklearn.metrics", "scipy.stats",
           "pandas", "omegaconf", "hydra", "sacrebleu", "tensorboardX")
# read when a library is loaded, so fixed by the server's environment
IMPORT_TIME_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "ATEN_CPU_CAPABILITY", "MKL_CBWR",
                   "ONEDNN_MAX_CPU_ISA", "PYTHONWARNINGS", "PYTHONHASHSEED", "PYTHONPATH",
                   "CUDA_VISIBLE_DEVICES", "LD_PRELOAD")
# the repository (not tests.helpers.REPO: helpers imports the plugin, which the server must not)
ROOT = Path(__file__).resolve().parents[1]
# (argv, exit status) of every forked run while a test is watched (tests/conftest.py)
started: list[tuple[list[str], int]] | None = None


# ---- the server's side ------------------------------------------------------------------------


def _main(argv: list[str]) -> None:
    """Run ``argv``: ``python -m MODULE`` as ``__main__``, else the console script's function
    (whose wrapper exits with what it returns)."""
    if argv[1:2] == ["-m"]:
        sys.argv = [argv[2], *argv[3:]]  # runpy puts the module's path first
        sys.path[0] = os.getcwd()  # as ``python -m`` sets it
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        return
    sys.argv = list(argv)
    sys.path[0] = str(Path(argv[0]).parent)  # a script's own folder, as Python sets it
    (script,) = importlib.metadata.entry_points(group="console_scripts", name=Path(argv[0]).name)
    sys.exit(script.load()())


def _become(request: dict) -> None:
    """In the forked process: become the request's command and exit as its process would."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, mode in ((0, request["stdin"], os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                           (2, request["stderr"], os.O_WRONLY)):
        opened = os.open(path, mode)
        os.dup2(opened, fd)
        os.close(opened)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 0
    try:
        _main(request["argv"])
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught one
        traceback.print_exc()
        code = 1
    threading._shutdown()  # the interpreter's exit: non-daemon threads, then atexit, then flush
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def serve() -> None:
    """Import PRELOAD, then for each request (a JSON line on stdin) fork, answer the child's
    pid, wait for it and answer its exit status; end at EOF."""
    for module in PRELOAD:
        __import__(module)
    sys.stdin = open(0, encoding="utf-8", closefd=False)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _become(request)
        print(pid, flush=True)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)


# ---- the tests' side --------------------------------------------------------------------------


class _Server:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = {key: env.get(key) for key in IMPORT_TIME_ENV}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.forkserver"], cwd=ROOT,
                                     env=dict(env), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.lock = threading.Lock()

    def fits(self, env: Mapping[str, str]) -> bool:
        return all(env.get(key) == value for key, value in self.env.items())

    def run(self, request: dict, timeout: float | None) -> int | None:
        """The exit status of the request's process; None (and the process killed) when it
        ran past ``timeout`` seconds."""
        with self.lock:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            pid = int(self.proc.stdout.readline())
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            if not ready:
                os.kill(pid, signal.SIGKILL)
            code = int(self.proc.stdout.readline())
            return code if ready else None


_server: _Server | None = None


def run(argv: list[str], env: Mapping[str, str], cwd: Path, timeout: float | None,
        input: str | None) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, ...)``, forked from the server
    when ``env`` allows it."""
    global _server
    if _server is None:
        _server = _Server(env)
    if not _server.fits(env):
        return subprocess.run(argv, capture_output=True, text=True, env=dict(env), cwd=cwd,
                              timeout=timeout, input=input)
    with tempfile.TemporaryDirectory(prefix="forked-") as tmp:
        paths = {name: Path(tmp) / name for name in ("stdin", "stdout", "stderr")}
        paths["stdin"].write_text(input or "", encoding="utf-8")
        for name in ("stdout", "stderr"):
            paths[name].touch()
        code = _server.run({"argv": list(argv), "env": dict(env), "cwd": str(cwd),
                            **{name: str(path) for name, path in paths.items()}}, timeout)
        out, err = (paths[name].read_text(encoding="utf-8", errors="replace")
                    for name in ("stdout", "stderr"))
    if code is None:
        raise subprocess.TimeoutExpired(argv, timeout, out, err)
    if started is not None:
        started.append((list(argv), code))
    return subprocess.CompletedProcess(argv, code, out, err)


if __name__ == "__main__":
    serve()
