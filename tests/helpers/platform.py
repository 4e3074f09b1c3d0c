"""`cascade up` in a subprocess, as a user runs it, for the integration and end-to-end tests."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from cascade.core.ports import free_port

# Scale down within seconds instead of Knative's 60 s window and 30 s grace.
FAST = {"CASCADE_FUNCTIONS__ANNOTATIONS": '{"autoscaling.knative.dev/window": "2s"}',
        "CASCADE_FUNCTIONS__SCALE_TO_ZERO_GRACE_SECONDS": "2",
        "CASCADE_SERVING__ANNOTATIONS": '{"autoscaling.knative.dev/window": "2s"}',
        "CASCADE_SERVING__SCALE_TO_ZERO_GRACE_SECONDS": "2"}
PORTS = {"gateway": "CASCADE_GATEWAY__PORT", "runtime": "CASCADE_FUNCTIONS__PORT", "dashboard": "CASCADE_DASHBOARD__PORT"}


@dataclass
class Running:
    env: dict[str, str]
    gateway: str
    runtime: str
    dashboard: str
    log: Path
    proc: subprocess.Popen[bytes]
    command: list[str]
    cwd: Path | None = None

    def cascade(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.command, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                              cwd=self.cwd)

    @property
    def token(self) -> str:
        return (Path(self.env["CASCADE_HOME"]) / "token").read_text().strip()

    @property
    def auth(self) -> dict[str, str]:
        """Headers with the project token (project ``default``, every scope)."""
        return {"authorization": f"Bearer {self.token}"}

    @property
    def admin(self) -> dict[str, str]:
        """Headers with the platform credential (the runtime's admin API)."""
        return {"authorization": f"Bearer {(Path(self.env['CASCADE_HOME']) / 'platform.token').read_text().strip()}"}

    def script(self, source: Path, project: str = "default") -> str:
        """Copy a training script into the project's workspace; the relative name a job spec names."""
        workspace = Path(self.env["CASCADE_HOME"]) / "workspaces" / project
        workspace.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, workspace / source.name)
        return source.name


def wait_ready(proc: subprocess.Popen[Any], urls: list[str], timeout: float, why: Callable[[], str],
               verify: ssl.SSLContext | bool = True) -> None:
    """Until every URL answers 200; fails at once if ``proc`` exits (``why()`` says what it printed)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if all(httpx.get(url, verify=verify).status_code == 200 for url in urls):
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, f"exited with {proc.returncode}: {why()}"
        assert time.monotonic() < deadline, f"not ready within {timeout:g}s: {why()}"
        time.sleep(0.1)


@contextmanager
def cascade_up(home: Path, *args: str, fast: bool = True, python: str = sys.executable, cwd: Path | None = None,
               wait_for: tuple[str, ...] = ("gateway", "runtime", "dashboard"), **env: str) -> Iterator[Running]:
    """Start it with ``args``, wait until gateway, runtime and dashboard answer; stop it after.

    ``fast``: functions and model servers scale down within seconds (``FAST``). ``python``:
    the interpreter whose install of Cascade runs (the wheel test's own venv); ``cwd``: where.
    ``wait_for``: which servers must answer first (a user who saw the gateway ready may send at once).
    """
    command = [python, "-m", "cascade.cli"]
    ports = {name: int(env.pop(key, 0)) or free_port() for name, key in PORTS.items()}  # a restart keeps its ports
    full = {**os.environ, **(FAST if fast else {}), "CASCADE_HOME": str(home),
            **{key: str(ports[name]) for name, key in PORTS.items()}, "CASCADE_DISPATCHER__METRICS_PORT": "0", "CASCADE_BUS__SESSION_TIMEOUT": "6", "PYTHONUNBUFFERED": "1", **env}
    log = home / "up.log"
    home.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen([*command, "up", *args], env=full, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                start_new_session=True)  # its own process group: a fault test can kill the tree
    cert = full.get("CASCADE_GATEWAY__TLS_CERT_FILE", "")  # an HTTPS gateway: trust its self-signed certificate
    running = Running(full, f"{'https' if cert else 'http'}://127.0.0.1:{ports['gateway']}",
                      *(f"http://127.0.0.1:{ports[n]}" for n in ("runtime", "dashboard")), log, proc, command, cwd)
    try:
        urls = {"gateway": f"{running.gateway}/readyz", "runtime": f"{running.runtime}/readyz",
                "dashboard": running.dashboard}
        wait_ready(proc, [urls[name] for name in wait_for], 90, lambda: log.read_text()[-3000:],
                   ssl.create_default_context(cafile=cert) if cert else True)
        yield running
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=90)
