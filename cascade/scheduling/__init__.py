"""Where a job runs: accelerator requests, the framework x accelerator matrix, flavors, the matcher.

Used by the training plane (``cascade.functions``) and the image renderer; it imports no
other plane. Its decision path may be compiled by mypyc at install time (``setup.py``); in a
source checkout, a compiled module older than its source would run the old code, so importing
the package refuses that and names the fix.
"""

from __future__ import annotations

from pathlib import Path


def _refuse_stale_builds() -> None:
    here = Path(__file__).parent
    if not (here.parent.parent / ".git").exists():  # an installed wheel: built from exactly the sources beside it
        return
    for built in here.glob("*.so"):
        source = here / f"{built.name.split('.')[0]}.py"
        if source.exists() and source.stat().st_mtime > built.stat().st_mtime:
            raise ImportError(f"{source} changed after it was compiled into {built.name}: run `pip install -e .` "
                              f"again (or delete {here}/*.so to run the sources as plain Python)")


_refuse_stale_builds()
