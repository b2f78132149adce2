"""The package's layout rules (README, "Layout"): one file name per module, a plugin core that
imports nothing from the tools, and no test infrastructure in the installed package."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from collections import Counter
from pathlib import Path

from setuptools import find_packages
from setuptools.config.pyprojecttoml import read_configuration

from tests.helpers import REPO

PACKAGE = REPO / "fairseq_tying"
CORE = "fairseq_tying.core"


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module an ``import`` in ``source`` names (at any depth: function-level imports
    count), relative imports resolved against ``module``; ``from X import y`` names X.y."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*parent, *([base] if base else [])])
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def _outside_core(names: set[str]) -> set[str]:
    return {n for n in names if n.split(".")[0] == "fairseq_tying"
            and n != CORE and not n.startswith(CORE + ".")}


def test_no_two_modules_share_a_file_name():
    names = Counter(p.name for p in _modules() if p.name not in ("__init__.py", "__main__.py"))
    shared = {name: sorted(str(p.relative_to(PACKAGE)) for p in _modules() if p.name == name)
              for name, n in names.items() if n > 1}
    assert not shared


def test_the_plugin_core_imports_nothing_from_the_tools():
    files = [PACKAGE / "__init__.py", *sorted((PACKAGE / "core").rglob("*.py"))]
    assert len(files) > 10
    bad = {}
    for path in files:
        found = imported_modules(path.read_text(), _module_name(path), path.name == "__init__.py")
        if _outside_core(found):
            bad[str(path.relative_to(REPO))] = sorted(_outside_core(found))
    assert not bad


def test_the_import_check_sees_tool_imports_at_any_depth():
    source = ("import fairseq_tying.common\n"
              "def f():\n    from fairseq_tying.evaluation import metrics\n"
              "from ..launch import config\nfrom . import scoring\n"
              "from fairseq_tying import core\nimport fairseq\n")
    found = imported_modules(source, "fairseq_tying.core.modules")
    assert _outside_core(found) == {"fairseq_tying.common", "fairseq_tying.evaluation.metrics",
                                    "fairseq_tying.launch.config"}
    assert {"fairseq_tying.core.scoring", "fairseq_tying.core", "fairseq"} <= found


def test_the_slurm_test_cluster_is_not_in_the_installed_package():
    assert importlib.util.find_spec("fairseq_tying.launch.localcluster") is None
    assert (REPO / "tests" / "slurm" / "localcluster.py").is_file()
    mentions = [str(p.relative_to(REPO)) for p in _modules()
                if any(word in p.read_text().lower() for word in ("mariadb", "slurmdbd"))]
    assert not mentions
    config = read_configuration(REPO / "pyproject.toml", expand=False)
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_packages(str(REPO), include=include)
    assert "fairseq_tying.core" in packages
    assert all(p.split(".")[0] == "fairseq_tying" for p in packages)  # no tests.* shipped


def test_every_import_of_the_package_names_something_that_exists():
    """Function-level imports run only when their function does (an evaluation job, a tool's
    rare branch), and ruff does not resolve names across modules: import each one here."""
    missing = []
    for path in _modules():
        for name in sorted(imported_modules(path.read_text(), _module_name(path),
                                            path.name == "__init__.py")):
            if name.split(".")[0] != "fairseq_tying" or _is_module(name):
                continue
            module, _, attr = name.rpartition(".")
            if not hasattr(importlib.import_module(module), attr):
                missing.append(f"{path.relative_to(REPO)}: {name}")
    assert not missing


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent is a module, not a package: name is an attribute
        return False
