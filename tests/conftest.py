"""Shared fixtures (a tiny generated parallel corpus binarized with the real fairseq-preprocess,
tiny trained language models) and the rules every test runs under: under pytest-xdist (``make
test``), what a fixture builds is built once; a test that starts a CLI process is marked slow."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests import forkserver

# No test has a GPU: Triton's kernels run in its interpreter. Triton reads TRITON_INTERPRET when
# it is first imported, and any module of a worker (torch's, the fused loss's) may import it
# before the fused loss's tests run, so it is set for the whole process before anything does.
os.environ.setdefault("TRITON_INTERPRET", "1")

# The fixtures import tests.helpers when they first run, not here: it imports the plugin (torch
# and fairseq, ~4.5 s), which pytest-xdist's controller, running no test, would import before it
# starts the workers.

# ---- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    from tests.helpers import built_once, write_corpus

    return built_once(tmp_path_factory, "corpus", write_corpus)


@pytest.fixture(scope="session")
def joined_bin(tiny_corpus, tmp_path_factory) -> Path:
    from tests.helpers import binarize, built_once

    return built_once(tmp_path_factory, "joined",
                      lambda folder: binarize(tiny_corpus, folder / "bin", joined=True)) / "bin"


@pytest.fixture(scope="session")
def separate_bin(tiny_corpus, tmp_path_factory) -> Path:
    from tests.helpers import binarize, built_once

    return built_once(tmp_path_factory, "separate",
                      lambda folder: binarize(tiny_corpus, folder / "bin", joined=False)) / "bin"


@pytest.fixture(scope="session")
def lm_bin(tiny_corpus, tmp_path_factory) -> Path:
    """The toy corpus's target side as a language-modelling set."""
    from tests.helpers import binarize_lm, built_once

    return built_once(tmp_path_factory, "lm",
                      lambda folder: binarize_lm(tiny_corpus, "tgt", folder / "bin")) / "bin"


@pytest.fixture(scope="session")
def trained(joined_bin, tmp_path_factory):
    """``get(arch, tying, output_layer, projection, extra=())``: a tiny translation model and
    the plugin's fairseq-generate output (``tests.helpers.Trained``), made once per test run and
    shared by the export and serving tests."""
    from tests.helpers import built_once, train_and_generate

    def get(arch: str, tying: str, output_layer: str, projection: bool,
            extra: tuple[str, ...] = ()):
        name = f"trained-{arch}-{tying}-{output_layer}-{projection}"
        if extra:
            name += "-" + hashlib.sha1("\0".join(extra).encode()).hexdigest()[:10]
        folder = built_once(tmp_path_factory, name, lambda f: train_and_generate(
            joined_bin, f, arch, tying, output_layer, projection, extra))
        return train_and_generate(joined_bin, folder, arch, tying, output_layer, projection,
                                  extra)

    return get


@pytest.fixture(scope="session")
def trained_lms(lm_bin, tmp_path_factory):
    """``get(output_layer, *flags)``: the checkpoint of one short fairseq-train run of a tiny
    ``transformer_lm_tied`` (trained once per test run, shared by the LM test modules)."""
    from tests.helpers import LM_TRAIN, built_once, run_cli

    def get(output_layer: str, *flags: str) -> Path:
        def train(save: Path) -> None:
            run_cli("fairseq-train", str(lm_bin), "--arch", "transformer_lm_tied",
                    "--output-layer", output_layer, "--save-dir", str(save), *LM_TRAIN,
                    *flags)  # last: they override LM_TRAIN's sizes

        name = f"lm-{output_layer}"
        if flags:
            name += "-" + hashlib.sha1("\0".join(flags).encode()).hexdigest()[:10]
        return built_once(tmp_path_factory, name, train) / "checkpoint_last.pt"

    return get


@pytest.fixture(autouse=True)
def _import_time_environment_kept():
    """Fails a test that leaves a variable read at import (forkserver.IMPORT_TIME_ENV: thread
    count, kernel pins, ...) changed in the test process: every later CLI process of the
    process would run with it, and unforked (slow), since the fork server was started
    without it."""
    before = {key: os.environ.get(key) for key in forkserver.IMPORT_TIME_ENV}
    yield
    after = {key: os.environ.get(key) for key in forkserver.IMPORT_TIME_ENV}
    if after != before:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        pytest.fail(f"the test left os.environ changed (before, after): {changed}")


# ---- xdist: one core a worker, shared fixtures built once ---------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SlowMarkGuard(), "slow-mark-guard")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)  # a worker a core: its CLI processes use one thread as well
    else:  # the controller (or a run without xdist) sees the whole run
        config.pluginmanager.register(CheckoutGuard(config.rootpath), "checkout-guard")


CLUSTER_GROUP = "slurm_cluster"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for ``--dist loadgroup``: the tests that use a module-scoped (or wider) fixture
    of their own module run on one worker, which builds it once; all that use the SLURM cluster
    run on one worker, so that one cluster serves them (and they see only their own jobs).
    Then the longest first."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        if "cluster" in info.names_closure:
            item.add_marker(pytest.mark.xdist_group(CLUSTER_GROUP))
            continue
        module = item.nodeid.split("::")[0]
        for defs in info.name2fixturedefs.values():
            if defs[-1].scope != "function" and defs[-1].baseid == module:
                item.add_marker(pytest.mark.xdist_group(module))
                break
    items.sort(key=_lightness)


def _lightness(item: pytest.Item) -> tuple[bool, bool]:
    """The longest work first (the SLURM cluster's tests, then those marked slow): xdist hands
    the tests out in this order, so short ones fill the workers' tails."""
    group = item.get_closest_marker("xdist_group")
    return (group is None or group.args[0] != CLUSTER_GROUP,
            item.get_closest_marker("slow") is None)


# ---- the slow mark: a test that starts a CLI process carries it -----------------------------

# console scripts and ``python -m`` packages whose processes load torch and fairseq
CLI_SCRIPTS = ("fairseq-", "ct2-")
CLI_MODULES = ("fairseq_tying", "fairseq_cli", "fairseq")
USAGE_ERROR = 2  # argparse's exit status, and the package tools' for bad input


def cli_name(args) -> str | None:
    """The command line of ARGS (as Popen takes them) when it starts a CLI, else None."""
    argv = (shlex.split(os.fsdecode(args)) if isinstance(args, (str, bytes, os.PathLike))
            else [os.fsdecode(a) for a in args])
    if not argv:
        return None
    exe = Path(argv[0]).name
    is_cli = exe.startswith(CLI_SCRIPTS)
    if exe.startswith("python") and "-m" in argv:
        at = argv.index("-m")
        is_cli = at + 1 < len(argv) and argv[at + 1].split(".")[0] in CLI_MODULES
    return shlex.join([exe, *argv[1:]]) if is_cli else None


class _WatchedPopen(subprocess.Popen):
    """Popen that reports each CLI process it starts to the guard watching the test."""

    started: list[tuple[str, subprocess.Popen]] | None = None  # None: nothing is watched

    def __init__(self, args, *rest, **kw):
        super().__init__(args, *rest, **kw)
        if _WatchedPopen.started is not None:
            name = cli_name(args)
            if name is not None:
                _WatchedPopen.started.append((name, self))


def _allowed(name: str, status: int | None) -> bool:
    """A --help, or a run refused for bad input: the fast tier may do these."""
    return bool({"-h", "--help"} & set(shlex.split(name))) or status == USAGE_ERROR


class SlowMarkGuard:
    """Fails a test not marked slow that starts a CLI process (in its body or in a fixture of
    its own; the session fixtures build, once, what every tier shares). Registered as a plugin,
    not as conftest hooks, so that it sees the session fixtures' set-up as well."""

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef, request):
        saved = _WatchedPopen.started, forkserver.started
        if fixturedef.scope == "session":
            _WatchedPopen.started = forkserver.started = None
        try:
            return (yield)
        finally:
            _WatchedPopen.started, forkserver.started = saved

    def _watched(self, item: pytest.Item):
        if item.get_closest_marker("slow") is not None:
            return (yield)
        started: list[tuple[str, subprocess.Popen]] = []
        forked: list[tuple[list[str], int]] = []
        _WatchedPopen.started, forkserver.started = started, forked
        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(subprocess, "Popen", _WatchedPopen)
                result = yield
        finally:
            _WatchedPopen.started = forkserver.started = None
        ran = [(name, proc.poll()) for name, proc in started]
        ran += [(name, status) for argv, status in forked if (name := cli_name(argv))]
        bad = [f"  {name}  (exit status {status})" for name, status in ran
               if not _allowed(name, status)]
        if bad:
            pytest.fail(f"{item.nodeid} started a CLI process but is not marked slow; mark it "
                        "@pytest.mark.slow (a --help, or bad input refused with exit status "
                        f"{USAGE_ERROR}, is fine unmarked):\n" + "\n".join(bad), pytrace=False)
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item):
        return (yield from self._watched(item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        return (yield from self._watched(item))


# ---- the checkout: tests write into their tmp_path, never into the repository ---------------


class CheckoutGuard:
    """Fails the run when ``git status`` lists a path after it that it did not list before: a
    test wrote into the checkout (fairseq-train, for one, saves to ./checkpoints by default and
    writes crash.pt there when a train step raises, even with --no-save)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.before = self.status()

    def status(self) -> set[str] | None:
        proc = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                              cwd=self.root, capture_output=True, text=True, check=False)
        return set(proc.stdout.splitlines()) if proc.returncode == 0 else None  # None: no git

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        after = self.status()
        if self.before is None or after is None or not after - self.before:
            return
        new = "\n".join(f"  {line}" for line in sorted(after - self.before))
        session.config.get_terminal_writer().line(
            "\nthe tests changed the checkout (git status); write into tmp_path instead, or "
            f"pass --save-dir to fairseq-train:\n{new}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
