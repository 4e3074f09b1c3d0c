"""The repository's own rules that need no build: docstrings, and one import root.

Layers (import-linter) and strict typing (mypy) run once per CI run in ``scripts/check.sh``
against the installed wheel, where ``cascade.events`` and friends resolve as users see them.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = {"cascade": "cascade", "cascade.events": "events", "cascade.serving": "serving",
                "cascade.functions": "functions", "cascade.schemas": "schemas"}


def test_every_module_says_why_it_exists() -> None:
    missing = []
    for folder in PACKAGE_DIRS.values():
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text().lstrip()
            if text and not text.startswith('"""'):
                missing.append(str(path.relative_to(ROOT)))
    assert missing == []


def _packages() -> dict[str, Path]:
    """Every package the repository's folders hold, by import name, with its folder."""
    found = {}
    for name, folder in PACKAGE_DIRS.items():
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                rel = path.parent.relative_to(ROOT / folder)
                found[".".join([name, *rel.parts])] = path.parent
    return found


def test_the_wheel_lists_every_package_and_data_file_under_one_root() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tool["package-dir"] == PACKAGE_DIRS
    packages = _packages()
    assert set(tool["packages"]) == set(packages)
    data = tool["package-data"]
    for name, folder in packages.items():
        for item in folder.iterdir():
            if item.is_file() and item.suffix not in (".py", ".pyc", ".so"):  # .so: built by setup.py (mypyc)
                assert any(item.match(pattern) for pattern in data.get(name, [])), f"{item} is not shipped"
