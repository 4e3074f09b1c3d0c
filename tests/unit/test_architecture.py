"""The repository's own rules, checked in the test run: layers and strict typing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_layers_point_one_way() -> None:
    result = run(str(BIN / "lint-imports"), "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr


def test_packages_are_strictly_typed() -> None:
    result = run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_module_says_why_it_exists() -> None:
    missing = []
    for package in ("cascade", "events", "serving", "functions", "schemas"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text().lstrip()
            if text and not text.startswith('"""'):
                missing.append(str(path.relative_to(ROOT)))
    assert missing == []
