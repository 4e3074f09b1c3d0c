"""A model-server zygote: one warm process per model format that forks model servers.

A model server started as a fresh interpreter pays Python's start-up, ``import kserve`` and
the framework's import (torch, onnxruntime, scikit-learn, xgboost) on every cold start, which
is most of a cold call. The zygote imports them once; each model server is a fork that only
loads its model and serves. Nothing here starts a thread before forking, so the fork is safe.
The commands and replies are JSON lines on stdin and stdout, as for function templates:

    {"format": "onnx"} (first line)            ->  {"zygote_ready": pid}
    {"spawn": id, "argv": [...], "env": {...}, "log": path}  ->  {"spawned": id, "pid": N}
    a model server exits                         ->  {"exited": N, "code": C}
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from cascade.serving.runtime.instance import control
from cascade.serving.runtime.template import die_with_parent, serve_forks


def _child(command: dict[str, Any]) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.setsid()  # its own session, as a command service has: the runtime signals it alone
    die_with_parent()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    log = os.open(command["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for key, value in command.get("env", {}).items():
        os.environ[key] = str(value)
    code = 0
    try:
        from cascade.serving import modelserver

        modelserver.main(list(command["argv"]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # the log says why; the runtime sees the exit
        print(f"cascade: model server failed: {type(exc).__name__}: {exc}", flush=True)
        code = 1
    os._exit(code)


def main() -> None:
    die_with_parent()
    config = json.loads(sys.stdin.readline())
    try:
        from cascade.serving import modelserver

        modelserver.preload(str(config["format"]))
    except BaseException as exc:
        control({"zygote_failed": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)
    serve_forks("zygote_ready", _child)


if __name__ == "__main__":
    main()
