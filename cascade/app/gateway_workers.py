"""The gateway over several processes sharing one listening socket (``cascade up --workers N``).

One Python process authenticates, validates and publishes about a core's worth of events: the
schema checks, the Kafka client and the ASGI server share one GIL. So ``cascade up`` binds the
gateway's port once and hands the socket to N-1 worker processes; the kernel gives each new
connection to one of the processes accepting on it (the parent serves too). Every worker has its
own bus producer (and group commit) and store connection; a project's rate limit is split evenly
between the processes, so the platform as a whole keeps the configured rate. Workers read their
settings from stdin (never from a command line), end when the parent ends (they hold the read end
of a pipe whose write end only the parent has) and are started again if they die. A labelling
webhook that reaches a worker pokes the parent's reconciler through a datagram socket.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from cascade.core.errors import InvalidInput
from cascade.core.settings import Settings

log = logging.getLogger("cascade.gateway")
GATEWAY_GRACE = 5  # seconds a stopping gateway lets requests finish; edge release streams never do, they reconnect


def usable_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota (a container's limit)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def processes(cfg: Settings) -> int:
    """How many processes serve the gateway: ``gateway.workers``, or one per usable core."""
    return cfg.gateway.workers or usable_cores()


def listen(host: str, port: int) -> socket.socket:
    """The gateway's listening socket, inheritable by worker processes."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"gateway: cannot listen on {host}:{port} ({exc.strerror}; is its port in use?)") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def share(cfg: Settings, processes: int) -> Settings:
    """The settings each of ``processes`` gateway processes runs with: its share of every project's rate."""
    gateway = cfg.gateway.model_copy(update={"rate_per_second": cfg.gateway.rate_per_second / processes,
                                             "burst": max(1, math.ceil(cfg.gateway.burst / processes))})
    return cfg.model_copy(update={"gateway": gateway})


class Pokes:
    """The parent's end of the workers' webhook pokes: a datagram socket in the abstract namespace. Any local
    user can see such a socket's name, so a poke counts only with the secret the workers got on stdin."""

    def __init__(self, poke: Callable[[str], None]) -> None:
        self.address = f"\0cascade-poke-{uuid.uuid4().hex}"
        self.secret = secrets.token_hex(16)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.address)
        self.poke = poke
        threading.Thread(target=self._run, name="gateway-pokes", daemon=True).start()

    def _run(self) -> None:
        prefix = f"{self.secret}:".encode()
        while True:
            try:
                message = self.sock.recv(512)
            except OSError:
                return  # closed
            if message.startswith(prefix) and len(message) > len(prefix):
                self.poke(message[len(prefix):].decode("utf-8", "replace"))

    def close(self) -> None:
        self.sock.close()


class Workers:
    """N gateway worker processes on the parent's listening socket, restarted when one dies."""

    def __init__(self, cfg: Settings, sock: socket.socket, count: int, pokes: Pokes | None) -> None:
        self.cfg, self.sock, self.count, self.pokes = cfg, sock, count, pokes
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * count
        self._lifeline_r, self._lifeline_w = os.pipe()  # the write end stays here: EOF means the parent is gone
        self._stopping = threading.Event()
        self._restarts = [0.0] * count

    def _spawn(self, i: int) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "cascade.app.gateway_workers", str(self.sock.fileno()),
                                 str(self._lifeline_r)], stdin=subprocess.PIPE, env=env,
                                pass_fds=(self.sock.fileno(), self._lifeline_r))
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps({"settings": self.cfg.model_dump(mode="json"),
                                         "poke": self.pokes.address if self.pokes else "",
                                         "secret": self.pokes.secret if self.pokes else ""}).encode())
            proc.stdin.close()
        except OSError as exc:  # it died before reading its settings: the watcher starts it again
            log.warning("gateway worker %d did not take its settings (%s)", i, exc)
        self.procs[i] = proc

    def start(self) -> Workers:
        for i in range(self.count):
            self._spawn(i)
        threading.Thread(target=self._watch, name="gateway-workers", daemon=True).start()
        return self

    def _watch(self) -> None:
        """Start a worker that died again, at most once a second each."""
        while not self._stopping.wait(0.5):
            for i, proc in enumerate(self.procs):
                if proc is not None and proc.poll() is not None and time.monotonic() - self._restarts[i] >= 1.0:
                    log.warning("gateway worker %d exited with %s; starting it again", i, proc.returncode)
                    self._restarts[i] = time.monotonic()
                    self._spawn(i)

    def stop(self, timeout: float = 30.0) -> None:
        """Let every worker finish its requests in flight, then end."""
        self._stopping.set()
        live = [p for p in self.procs if p is not None and p.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in live:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        os.close(self._lifeline_w)
        os.close(self._lifeline_r)


def tls(cfg: Settings) -> tuple[str, str] | None:
    """The gateway's certificate and key files when it serves HTTPS; a half-configured pair is named."""
    cert, key = cfg.gateway.tls_cert_file, cfg.gateway.tls_key_file
    if bool(cert) != bool(key):
        raise InvalidInput("HTTPS needs both gateway.tls_cert_file and gateway.tls_key_file", field="gateway.tls_key_file")
    return (str(cert), str(key)) if cert and key else None


def _serve(fd: int, lifeline: int) -> None:
    """A worker: the gateway app on the inherited socket until SIGTERM or the parent's end."""
    from cascade.app import wiring
    from cascade.app.platform import job_check
    from cascade.core.asgi import ServerThread, wait_started
    from cascade.core.credentials import platform_token
    from cascade.events.gateway import create_app
    from cascade.serving.artifacts import ArtifactPolicy

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    given = json.loads(sys.stdin.read())
    cfg = Settings.model_validate(given["settings"])
    state, bus = wiring.store(cfg), wiring.bus(cfg)
    poke = None
    if given["poke"]:
        out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

        def poke(conn_id: str) -> None:
            try:
                out.sendto(f"{given['secret']}:{conn_id}".encode(), given["poke"])
            except OSError:  # the parent is going away; its reconciler asks every tool on start anyway
                pass
    app = create_app(bus, state, cfg.gateway, cfg.bus.topic, platform_token=platform_token(cfg.home),
                     check_job=job_check(cfg, state), hosts=cfg.allowed_hosts(cfg.gateway.host), poke=poke,
                     public_url=cfg.sources.public_url,
                             open_artifact=ArtifactPolicy.from_settings(cfg).local)
    server = ServerThread(app, cfg.gateway.host, cfg.gateway.port, name="gateway", tls=tls(cfg), graceful=GATEWAY_GRACE,
                          header_timeout=cfg.security.header_timeout_seconds, sock=socket.socket(fileno=fd)).begin()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent decides

    def parent_gone() -> None:
        while os.read(lifeline, 1):
            pass
        done.set()
    threading.Thread(target=parent_gone, name="lifeline", daemon=True).start()
    wait_started([server])
    while not done.wait(0.5):
        if not server.alive:
            sys.exit(1)
    server.stop()
    bus.close()
    state.close()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
