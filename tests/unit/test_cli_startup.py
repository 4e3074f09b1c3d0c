"""``cascade version`` and ``--help`` answer at once: no web stack, client or settings model is imported
(typer itself brings pydantic).

The time is printed (the goal is under 0.3 s on the CI machine); what is asserted is the cause
of slowness, which does not depend on how loaded the machine is.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

HEAVY = ("fastapi", "pydantic_settings", "kafka", "redis", "kubernetes", "kserve", "httpx", "uvicorn",
         "jsonschema", "cloudevents", "torch")


@pytest.mark.parametrize("argv", [["version"], ["--help"], ["jobs", "--help"]])
def test_cli_answers_without_importing_the_platform(argv: list[str]) -> None:
    code = ("import sys, json\nfrom cascade.cli.main import app\n"
            "try:\n    app(" + repr(argv) + ")\nexcept SystemExit:\n    pass\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    elapsed = time.monotonic() - started
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"cascade {' '.join(argv)}: {elapsed:.3f}s")
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))
