"""The optional libraries: each tool that needs one names the extra to install when it is
missing (fairseq_tying/common/extras.py), the plugin imports none of them, and the extras of
pyproject.toml are the ones the messages name. A library is made missing as Python itself
reports one: ``sys.modules[name] = None`` makes its import raise ModuleNotFoundError."""

from __future__ import annotations

import ast
import importlib
import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from setuptools.config.pyprojecttoml import read_configuration

from fairseq_tying.common import extras
from fairseq_tying.common.extras import EXTRAS, MissingExtra, require, run_main
from tests.helpers import REPO

OPTIONAL = {lib for libs in EXTRAS.values() for lib in libs}
KEEP = ("fairseq_tying.core", "fairseq_tying.common")  # the plugin registers once a process


def hide(monkeypatch: pytest.MonkeyPatch, library: str) -> None:
    """Make ``library`` missing, and the package's tools importable afresh (so that their
    import-time ``require`` runs again); everything is restored after the test."""
    for name in list(sys.modules):
        if name == library or name.startswith(library + "."):
            monkeypatch.setitem(sys.modules, name, None)
        elif name.startswith("fairseq_tying.") and not name.startswith(KEEP):
            parent, _, child = name.rpartition(".")
            if getattr(sys.modules.get(parent), child, None) is sys.modules[name]:
                # a fresh import rebinds the attribute on the parent package: put it back after
                monkeypatch.setattr(sys.modules[parent], child, sys.modules[name])
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, library, None)


def run_command(module: str, argv: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """``python -m MODULE ARGV`` in this process (runpy imports the package first, as -m
    does): its exit status and stderr."""
    monkeypatch.setattr(sys, "argv", [module, *argv])
    with pytest.raises(SystemExit) as stop:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    return stop.value.code, capsys.readouterr().err


def fake_ct2_model(folder: Path) -> Path:
    """A folder that passes translate's checks of a model directory before it decodes."""
    folder.mkdir()
    (folder / "model.bin").write_bytes(b"")
    (folder / "fairseq_tying.json").write_text(json.dumps({"task": "translation"}))
    return folder


# (module, its arguments ({tmp}: the test's folder), the library made missing, the extra)
COMMANDS = [
    ("fairseq_tying.export", ["x.pt", "{tmp}/ct2", "--format", "ctranslate2"], "ctranslate2",
     "serve"),
    ("fairseq_tying.translate", ["--model", "{tmp}/model", "--input", "{tmp}/in.txt"],
     "ctranslate2", "serve"),
    ("fairseq_tying.bench", ["--mode", "serve"], "ctranslate2", "serve"),
    ("fairseq_tying.bench", ["--mode", "gpu-check"], "ctranslate2", "serve"),
    ("fairseq_tying.bench", ["--size", "tiny", "--vocab", "64", "--reps", "2", "--no-memory",
                             "--out", "{tmp}/bench"], "matplotlib", "analysis"),
    ("fairseq_tying.analysis", ["{tmp}/model/model.bin", "--out", "{tmp}/a"], "gensim",
     "analysis"),
    ("fairseq_tying.evaluation", ["norms", "x.pt", "--out", "{tmp}/norms.png"], "matplotlib",
     "analysis"),
    ("fairseq_tying.studies", ["collect", "{tmp}", "--out", "{tmp}/c"], "matplotlib",
     "analysis"),
    ("fairseq_tying.demo", ["--out", "{tmp}/demo"], "matplotlib", "analysis"),
    ("fairseq_tying.launch", [str(REPO / "slurm" / "tiny_cpu.yaml"), "--dry-run"], "submitit",
     "launch"),
    ("fairseq_tying.launch", ["study", "equal", "--report-only"], "matplotlib", "analysis"),
]


@pytest.mark.parametrize(("module", "argv", "library", "extra"), COMMANDS,
                         ids=[f"{c[0].rpartition('.')[2]}-{c[2]}-{i}"
                              for i, c in enumerate(COMMANDS)])
def test_a_command_names_the_extra_it_misses(module, argv, library, extra, tmp_path,
                                             monkeypatch, capsys):
    fake_ct2_model(tmp_path / "model")
    (tmp_path / "in.txt").write_text("hola\n")
    hide(monkeypatch, library)
    code, err = run_command(module, [a.format(tmp=tmp_path) for a in argv], monkeypatch,
                            capsys)
    assert code == 2, err
    assert "Traceback" not in err
    assert f"needs {library}, which is not installed" in err
    assert f"pip install 'fairseq_tying[{extra}]'" in err and f"'.[{extra}]'" in err
    assert not (tmp_path / "ct2").exists() and not (tmp_path / "demo").exists()  # failed first


def test_require_raises_an_import_error_naming_the_extra(monkeypatch):
    importlib.import_module("gensim.models")  # imported before, as another test may have
    for name in [n for n in sys.modules if n == "gensim" or n.startswith("gensim.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(MissingExtra) as e:
        require("gensim.models", extra="analysis", for_what="the word-similarity test")
    assert isinstance(e.value, ImportError) and e.value.name == "gensim"
    assert str(e.value) == ("the word-similarity test needs gensim, which is not installed: "
                            "install the 'analysis' extra, pip install "
                            "'fairseq_tying[analysis]' (from a clone: pip install "
                            "'.[analysis]')")
    assert isinstance(e.value.__cause__, ModuleNotFoundError)  # Python's own error, chained


def test_require_returns_the_module_when_it_is_there():
    assert require("scipy.stats", "analysis", "x").spearmanr is not None


def test_a_library_that_fails_to_import_is_not_called_missing(monkeypatch):
    # matplotlib is there, a library it needs is not: the message keeps Python's reason
    importlib.import_module("matplotlib")  # whole: only pyplot is imported again, and fails
    monkeypatch.delitem(sys.modules, "matplotlib.pyplot", raising=False)
    monkeypatch.setitem(sys.modules, "cycler", None)
    with pytest.raises(MissingExtra, match=r"needs matplotlib, which cannot be imported "
                                           r"\(import of cycler halted"):
        require("matplotlib.pyplot", "analysis", "x")


def test_require_refuses_a_library_its_extra_does_not_hold():
    with pytest.raises(ValueError, match="gensim is not a library of the extra 'serve'"):
        require("gensim", extra="serve", for_what="x")


def test_run_main_turns_a_missing_extra_into_a_message(capsys):
    def main() -> int:
        raise MissingExtra("it needs x")

    assert run_main(main) == 2
    assert capsys.readouterr().err == "error: it needs x\n"
    assert run_main(lambda: None) == 0 and run_main(lambda: 3) == 3


def test_the_extras_of_pyproject_hold_the_libraries_the_messages_name():
    config = read_configuration(REPO / "pyproject.toml", expand=False)["project"]
    optional = config["optional-dependencies"]

    def names(reqs: list[str]) -> set[str]:
        return {r.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip().lower()
                for r in reqs}

    for extra, libraries in EXTRAS.items():
        assert set(libraries) <= names(optional[extra]), extra
    assert not OPTIONAL & names(config["dependencies"])  # none of them in a plain install
    assert optional["all"] == [f"fairseq_tying[{','.join(EXTRAS)}]"]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return found | {n.module for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom) and n.module and not n.level}


def test_the_package_imports_an_optional_library_only_through_require():
    """An ``import`` statement of one would fail without the extra's message; the plugin core
    does not even ask for one."""
    package = REPO / "fairseq_tying"
    bad = {str(p.relative_to(REPO)): sorted(found) for p in sorted(package.rglob("*.py"))
           if (found := {m for m in _imports(p) if m.split(".")[0] in OPTIONAL})}
    assert bad == {}
    core = [p for p in (package / "core").rglob("*.py") if "extras" in p.read_text()]
    assert core == []
    assert extras.__file__  # the module the check points to exists


def test_importing_the_plugin_imports_no_optional_library():
    """What ``--user-dir fairseq_tying`` imports (scipy comes with fairseq itself)."""
    code = ("import sys, fairseq_tying\n"
            "print(sorted({m.split('.')[0] for m in sys.modules}))")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                          text=True, check=True, cwd=REPO)
    loaded = set(json.loads(proc.stdout.strip().replace("'", '"')))
    assert "fairseq" in loaded and "fairseq_tying" in loaded
    assert loaded & (OPTIONAL - {"scipy"}) == set()


def test_gpu_check_without_ctranslate2_asks_for_the_gpu_only(monkeypatch, capsys):
    """--no-ctranslate2 skips the serving engine entirely: with it hidden, the refusal on this
    CPU-only machine names the missing GPU, not the missing extra."""
    hide(monkeypatch, "ctranslate2")
    code, err = run_command("fairseq_tying.bench", ["--mode", "gpu-check", "--no-ctranslate2"],
                            monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err
    assert "needs a CUDA GPU, and torch sees none" in err and "ctranslate2" not in err
