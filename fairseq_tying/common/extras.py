"""The optional libraries (pyproject.toml's extras) and the message a command gives without one;
the entry point of a command (``run_main``), which also configures its logging.

``pip install .`` gives the plugin, data preparation and evaluation; a tool that needs more
imports it through ``require``, which names the extra to install where the import fails.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable
from types import ModuleType

# The extras of pyproject.toml and the libraries the package imports from each.
EXTRAS = {
    "serve": ("ctranslate2",),
    "analysis": ("gensim", "matplotlib", "scipy"),
    "launch": ("submitit",),
}


class MissingExtra(ImportError):
    """An optional library is not installed (or does not import): the message names the extra."""


def install_hint(extra: str) -> str:
    return f"pip install 'fairseq_tying[{extra}]' (from a clone: pip install '.[{extra}]')"


def require(module: str, extra: str, for_what: str) -> ModuleType:
    """Import ``module`` (e.g. ``"ctranslate2.converters.fairseq"``) for ``for_what`` (the
    command or flag that needs it), or raise MissingExtra naming ``extra``."""
    top = module.partition(".")[0]
    if top not in EXTRAS.get(extra, ()):
        raise ValueError(f"{top} is not a library of the extra {extra!r}: {EXTRAS}")
    try:
        return importlib.import_module(module)
    except ImportError as e:
        # e.name: the module found missing; another name means the library is there but broken
        absent = isinstance(e, ModuleNotFoundError) and (e.name or "").partition(".")[0] == top
        why = "is not installed" if absent else f"cannot be imported ({e})"
        raise MissingExtra(f"{for_what} needs {top}, which {why}: install the {extra!r} extra, "
                           f"{install_hint(extra)}", name=top) from e


def configure_logging() -> None:
    """The logging of our commands and jobs, as fairseq's CLIs configure theirs: INFO (or
    LOGLEVEL) on stderr, fairseq's format; a no-op where logging is configured already.
    Called by an entry point, never on import: importing the package configures nothing."""
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=os.environ.get("LOGLEVEL", "INFO").upper(),
        stream=sys.stderr,
    )


def run_main(main: str | Callable[[], object]) -> int:
    """A ``python -m`` entry point: ``main()`` (a module's name: its ``main``) with our logging
    (:func:`configure_logging`), where a missing extra ends the command with its message (exit
    status 2) rather than a traceback."""
    configure_logging()
    try:
        result = (importlib.import_module(main).main if isinstance(main, str) else main)()
    except MissingExtra as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return result if isinstance(result, int) else 0


def pyplot(for_what: str) -> ModuleType:
    """``matplotlib.pyplot`` drawing to files (the Agg backend, no display) for ``for_what``."""
    require("matplotlib", extra="analysis", for_what=for_what).use("Agg")
    return require("matplotlib.pyplot", extra="analysis", for_what=for_what)
