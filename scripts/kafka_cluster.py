#!/usr/bin/env python3
"""Apache Kafka KRaft nodes on this machine: one node, or a cluster of three on other ports.

Standard library only, so ``scripts/services.sh`` and the fault-injection tests share it. Each
node is a broker and a controller with its own ports and log directory; the jars come from
``scripts/services.sh`` (Maven Central, cached in ``.cache/kafka/jars``).

    python3 scripts/kafka_cluster.py start DIR [--nodes 3] [--port 19092]
    python3 scripts/kafka_cluster.py stop DIR
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JARS = Path(os.environ.get("CASCADE_SERVICES_DIR", ROOT / ".cache")) / "kafka" / "jars"
CLUSTER_ID = "Q2FzY2FkZUZhdWx0S2Fma2E"


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Node:
    """One KRaft node (broker + controller) of a cluster of ``size``; ports from ``base``."""

    def __init__(self, root: Path, index: int, size: int, base: int) -> None:
        self.root, self.index, self.size, self.base = root, index, size, base
        self.dir = root / f"node-{index}"
        self.port = base + 2 * index
        self.controller = base + 2 * index + 1
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.dir / "server.log"

    def configure(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        voters = ",".join(f"{i + 1}@127.0.0.1:{self.base + 2 * i + 1}" for i in range(self.size))
        rf, isr = (3, 2) if self.size >= 3 else (1, 1)
        (self.dir / "server.properties").write_text(f"""process.roles=broker,controller
node.id={self.index + 1}
controller.quorum.voters={voters}
listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={self.dir / 'data'}
num.partitions=1
auto.create.topics.enable=true
default.replication.factor={rf}
min.insync.replicas={isr}
offsets.topic.replication.factor={rf}
offsets.topic.num.partitions=4
transaction.state.log.replication.factor={rf}
transaction.state.log.min.isr={isr}
share.coordinator.state.topic.replication.factor={rf}
share.coordinator.state.topic.min.isr={isr}
group.initial.rebalance.delay.ms=0
delete.topic.enable=true
""")
        (self.dir / "log4j2.properties").write_text(f"""appender.file.type=File
appender.file.name=file
appender.file.fileName={self.log}
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=[%d] %p %m (%c)%n
rootLogger.level=INFO
rootLogger.appenderRef.file.ref=file
logger.state.name=state.change.logger
logger.state.level=WARN
""")
        if not (self.dir / "data" / "meta.properties").exists():
            subprocess.run(["java", "-cp", f"{JARS}/*", f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
                            "kafka.tools.StorageTool", "format", "-t", CLUSTER_ID, "-c",
                            str(self.dir / "server.properties"), "--ignore-formatted"],
                           check=True, stdout=subprocess.DEVNULL)

    def start(self) -> None:
        """Start the JVM (the log directory survives kills and restarts)."""
        if self.log.exists():
            self.log.write_text("")
        with (self.dir / "stdout.log").open("ab") as out:
            self.proc = subprocess.Popen(
                ["java", "-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                 "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
                 "-cp", f"{JARS}/*", "kafka.Kafka", str(self.dir / "server.properties")],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        (self.dir / "pid").write_text(str(self.proc.pid))

    def ready(self) -> bool:
        return port_open(self.port) and self.log.exists() and "Kafka Server started" in self.log.read_text(
            errors="replace")

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        pid = self.proc.pid if self.proc else int((self.dir / "pid").read_text())
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc is not None:
            self.proc.wait(30)
        deadline = time.monotonic() + 30
        while port_open(self.port) and time.monotonic() < deadline:
            time.sleep(0.05)


class Cluster:
    def __init__(self, root: Path, size: int = 1, base: int = 19092) -> None:
        self.nodes = [Node(root, i, size, base) for i in range(size)]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout: float = 180.0) -> None:
        if not any(JARS.glob("kafka_2.13-*.jar")):
            raise SystemExit(f"no Kafka jars in {JARS}: run scripts/services.sh start once")
        for node in self.nodes:
            node.configure()
        for node in self.nodes:
            node.start()
        self.wait(timeout)

    def wait(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(n.ready() for n in self.nodes):
            dead = [n for n in self.nodes if n.proc is not None and n.proc.poll() is not None]
            if dead or time.monotonic() > deadline:
                tail = "".join(n.log.read_text(errors="replace")[-2000:] for n in self.nodes if n.log.exists())
                raise RuntimeError(f"kafka cluster not ready within {timeout:g}s: {tail}")
            time.sleep(0.2)

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["start", "stop"])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--port", type=int, default=19092, help="first node's port; node i uses port + 2i (+1: controller)")
    args = parser.parse_args()
    cluster = Cluster(args.dir, args.nodes, args.port)
    if args.command == "start":
        cluster.start()
        print(f"kafka cluster of {args.nodes} up: {cluster.bootstrap}")
    else:
        for node in cluster.nodes:
            if (node.dir / "pid").exists():
                node.kill()
        print("kafka cluster stopped")


if __name__ == "__main__":
    sys.exit(main())
