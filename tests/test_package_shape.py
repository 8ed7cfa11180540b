"""The package's shape (issues 15 and 31): no module imports another's private names, and no
module is over 600 lines. The import direction is checked by lint-imports (.ci/run)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "planner"
MAX_LINES = 600      # issue 31: "no module over 600 lines"


@pytest.mark.slow
def test_no_private_name_is_imported_across_modules() -> None:
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("planner"):
                found += [f"{path.relative_to(PACKAGE)}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, found


def test_no_module_is_over_600_lines() -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long
