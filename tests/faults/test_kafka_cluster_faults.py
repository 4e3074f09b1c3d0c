"""Kafka across machines: a three-broker KRaft cluster, one broker killed mid-stream.

Topics get replication factor 3 and ``min.insync.replicas`` 2 on a cluster of three, so with
one broker gone every write still needs two copies and nothing accepted is lost; delivery
goes on without restarting anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource

from tests.helpers.faults import RedisServer, Workload, own_services
from tests.helpers.waiting import eventually

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, RedisServer]]:
    with own_services(tmp_path_factory.mktemp("cluster"), brokers=3) as started:
        yield started


def test_one_of_three_brokers_killed_mid_stream(tmp_path: Path, cluster: tuple[Any, RedisServer]) -> None:
    kafka, redis = cluster
    w = Workload(tmp_path, f"kafka://{kafka.bootstrap}", redis.url, handler_delay=0.05)
    with w.platform():
        admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
        try:
            [described] = admin.describe_topics([w.topic])
            replicas = {len(p["replica_nodes"]) for p in described["partitions"]}
            configs = admin.describe_configs([ConfigResource("TOPIC", w.topic, ["min.insync.replicas"])])
        finally:
            admin.close()
        assert replicas == {3}, described
        assert configs["topic"][w.topic]["min.insync.replicas"]["value"] == "2", configs
        w.start_sending()
        w.wait_accepted(100)
        accepted = len(w.report.accepted)
        kafka.nodes[1].kill()
        eventually(lambda: len(w.report.accepted) >= accepted + 150, 120, "accepting with a broker gone")
        w.stop_sending()
        report = w.settle()
        print(f"\nthree brokers, one killed:\n{report}")
        lost_sink, lost_hook = w.lost()
        assert not lost_sink and not lost_hook, report
        assert len(w.effects()) == len(set(w.effects())), report
        assert w.dead_letters() == 0, report
    kafka.nodes[1].start()
