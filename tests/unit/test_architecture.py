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


def test_the_wheel_lists_every_package_under_one_root() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tool["package-dir"] == PACKAGE_DIRS
    found = set()
    for name, folder in PACKAGE_DIRS.items():
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                rel = path.parent.relative_to(ROOT / folder)
                found.add(".".join([name, *rel.parts]))
    assert set(tool["packages"]) == found
    assert all(p == "cascade" or p.startswith("cascade.") for p in tool["packages"])
    data = tool["package-data"]
    for name in found:
        folder = ROOT / PACKAGE_DIRS[next(n for n in sorted(PACKAGE_DIRS, key=len, reverse=True)
                                          if name == n or name.startswith(n + "."))]
        sub = name.removeprefix(next(n for n in sorted(PACKAGE_DIRS, key=len, reverse=True)
                                     if name == n or name.startswith(n + "."))).strip(".")
        path = folder.joinpath(*sub.split(".")) if sub else folder
        extra = {p.suffix for p in path.iterdir() if p.is_file() and p.suffix not in (".py", ".pyc")}
        for suffix in extra:
            assert any(pattern.endswith(suffix) for pattern in data.get(name, [])), f"{name}: *{suffix} not shipped"
