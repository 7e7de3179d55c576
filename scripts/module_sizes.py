"""The size rule of docs/testing.md ("Static checks"): no Python module in the repository over 400 lines.

Run by ``make lint`` (so by CI) as ``python scripts/module_sizes.py``: it names every module over the limit
and exits 1, so a module grows past it only in a commit that splits it. Why a limit at all: a module named
after what it holds stays small enough to read in one sitting, and one that keeps growing is two modules.
"""

from __future__ import annotations

import sys
from pathlib import Path

LIMIT = 400


#: the folders of the repository's own Python (not a virtual environment or a build folder beside them)
FOLDERS = ("gpucost", "tests", "benchmarks", "scripts", "examples", "compose")


def too_long(root: Path) -> list[tuple[str, int]]:
    """(path, lines) of every Python file under ``root``'s ``FOLDERS`` with more than ``LIMIT`` lines."""
    files = [path for folder in FOLDERS for path in sorted((root / folder).rglob("*.py"))]
    sizes = ((path.relative_to(root).as_posix(), len(path.read_text(encoding="utf-8").splitlines())) for path in files)
    return [(path, n) for path, n in sizes if n > LIMIT]


def main() -> int:
    over = too_long(Path(__file__).resolve().parent.parent)
    for path, n in over:
        print(f"{path}: {n} lines, over the {LIMIT}-line limit: split it into modules named after what they hold")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
