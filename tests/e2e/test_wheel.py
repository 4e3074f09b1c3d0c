"""The built wheel, installed (not editable) into a fresh venv, runs the whole platform.

``cascade up`` starts from an empty folder that holds a ``schemas/`` folder (the name of one of
the old top-level packages) and a user function with its own ``schemas.py`` and ``events/``:
the platform functions (func.yaml and handler shipped as package data) are served, an event
reaches the user function (which sees its own modules), and ``cascade demo`` completes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.helpers.platform import cascade_up
from tests.helpers.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
PLATFORM_FUNCTIONS = {"deploy-model", "launch-finetune", "launch-training", "release-model"}

HANDLER = '''"""A user function whose module names are the ones Cascade used to install at top level."""
import json
import os

import schemas  # this function's own schemas.py
from events import helper  # and its own events/ package


def handle(event):
    with open(os.environ["ECHO_OUT"], "a") as out:
        out.write(json.dumps({"id": event["id"], "mark": schemas.MARK, "helper": helper.NAME}) + "\\n")
'''


@pytest.fixture(scope="module")
def wheel_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    venv = tmp_path_factory.mktemp("wheel") / "venv"
    out = subprocess.run([str(ROOT / "scripts" / "wheel-venv.sh"), str(venv)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    python = out.stdout.strip().splitlines()[-1]
    where = subprocess.run([python, "-P", "-c", "import cascade.events; print(cascade.events.__file__)"],
                           capture_output=True, text=True, check=True, cwd=venv).stdout
    assert str(venv) in where, f"cascade.events came from {where}, not the wheel"
    return python


def user_folder(tmp_path: Path) -> tuple[Path, Path]:
    work = tmp_path / "work"
    (work / "schemas").mkdir(parents=True)
    (work / "schemas" / "notes.txt").write_text("a folder that once shadowed Cascade's schemas package\n")
    fn = work / "fns" / "echo"
    (fn / "events").mkdir(parents=True)
    (fn / "events" / "__init__.py").write_text("")
    (fn / "events" / "helper.py").write_text("NAME = 'user-events'\n")
    (fn / "schemas.py").write_text("MARK = 'user-schemas'\n")
    (fn / "handler.py").write_text(HANDLER)
    out = tmp_path / "echo.jsonl"
    (fn / "func.yaml").write_text(json.dumps({
        "name": "echo", "module": "handler", "env": {"ECHO_OUT": str(out)},
        "triggers": [{"name": "echo", "filters": [{"exact": {"type": "io.cascade.dataset.uploaded.v1"}}]}]}))
    return work, out


@pytest.mark.slow
def test_the_installed_wheel_serves_platform_and_user_functions(wheel_python: str, tmp_path: Path) -> None:
    work, out = user_folder(tmp_path)
    with cascade_up(tmp_path / "home", python=wheel_python, cwd=work,
                    CASCADE_FUNCTIONS__PATHS=json.dumps([str(work / "fns")])) as running:
        listed = running.cascade("functions", "ls")
        assert listed.returncode == 0, listed.stderr
        assert all(name in listed.stdout for name in PLATFORM_FUNCTIONS | {"echo"}), listed.stdout
        event = {"specversion": "1.0", "id": "wheel-1", "source": "/test/wheel", "datacontenttype": "application/json",
                 "type": "io.cascade.dataset.uploaded.v1",
                 "data": {"dataset": "cats", "uri": "file:///tmp/cats/1.jpg", "size": 1, "origin": "api"}}
        reply = httpx.post(f"{running.gateway}/events", json=event,
                           headers={"authorization": f"Bearer {running.token}",
                                    "content-type": "application/cloudevents+json"})
        assert reply.status_code == 202, reply.text
        eventually(lambda: out.exists() and bool(out.read_text().strip()), 60, "the event reaching the user function")
        assert json.loads(out.read_text().splitlines()[0]) == {"id": "wheel-1", "mark": "user-schemas",
                                                              "helper": "user-events"}
        demo = running.cascade("demo", "--timeout", "240")
        assert demo.returncode == 0, demo.stdout + demo.stderr + running.log.read_text()[-3000:]
        assert "demo complete" in demo.stdout
