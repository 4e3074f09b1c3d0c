"""Builds Cascade, with the scheduler's decision path compiled by mypyc.

Every booking, release and admission pass runs through five modules of ``cascade.scheduling``
(accelerators, frameworks, placement, matcher, ledger). They are plain, strictly typed Python and
stay the reference; mypyc compiles them to C extensions that sit beside them (about 1.7 times as
fast on the placement benchmark). Everything else in ``pyproject.toml``; this file only adds those
extensions. Where mypy or a C compiler is missing, or ``CASCADE_PURE_PYTHON=1`` is set, the
package installs as plain Python and behaves the same.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import setup

COMPILED = ["accelerators", "frameworks", "placement", "matcher", "ledger"]  # cascade/scheduling/<name>.py


def extensions() -> list[Any]:
    if os.environ.get("CASCADE_PURE_PYTHON") == "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("setup: mypyc is not installed; the scheduler installs as plain Python", file=sys.stderr)
        return []
    try:
        # No config file: the project's mypy settings need plugins a build environment lacks, and the strict check
        # runs in scripts/check.sh. The group name puts mypyc's shared library inside the package
        # (cascade/scheduling__mypyc), where every process that imports cascade finds it.
        built = mypycify(["--config-file=", "--ignore-missing-imports", "--follow-imports=silent",
                          *[f"cascade/scheduling/{name}.py" for name in COMPILED]],
                         group_name="cascade.scheduling", opt_level="3")
    except (Exception, SystemExit) as exc:  # mypyc refused the sources: build the rest, say so
        print(f"setup: mypyc could not compile the scheduler ({exc}); it installs as plain Python", file=sys.stderr)
        return []
    for ext in built:
        ext.optional = True  # no C compiler: the sources are used as they are
    return built


setup(ext_modules=extensions())
