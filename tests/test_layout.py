"""The package's layout rules (docs/design.md, "Layout"): one file name per module, a plugin
core that imports nothing from the tools, no import from a higher floor, function-level imports
of the package's modules only where listed with their reason, the evaluation of one run that
imports nothing from the comparison of runs, views that import no other view, no test
infrastructure in the installed package, no module over 450 lines, no import cycle, state-dict
keys spelled in the core only, and no decision by an output layer's or a tying mode's name
outside its registry."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
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


def _imports_of(room: str) -> dict[str, set[str]]:
    """``{module: the modules its imports name}`` for every module of ``fairseq_tying.ROOM``."""
    return {_module_name(p): imported_modules(p.read_text(), _module_name(p),
                                              p.name == "__init__.py")
            for p in sorted((PACKAGE / room).rglob("*.py"))}


def test_evaluating_a_run_imports_nothing_from_the_comparison_of_runs():
    """``evaluation`` scores one run; ``studies`` compares runs and leans on it, never the
    other way: a run is evaluated (on a GPU machine, in a SLURM job) without the across-run
    engine, its views or plots."""
    found = _imports_of("evaluation")
    assert len(found) > 8 and "fairseq_tying.evaluation.metrics" in found
    assert any(n.startswith("fairseq_tying.evaluation.") for n in
               _imports_of("studies")["fairseq_tying.studies.records.records"])
    bad = {m: sorted(n for n in names if (n + ".").startswith("fairseq_tying.studies."))
           for m, names in found.items()}
    assert {m: names for m, names in bad.items() if names} == {}


def test_no_view_imports_another_view():
    """Each view renders its own block; what views share (formatting, the papers' numbers)
    lives in ``studies.views.formatting``, so a view is read and changed on its own."""
    views = {m: names for m, names in _imports_of("studies").items()
             if m.rpartition(".")[2].startswith("view_")}
    assert len(views) >= 4
    bad = {m: sorted(n for n in names if any(n == v or n.startswith(v + ".") for v in views))
           for m, names in views.items()}
    assert {m: names for m, names in bad.items() if names} == {}


def unexplained_imports(source: str) -> list[int]:
    """The lines of the function-level imports of ``source`` whose function does not say why
    in a comment on the line above its first import (or on that import's line)."""
    lines = source.splitlines()
    bad = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        imports = sorted(n.lineno for n in ast.walk(fn) if isinstance(n, (ast.Import,
                                                                          ast.ImportFrom)))
        first = imports[0] if imports else None
        if first and not (lines[first - 2].strip().startswith("#") or "#" in lines[first - 1]):
            bad += imports
    return bad


def test_imports_are_at_the_top_unless_a_comment_says_why():
    """The imports a reader sees at the top are the module's dependencies; a function imports
    only what is kept off a fast path (matplotlib off --help, sacremoses off a training job),
    and says so in a comment."""
    bad = {str(p.relative_to(REPO)): lines for p in _modules()
           if (lines := unexplained_imports(p.read_text()))}
    assert bad == {}
    assert unexplained_imports("def f():\n    x = 1\n    import os\n") == [3]
    assert unexplained_imports("def f():\n    # os: why\n    import os\n    import re\n") == []


def test_importing_the_tools_neither_looks_like_training_nor_configures_logging():
    """The plugin reads an imported ``fairseq_cli.train`` as running under fairseq-train (and
    then guards a resume, core/models/guards.py): no module of the package imports it at the
    top, so a tool that builds a model (params, export, bench) is not taken for a training.
    Importing them leaves logging to the host (fairseq's modules that configure it when
    imported included); a command configures its own in its entry point."""
    modules = sorted(_module_name(p) for p in _modules() if p.name != "__main__.py")
    code = ("import importlib, logging, sys\n"
            f"for m in {modules!r}:\n    importlib.import_module(m)\n"
            "assert 'fairseq_cli.train' not in sys.modules\n"
            "assert 'fairseq.models.wav2vec.wav2vec2_classification' in sys.modules\n"
            "assert (logging.root.handlers, logging.root.level) == ([], logging.WARNING)\n")
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True, cwd=REPO,
                   capture_output=True)


def test_the_tests_share_their_helpers_through_helpers_py():
    """What several test modules need (REPO, the CLI runners, tiny data and models) is in
    tests/helpers.py, once: no test module defines REPO or imports another test module."""
    bad = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text())
        if path.name != "helpers.py" and any(
                isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "REPO"
                                                     for t in node.targets)
                for node in tree.body):
            bad.append(f"{path.relative_to(REPO)}: defines REPO")
        bad += [f"{path.relative_to(REPO)}: imports {node.module}" for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    ("tests.test_", "tests.committed.test_", "tests.slurm.test_"))]
    assert bad == []


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


MAX_LINES = 450


def test_no_module_is_longer_than_450_lines():
    """A module that grows past this does more than one job: split it by job."""
    lines = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in _modules()}
    assert {p: n for p, n in lines.items() if n > MAX_LINES} == {}


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """``{module: the package modules it imports}`` for ``{module: (source, is_package)}``;
    imports at any depth count (a function-level import is a dependency once the function
    runs), and ``from pkg import name`` depends on ``pkg`` unless ``pkg.name`` is a module."""
    graph: dict[str, set[str]] = {}
    for module, (source, is_package) in sources.items():
        deps = set()
        for name in imported_modules(source, module, is_package):
            target = name if name in sources else name.rpartition(".")[0]
            if target in sources and target != module:
                deps.add(target)
        graph[module] = deps
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """The modules ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        new = graph[todo.pop()] - seen
        seen |= new
        todo.extend(new)
    return seen


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of more than one module that import one another, directly or not (the
    strongly connected components), each sorted."""
    reach = {v: _reachable(graph, v) for v in graph}
    groups = {tuple(sorted({v, *(w for w in reach[v] if v in reach[w])})) for v in graph}
    return sorted(list(g) for g in groups if len(g) > 1)


def _package_sources() -> dict[str, tuple[str, bool]]:
    return {_module_name(p): (p.read_text(), p.name == "__init__.py") for p in _modules()}


def test_no_import_cycle_among_the_package_modules():
    """Modules import one another one way only, function-level imports included: each tool
    can be read, tested and split without the others that lean on it."""
    graph = import_graph(_package_sources())
    assert len(graph) > 50 and "fairseq_tying.core.scoring" in graph["fairseq_tying.core.modules"]
    assert import_cycles(graph) == []


def test_the_cycle_check_finds_a_cycle_through_a_function_level_import():
    sources = {"p": ("", True), "p.a": ("from p import b\n", False),
               "p.b": ("def f():\n    from p.c import g\n", False),
               "p.c": ("import p.a\nX = 1\n", False), "p.d": ("from p.c import X\n", False)}
    graph = import_graph(sources)
    assert graph == {"p": set(), "p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.c"}}
    assert import_cycles(graph) == [["p.a", "p.b", "p.c"]]


def _strings(source: str) -> list[str]:
    """The string constants of ``source`` that are not docstrings (f-string parts included)."""
    tree = ast.parse(source)
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docs]


def test_state_dict_keys_are_spelled_in_the_core_only():
    """The scorer's parameter key and the other state-dict keys the tools need come from
    ``fairseq_tying.core.names``: a tool that spells ``"decoder.scorer.weight"`` would go
    on reading the old key after the core renamed it."""
    key = re.compile(r"(encoder|decoder)\.\w+(\.\w+)*|.*\bscorer\.(weight|projection|bias)\b.*")
    spelled = {str(p.relative_to(REPO)): found for p in _modules()
               if not _module_name(p).startswith(CORE)
               and (found := [s for s in _strings(p.read_text()) if key.fullmatch(s)])}
    assert spelled == {}
    names_py = (PACKAGE / "core" / "names.py").read_text()
    assert '"decoder.scorer.weight"' in names_py
    assert _strings('"""doc"""\nK = f"decoder.scorer.weight"\n') == ["decoder.scorer.weight"]


def test_reading_a_sweep_file_needs_neither_fairseq_nor_the_evaluation():
    """sweeps/sweepfile.py and every package module it leans on (at any depth) import no
    fairseq, torch, core or evaluation: checking a sweep file's keys needs none of them, and
    only sweeps/grid.py consults fairseq's registry and the evaluation's flags."""
    sources = _package_sources()
    graph = import_graph(sources)
    needed, todo = set(), ["fairseq_tying.sweeps.sweepfile"]
    while todo:
        if (module := todo.pop()) not in needed:
            needed.add(module)
            todo += graph[module]
    assert {"fairseq_tying.sweeps.sweep", "fairseq_tying.sweeps.plateau"} <= needed
    heavy = ("fairseq.", "fairseq_cli.", "torch.", "fairseq_tying.core.",
             "fairseq_tying.evaluation.", "fairseq_tying.studies.", "fairseq_tying.sweeps.grid.")
    found = {m: sorted(n for n in imported_modules(sources[m][0], m, sources[m][1])
                       if (n + ".").startswith(heavy)) for m in needed}
    assert {m: names for m, names in found.items() if names} == {}
    assert "fairseq_tying.sweeps.grid" in graph["fairseq_tying.sweeps.config"]


REGISTRY = PACKAGE / "core" / "output_layers.py"


def layer_name_tests(source: str, layers: set[str]) -> list[int]:
    """The lines of ``source`` that decide something by an output layer's name: a comparison
    or membership test with the name (``la == "dot"``, ``la in {"l2norm", "fixnorm"}``), or a
    set or mapping keyed by it (``{"dot": 34.24}``, ``frozenset({"fixnorm"})``)."""
    def named(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value in layers

    def holds(node: ast.AST) -> bool:
        return named(node) or (isinstance(node, (ast.Tuple, ast.List, ast.Set))
                               and any(named(e) for e in node.elts))

    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(holds(n) for n in (node.left, *node.comparators)):
            lines.add(node.lineno)
        elif isinstance(node, ast.Dict) and any(k is not None and named(k) for k in node.keys):
            lines.add(node.lineno)
        elif isinstance(node, ast.Set) and any(named(e) for e in node.elts):
            lines.add(node.lineno)
    return sorted(lines)


def test_what_a_layer_is_lives_in_the_registry_only():
    """Each output layer is one class of core/output_layers.py: its equation, (W_out, b), input
    lookups, learned scalars, cache, exports, citation and figures. Nothing else in the package
    decides by a layer's name, so a new layer is one class (and its test)."""
    from fairseq_tying.core import output_layers

    layers = set(output_layers.PAPER_LAYERS) | set(output_layers.names())
    found = [f"{p.relative_to(REPO)}:{line}" for p in _modules() if p != REGISTRY
             for line in layer_name_tests(p.read_text(), layers)]
    assert found == []
    assert REGISTRY.is_file()
    source = ('if la == "dot":\n    pass\nx = la in ("l2norm", "fixnorm")\n'
              'y = {"cosine": 1}\nz = frozenset({"sqnorm"})\nok = ["dot", "distance"]\n'
              'fine = la == BASELINE\n')
    assert layer_name_tests(source, layers) == [1, 3, 4, 5]


def _room(module: str) -> str:
    """The part of the package a module belongs to: ``fairseq_tying.bench.serve`` → ``bench``,
    ``fairseq_tying.demo`` → ``demo``."""
    return module.split(".")[1] if module.count(".") else module


def test_common_holds_only_what_several_rooms_use():
    """A module of common/ serves at least two of the package's rooms (data, evaluation,
    studies, launch, bench, export, analysis, the demo, translate); what one room alone uses
    lives in that room."""
    graph = import_graph(_package_sources())
    users: dict[str, set[str]] = {m: set() for m in graph
                                  if m.startswith("fairseq_tying.common.")}
    for module, deps in graph.items():
        for dep in deps & users.keys():
            if _room(module) != "common":
                users[dep].add(_room(module))
    assert {m: sorted(rooms) for m, rooms in users.items() if len(rooms) < 2} == {}
    assert "fairseq_tying.common.blocks" in users and _room("fairseq_tying.demo") == "demo"


# The floors of the package, lowest first: a module imports from its own floor or one below,
# never from one above (function-level imports included). The plugin (the package's __init__
# and core/) is what fairseq-train loads; common/ serves the tools; sweeps/ is the sweep model
# that launching and comparing runs share; then the tools of one run, the tools across runs,
# and the commands that drive them all.
FLOORS = (("fairseq_tying", "core"), ("common",), ("sweeps",),
          ("data", "evaluation", "export", "analysis", "translate"), ("studies", "bench"),
          ("launch", "demo"))


def _floor(module: str) -> int:
    return next(i for i, rooms in enumerate(FLOORS) if _room(module) in rooms)


def imports_from_above(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for each import of ``graph`` from a higher floor."""
    return sorted(f"{m} -> {dep}" for m, deps in graph.items() for dep in deps
                  if _floor(dep) > _floor(m))


def test_no_module_imports_from_a_floor_above_its_own():
    """core, then common, then sweeps, then the one-run tools (data, evaluation, export,
    analysis, translate), then studies and bench, then launch and the demo: a room leans only
    on the floors below it, so the sweep model is read without launching anything, a run is
    evaluated without the across-run engine, and each floor is tested without those above."""
    graph = import_graph(_package_sources())
    assert {_room(m) for m in graph} == {room for rooms in FLOORS for room in rooms}
    assert imports_from_above(graph) == []
    assert imports_from_above({"fairseq_tying.sweeps.grid": {"fairseq_tying.evaluation.cli",
                                                             "fairseq_tying.common"},
                               "fairseq_tying.launch.job": {"fairseq_tying.studies.collect"}}
                              ) == ["fairseq_tying.sweeps.grid -> fairseq_tying.evaluation.cli"]


# The function-level imports of the package's own modules, each keeping an optional library
# (whose absence the command then names, common/extras.py's run_main) or a slow import off a
# command's start: {(importer, imported): why}.
SACREMOSES = "sacremoses (0.7 s) off --help"
MATPLOTLIB = "matplotlib (1 s) off --help"
DEFERRED = {
    ("fairseq_tying.demo", "fairseq_tying.studies.collect"):
        "the analysis extra, named before any training",
    ("fairseq_tying.evaluation.cli", "fairseq_tying.evaluation.evaluate"): SACREMOSES,
    ("fairseq_tying.evaluation.cli", "fairseq_tying.evaluation.perplexity"): SACREMOSES,
    ("fairseq_tying.translate", "fairseq_tying.common.moses"):
        SACREMOSES + " and off a sentencepiece model",
    ("fairseq_tying.launch.__main__", "fairseq_tying.launch.sweeps"):
        "the launch extra (submitit), named when missing; new-sweep runs without it",
    ("fairseq_tying.launch.__main__", "fairseq_tying.launch.studies"):
        "the launch and analysis extras, named when missing; matplotlib off a sweep",
    ("fairseq_tying.launch.job", "fairseq_tying.evaluation.evaluate"):
        "sacremoses (0.7 s) off a training job",
    ("fairseq_tying.launch.job", "fairseq_tying.evaluation.perplexity"):
        "sacremoses (0.7 s) off a training job",
    ("fairseq_tying.launch.job", "fairseq_tying.studies.sweep_summary"):
        "matplotlib (1 s) off a training job",
    ("fairseq_tying.studies.commands", "fairseq_tying.studies.collect"): MATPLOTLIB,
    ("fairseq_tying.studies.commands", "fairseq_tying.studies.views.report"): MATPLOTLIB,
    ("fairseq_tying.studies.commands", "fairseq_tying.studies.answer"): MATPLOTLIB,
}


def function_level_imports(sources: dict[str, tuple[str, bool]]) -> set[tuple[str, str]]:
    """``(importer, imported)`` for each package module imported inside a function of
    ``sources`` (``from pkg import name``: ``pkg.name`` if it is a module, else ``pkg``)."""
    found = set()
    for module, (source, is_package) in sources.items():
        for fn in ast.walk(ast.parse(source)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    for name in imported_modules(ast.unparse(node), module, is_package):
                        target = name if name in sources else name.rpartition(".")[0]
                        if target in sources:
                            found.add((module, target))
    return found


def test_a_function_imports_a_package_module_only_to_keep_it_off_a_commands_start():
    """A module's own modules are imported at its top, where a reader sees its dependencies;
    the exceptions keep an optional library or a slow import off a command's start, each
    listed here with its reason."""
    assert function_level_imports(_package_sources()) == set(DEFERRED)
    assert all(why.strip() for why in DEFERRED.values())
    sources = {"p": ("", True), "p.a": ("import p.b\ndef f():\n    from . import c\n", False),
               "p.b": ("", False), "p.c": ("class C:\n    def g(self):\n        import p.b\n",
                                           False)}
    assert function_level_imports(sources) == {("p.a", "p.c"), ("p.c", "p.b")}


TYING_REGISTRY = PACKAGE / "core" / "models" / "tying.py"
# the comparisons with "none" that are about another option: their other side
NOT_TYING = {"opts.quantization", "quantization", "post_process", "kind"}


def tying_name_tests(source: str, modes: set[str]) -> list[int]:
    """The lines of ``source`` that compare with a tying mode's name (``t == "none"``,
    ``mode in ("none", "decoder")``), but for the ``"none"`` of another option (NOT_TYING)."""
    def named(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and node.value in modes:
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return {e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in modes}
        return set()

    lines = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        found = set().union(*map(named, sides))
        other = {ast.unparse(side) for side in sides if not named(side)}
        if found and not (found == {"none"} and other & NOT_TYING):
            lines.add(node.lineno)
    return sorted(lines)


def test_what_a_tying_mode_is_lives_in_the_registry_only():
    """Each tying mode is one ``TyingMode`` of core/models/tying.py: what it shares, how it
    exports, what it needs of the dictionaries, its label. Nothing else in the package compares
    with a mode's name: a new mode is one entry there (and its tests)."""
    from fairseq_tying.core.models import tying

    modes = set(tying.TYING_MODES)
    assert modes == {"none", "decoder", "three_way"}
    found = [f"{p.relative_to(REPO)}:{line}" for p in _modules() if p != TYING_REGISTRY
             for line in tying_name_tests(p.read_text(), modes)]
    assert found == []
    source = ('if t == "none":\n    pass\nx = mode in ("none", "decoder")\n'
              'y = "three_way" != args.tying\nok = kind == "none"\nfine = t == UNTIED.name\n'
              'z = {"decoder": 1}\n')
    assert tying_name_tests(source, modes) == [1, 3, 4]
