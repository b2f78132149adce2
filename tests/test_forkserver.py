"""The forked CLI processes of the tests behave as the installed scripts: same output, same exit
status, same module state (nothing of fairseq or of the package preloaded)."""

from __future__ import annotations

import subprocess

import pytest

from tests import forkserver
from tests.helpers import BIN, REPO, cli_env, run_cli

pytestmark = pytest.mark.slow  # each case starts a plain process (4 s) beside the forked one
CASES = [
    [str(BIN / "fairseq-generate"), "--help"],  # a console script
    [str(BIN / "fairseq-train"), "--no-such-flag"],  # uncaught: exit status 1
    [str(BIN / "python"), "-m", "fairseq_tying.launch", "--no-such-flag"],  # exit status 2
]


PROBE = """import logging, sys
print(sorted(m for m in sys.modules if m.split(".")[0] in ("fairseq", "fairseq_tying")))
print(logging.root.handlers, logging.root.level, sys.argv[1:], sys.path[0], sys.stdin.read())
"""


@pytest.mark.parametrize("argv", CASES)
def test_a_forked_run_prints_and_exits_as_the_script(argv):
    forked = forkserver.run(argv, cli_env(), REPO, 120, None)
    plain = subprocess.run(argv, capture_output=True, text=True, env=cli_env(), cwd=REPO,
                           timeout=120)
    assert (forked.returncode, forked.stdout) == (plain.returncode, plain.stdout)
    assert forked.returncode != 0 or "--help" in argv
    if plain.stderr.startswith("Traceback"):  # the frames above the script's function differ
        assert forked.stderr.startswith("Traceback")
        assert forked.stderr.splitlines()[-1] == plain.stderr.splitlines()[-1]
    else:
        assert forked.stderr == plain.stderr


def test_a_forked_module_starts_with_what_a_new_process_has(tmp_path):
    """Nothing of fairseq or the package imported, root logging untouched (fairseq's modules
    configure it when imported), its own argv, sys.path[0] and stdin."""
    (tmp_path / "probe.py").write_text(PROBE)
    argv = [str(BIN / "python"), "-m", "probe", "a b", "--c"]
    forked = forkserver.run(argv, cli_env(), tmp_path, 60, "from stdin")
    plain = subprocess.run(argv, capture_output=True, text=True, env=cli_env(), cwd=tmp_path,
                           timeout=60, input="from stdin")
    assert forked.stdout.startswith("[]\n[] 30 ['a b', '--c']")
    assert (forked.returncode, forked.stdout) == (plain.returncode, plain.stdout)


def test_an_environment_the_server_was_not_started_with_runs_as_a_plain_process(monkeypatch):
    forkserver.run([str(BIN / "fairseq-train"), "--help"], cli_env(), REPO, 60, None)
    env = {**cli_env(), "OMP_NUM_THREADS": "3"}
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **kw: ran.append(kw["env"]) or
                        subprocess.CompletedProcess(a[0], 0, "", ""))
    forkserver.run([str(BIN / "fairseq-train"), "--help"], env, REPO, 60, None)
    assert ran == [env]


def test_fairseq_train_without_its_own_save_dir_is_refused_before_it_runs(tmp_path):
    """fairseq-train probes ./checkpoints with --no-save too; workers share the directory."""
    with pytest.raises(AssertionError, match="--save-dir in its own tmp_path"):
        run_cli("fairseq-train", "--no-such-flag")
    assert run_cli("fairseq-train", "--help", "--save-dir", str(tmp_path)).returncode == 0
