"""Instance sockets bind under any CASCADE_HOME, however deep (sun_path holds 107 bytes)."""

from __future__ import annotations

import socket
from pathlib import Path

from cascade.serving.runtime.service import SUN_PATH_MAX, socket_path


def test_a_deep_run_dir_gets_a_short_socket_that_binds(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "run" / "launch-training"
    deep.mkdir(parents=True)
    path = socket_path(deep, "launch-training-12")
    assert len(path.encode()) <= SUN_PATH_MAX and path != str(deep / "launch-training-12.sock")
    assert socket_path(deep, "launch-training-12") == path  # stable: the same service finds it again
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)
    Path(path).unlink()


def test_a_short_run_dir_keeps_its_sockets(tmp_path: Path) -> None:
    assert socket_path(tmp_path, "hello-1") == str(tmp_path / "hello-1.sock")
