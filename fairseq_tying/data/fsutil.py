"""Atomic file-system helpers: outputs appear complete or not at all."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def replace_dir(new: Path, dest: Path) -> None:
    """Move the finished directory ``new`` to ``dest``, replacing what was there."""
    old = None
    if dest.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old.", dir=dest.parent))
        os.replace(dest, old / dest.name)
    os.replace(new, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_lines(path: Path, lines: list[str]) -> None:
    """Write one line per item through a temporary file renamed into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, path)
