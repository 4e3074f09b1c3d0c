"""A function's template process: imports everything once, then forks ready instances.

Scaling from zero must not pay interpreter start-up and imports on the request path, so
each function gets a template that has already imported the runtime and the function's
module (``start()`` is *not* run here: threads and connections do not survive a fork).
Its config (module, env and resolved secrets) is the first JSON line on stdin, so no secret
is ever on a command line; commands follow as JSON lines on stdin; replies and child events go out as JSON lines on
stdout, written with ``os.write`` so a fork never inherits a held lock. No threads run
here, so forking is safe.

    {"spawn": "<id>", "socket": "<path>"}  ->  {"spawned": "<id>", "pid": N}
    child, once listening                  ->  {"ready": "<id>", "pid": N}
    child exits                            ->  {"exited": N, "code": C}
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib
import json
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from cascade.serving.runtime.instance import Instance, control


def die_with_parent() -> None:
    """Linux: get SIGTERM when the parent dies, so no instance outlives a crashed runtime."""
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before we asked
        os.kill(os.getpid(), signal.SIGTERM)


def _reap(signum: int, frame: FrameType | None) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        control({"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _child(module: Any, config: dict[str, Any], instance_id: str, socket_path: str) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the runtime, which drains us
    die_with_parent()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    code = 0
    try:
        asyncio.run(Instance(module, config["name"], config).serve(socket_path, instance_id))
    except BaseException as exc:  # report why, then exit
        control({"failed": instance_id, "error": f"{type(exc).__name__}: {exc}"})
        code = 1
    os._exit(code)


def main() -> None:
    die_with_parent()
    config = json.loads(sys.stdin.readline())
    # The function's folder comes first for its own modules; the platform's packages are
    # already imported (cascade.*), so a handler's schemas.py, events/ or cascade.py never
    # replaces them, and the interpreter runs with -P, so the working directory adds nothing.
    sys.path.insert(0, config["path"])
    for key, value in config.get("env", {}).items():
        os.environ[key] = str(value)
    try:
        module = importlib.import_module(config["module"])
        if not callable(getattr(module, "handle", None)):
            raise AttributeError(f"{config['module']}.py defines no handle(event)")
    except BaseException as exc:
        control({"template_failed": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)
    serve_forks("template_ready", lambda command: _child(module, config, command["spawn"], command["socket"]))


def serve_forks(ready: str, child: Callable[[dict[str, Any]], None]) -> None:
    """Say ``ready``, then fork ``child(command)`` for each spawn command on stdin and report exits (no
    threads run in this process, so forking is safe); templates and model-server zygotes share it."""
    signal.signal(signal.SIGCHLD, _reap)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    control({ready: os.getpid()})
    for line in sys.stdin:
        command = json.loads(line)
        if "spawn" not in command:
            continue
        pid = os.fork()
        if pid == 0:
            child(command)
        control({"spawned": command["spawn"], "pid": pid})


if __name__ == "__main__":
    main()
