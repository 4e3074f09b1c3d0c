"""Starting instances: by fork from a per-service template process, or as a command.

The template launcher keeps one warm template per service (``template``) and asks it for
instances; the command launcher starts any program that serves HTTP on 127.0.0.1:$PORT; the
zygote launcher forks model servers from a warm per-format zygote (``zygote``) shared by the
runtime's model services. Both report readiness and exits through
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


def kill(pid: int | None, sig: signal.Signals = signal.SIGTERM) -> None:
    """Signal ``pid`` if it is still there."""
    if pid:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


async def until_ready(address: str, path: str, alive: Callable[[], bool]) -> bool:
    """Poll ``path`` on the instance at ``address`` until it answers 200 (True) or ``alive()`` turns False."""
    from cascade.serving.runtime.upstream import Upstream

    upstream = Upstream(address)
    try:
        while alive():
            try:
                reply = await upstream.request("GET", path, [("host", "instance")], b"", timeout=2)
                if reply.start.split(" ")[1] == "200":
                    return True
            except (ConnectionError, OSError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.01)
        return False
    finally:
        upstream.close()


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
        kill(self.pids.get(instance_id))

    async def close(self) -> None:
        for pid in list(self.pids.values()):
            kill(pid)
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
        if await until_ready(socket_path, self.ready_path, lambda: proc.returncode is None):
            self.on_ready(instance_id)
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


class Zygotes:
    """One model-server zygote per format (``cascade.serving.runtime.zygote``), shared by every model service of
    the runtime and started on first use; it forks the model servers and reports their exits."""

    def __init__(self) -> None:
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self._starting: dict[str, asyncio.Future[asyncio.subprocess.Process]] = {}
        self._spawned: dict[str, asyncio.Future[int]] = {}  # instance id -> pid, once forked
        self._owners: dict[int, tuple[str, OnExit, str]] = {}  # pid -> (format, on_exit, instance id)
        self._readers: set[asyncio.Task[None]] = set()

    async def get(self, fmt: str) -> asyncio.subprocess.Process:
        proc = self.procs.get(fmt)
        if proc is not None and proc.returncode is None:
            return proc
        starting = self._starting.get(fmt)
        if starting is None:
            starting = self._starting[fmt] = asyncio.get_running_loop().create_future()
            try:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-P", "-m", "cascade.serving.runtime.zygote", stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                    start_new_session=True)
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(json.dumps({"format": fmt}).encode() + b"\n")
                await proc.stdin.drain()
                first = json.loads(await proc.stdout.readline() or b"{}")
                if "zygote_ready" not in first:
                    raise RuntimeError(f"the {fmt} model-server zygote did not start: {first.get('zygote_failed')}")
                self.procs[fmt] = proc
                task = asyncio.create_task(self._read(fmt, proc))
                self._readers.add(task)
                task.add_done_callback(self._readers.discard)
                starting.set_result(proc)
            except BaseException as exc:
                starting.set_exception(exc)
                raise
            finally:
                self._starting.pop(fmt, None)
            return proc
        return await asyncio.shield(starting)

    async def _read(self, fmt: str, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "spawned" in msg and msg["spawned"] in self._spawned:
                self._spawned.pop(msg["spawned"]).set_result(int(msg["pid"]))
            elif "exited" in msg and msg["exited"] in self._owners:
                _, on_exit, ident = self._owners.pop(msg["exited"])
                on_exit(ident, int(msg["code"]))
        for pid, (owner_fmt, on_exit, ident) in list(self._owners.items()):  # its children died with it
            if owner_fmt == fmt:
                del self._owners[pid]
                on_exit(ident, -1)

    async def spawn(self, fmt: str, instance_id: str, command: dict[str, Any], on_exit: OnExit) -> int:
        """Fork a model server; its pid."""
        proc = await self.get(fmt)
        assert proc.stdin is not None
        pid: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._spawned[instance_id] = pid
        proc.stdin.write((json.dumps({"spawn": instance_id, **command}) + "\n").encode())
        await proc.stdin.drain()
        forked = await pid
        self._owners[forked] = (fmt, on_exit, instance_id)
        return forked

    async def close(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None and proc.stdin is not None:
                proc.stdin.close()
                proc.terminate()
        for proc in self.procs.values():
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except asyncio.TimeoutError:
                proc.kill()


class ZygoteLauncher:
    """Model servers forked from the format's zygote with ``$PORT`` set; ready once ``ready_path`` answers 200."""

    def __init__(self, zygotes: Zygotes, fmt: str, argv: list[str], env: dict[str, str], on_ready: OnReady,
                 on_exit: OnExit, ready_path: str, log_dir: str) -> None:
        self.zygotes, self.fmt, self.argv, self.env = zygotes, fmt, argv, env
        self.on_ready, self.on_exit, self.ready_path, self.log_dir = on_ready, on_exit, ready_path, log_dir
        self.pids: dict[str, int] = {}
        self._gone: dict[str, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def prepare(self) -> None:
        await self.zygotes.get(self.fmt)

    def _exited(self, instance_id: str, code: int) -> None:
        self.pids.pop(instance_id, None)
        gone = self._gone.pop(instance_id, None)
        if gone is not None:
            gone.set()
        self.on_exit(instance_id, code)

    async def spawn(self, instance_id: str, socket_path: str) -> str:
        port = free_port()
        self._gone[instance_id] = asyncio.Event()
        command = {"argv": self.argv, "log": os.path.join(self.log_dir, f"{instance_id}.log"),
                   "env": {**self.env, "PORT": str(port), "CASCADE_INSTANCE": instance_id}}
        self.pids[instance_id] = await self.zygotes.spawn(self.fmt, instance_id, command, self._exited)
        address = f"tcp://127.0.0.1:{port}"
        task = asyncio.create_task(self._watch(instance_id, address))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return address

    async def _watch(self, instance_id: str, address: str) -> None:
        gone = self._gone.get(instance_id)
        if gone is not None and await until_ready(address, self.ready_path, lambda: not gone.is_set()):
            self.on_ready(instance_id)

    def terminate(self, instance_id: str) -> None:
        kill(self.pids.get(instance_id))

    async def close(self) -> None:
        waiting = [(ident, self._gone.get(ident)) for ident in list(self.pids)]
        for ident, _ in waiting:
            self.terminate(ident)
        for ident, gone in waiting:
            if gone is None:
                continue
            try:
                await asyncio.wait_for(gone.wait(), 10)
            except asyncio.TimeoutError:
                kill(self.pids.get(ident), signal.SIGKILL)
