"""Starting instances: by fork from a per-service template process, or as a command.

The template launcher keeps one warm template per service (``template``) and asks it for
instances; the command launcher starts any program that serves HTTP on 127.0.0.1:$PORT
(model servers). Both report readiness and exits through
callbacks, so the service never polls.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, Protocol

from cascade.core.ports import free_port
from cascade.serving.runtime.template import die_with_parent

OnReady = Callable[[str], None]
OnExit = Callable[[str, int], None]


class Launcher(Protocol):
    async def prepare(self) -> None: ...

    async def spawn(self, instance_id: str, socket_path: str) -> str:
        """Start an instance; returns the address it will listen on."""
        ...

    def terminate(self, instance_id: str) -> None: ...

    async def close(self) -> None: ...


class TemplateLauncher:
    """Forks instances of a Python handler module from a warm template."""

    def __init__(self, config: dict[str, Any], on_ready: OnReady, on_exit: OnExit) -> None:
        self.config, self.on_ready, self.on_exit = config, on_ready, on_exit
        self.proc: asyncio.subprocess.Process | None = None
        self.pids: dict[str, int] = {}
        self.ids: dict[int, str] = {}
        self._ready: asyncio.Future[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self.error = ""

    async def prepare(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            return
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-P", "-m", "cascade.serving.runtime.template",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env, start_new_session=True)
        assert self.proc.stdin is not None  # the config (secrets included) goes by pipe, never on the command line
        self.proc.stdin.write(json.dumps(self.config).encode() + b"\n")
        await self.proc.stdin.drain()
        self._reader = asyncio.create_task(self._read())
        await self._ready

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None and self._ready is not None
        async for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "template_ready" in msg and not self._ready.done():
                self._ready.set_result(None)
            elif "template_failed" in msg:
                self.error = msg["template_failed"]
                if not self._ready.done():
                    self._ready.set_exception(RuntimeError(f"{self.config['name']}: {self.error}"))
            elif "spawned" in msg:
                self.pids[msg["spawned"]] = msg["pid"]
                self.ids[msg["pid"]] = msg["spawned"]
            elif "ready" in msg:
                self.on_ready(msg["ready"])
            elif "failed" in msg:
                self.error = msg["error"]
            elif "exited" in msg:
                ident = self.ids.pop(msg["exited"], None)
                if ident is not None:
                    self.pids.pop(ident, None)
                    self.on_exit(ident, msg["code"])
        for ident in list(self.pids):  # the template died: so did its bookkeeping
            self.on_exit(ident, -1)
        self.pids.clear()
        if not self._ready.done():
            self._ready.set_exception(RuntimeError(f"{self.config['name']}: template exited"))

    async def spawn(self, instance_id: str, socket_path: str) -> str:
        await self.prepare()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"spawn": instance_id, "socket": socket_path}) + "\n").encode())
        await self.proc.stdin.drain()
        return socket_path

    def terminate(self, instance_id: str) -> None:
        pid = self.pids.get(instance_id)
        if pid:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    async def close(self) -> None:
        for pid in list(self.pids.values()):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if self.proc is not None and self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except asyncio.TimeoutError:
                self.proc.kill()
        if self._reader is not None:
            await asyncio.wait([self._reader], timeout=5)


class CommandLauncher:
    """Runs ``argv`` per instance with ``$PORT`` set; ready once ``ready_path`` answers 200."""

    def __init__(self, argv: list[str], env: dict[str, str], on_ready: OnReady, on_exit: OnExit,
                 ready_path: str = "/v2/health/ready", log_dir: str | None = None) -> None:
        self.log_dir = log_dir
        self.argv, self.env, self.on_ready, self.on_exit, self.ready_path = argv, env, on_ready, on_exit, ready_path
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def prepare(self) -> None:
        return None

    async def spawn(self, instance_id: str, socket_path: str) -> str:
        port = free_port()
        address = f"tcp://127.0.0.1:{port}"
        env = {**os.environ, **self.env, "PORT": str(port), "CASCADE_INSTANCE": instance_id}
        log = open(os.path.join(self.log_dir, f"{instance_id}.log"), "ab") if self.log_dir else None
        proc = await asyncio.create_subprocess_exec(*self.argv, env=env, start_new_session=True, stdout=log,
                                                    stderr=asyncio.subprocess.STDOUT if log else None,
                                                    preexec_fn=die_with_parent)
        if log is not None:
            log.close()
        self.procs[instance_id] = proc
        self._tasks.add(asyncio.create_task(self._watch(instance_id, proc, address)))
        return address

    async def _watch(self, instance_id: str, proc: asyncio.subprocess.Process, socket_path: str) -> None:
        from cascade.serving.runtime.upstream import Upstream

        upstream = Upstream(socket_path)
        while proc.returncode is None:
            try:
                reply = await upstream.request("GET", self.ready_path, [("host", "instance")], b"", timeout=2)
                if reply.start.split(" ")[1] == "200":
                    self.on_ready(instance_id)
                    break
            except (ConnectionError, OSError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.02)
        upstream.close()
        code = await proc.wait()
        self.procs.pop(instance_id, None)
        self.on_exit(instance_id, code)

    def terminate(self, instance_id: str) -> None:
        proc = self.procs.get(instance_id)
        if proc is not None and proc.returncode is None:
            proc.terminate()

    async def close(self) -> None:
        for proc in list(self.procs.values()):
            if proc.returncode is None:
                proc.terminate()
        for proc in list(self.procs.values()):
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except asyncio.TimeoutError:
                proc.kill()
