"""Atomic file writes: outputs appear complete or not at all.

Each writes a temp file (or folder) beside the target, then ``os.replace``s it into place.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` and move the result onto ``path``; nothing half-written stays."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual file mode
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | os.PathLike, text: str) -> Path:
    def _write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    return atomic_write(path, _write)


def write_lines(path: str | os.PathLike, lines: list[str]) -> Path:
    return write_text(path, "".join(line + "\n" for line in lines))


def write_json(path: str | os.PathLike, data: Any, **dump_options: Any) -> Path:
    options = {"indent": 2, "ensure_ascii": False, **dump_options}
    return write_text(path, json.dumps(data, **options) + "\n")


def replace_dir(new: Path, dest: Path) -> None:
    """Move the finished directory ``new`` to ``dest``, replacing what was there."""
    old = None
    if dest.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old.", dir=dest.parent))
        os.replace(dest, old / dest.name)
    os.replace(new, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def building_dir(dest: str | os.PathLike) -> Iterator[Path]:
    """A fresh folder beside ``dest`` to fill; when the block ends without error it replaces
    ``dest`` (mode 0755), otherwise it is removed and ``dest`` stays as it was."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        yield work
        work.chmod(0o755)  # mkdtemp makes it 0700
        replace_dir(work, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def split_lines(text: str) -> list[str]:
    """The lines of ``text`` broken at ``\\n`` alone, as fairseq, grep, sed and the Moses
    scripts read them (``str.splitlines`` also breaks at \\r, \\x0b, \\x1c-\\x1e, \\x85
    and \\u2028, which would misalign the two sides of a pair); a ``\\r`` before the break
    is dropped."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final line break ends the last line; it starts no new one
    return [line.removesuffix("\r") for line in lines]


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 text file (``split_lines``)."""
    with open(path, encoding="utf-8", newline="") as f:
        return split_lines(f.read())
