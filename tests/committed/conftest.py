"""The tests in this folder check the committed results (docs/*/records, the report blocks of
docs/*.md, the numbers the prose quotes) against what the records give: each is marked
``committed``, so that ``-m committed`` runs just them after a study adds records."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.committed)
