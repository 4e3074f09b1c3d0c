"""Remote edge figures: release-to-serving per agent over HTTPS, bytes per release, and the time from
reconnect to caught up after a long cut.

A real ``cascade up`` with an HTTPS gateway; agents in their own processes reach it only through
a TCP proxy (tests/helpers/tcpproxy.py). Release 1 is timed from publish to each agent's
``model.deployed``; the proxy counts the bytes it carried from the gateway during that release
(artifact, stream, reports' answers, TLS); then the proxy is cut for ``--cut`` seconds while
release 2 is published, and restored: reconnect-to-caught-up is from the restore to the last
agent's ``model.deployed`` for release 2.
Run:  .venv/bin/python -m bench.edge_bench [--agents 2] [--cut 600]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.common import table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import models  # noqa: E402  (tiny models built from code)
from tests.helpers.platform import cascade_up  # noqa: E402
from tests.helpers.tls import self_signed  # noqa: E402
from tests.integration.test_edge_remote import Edge  # noqa: E402  (the same fleet the tests drive)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--cut", type=float, default=600.0, help="seconds the link stays cut")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        cert, key = self_signed(tmp / "tls")
        with cascade_up(tmp / "home", CASCADE_GATEWAY__TLS_CERT_FILE=str(cert), CASCADE_GATEWAY__TLS_KEY_FILE=str(key),
                        CASCADE_SECURITY__ARTIFACT_ROOTS=json.dumps([str(tmp)]),
                        wait_for=("gateway", "runtime")) as running:
            edge = Edge(tmp, running, cert)
            names = [f"eu-{i}" for i in range(1, args.agents + 1)]
            try:
                for name in names:
                    edge.register(name, "region=eu")
                    edge.start(name)
                artifact = models.torchscript(tmp, bias=1.0)
                before = edge.proxy.downstream
                published = edge.release("1", artifact)
                seen = edge.outcomes({("deployed", n, "1"): 1 for n in names})
                arrived = time.monotonic()
                rows = [[e.get_data()["cluster"], f"{e.get_data()['timings']['total']:.2f}",
                         int(e.get_data()["timings"]["bytes"])] for e in seen]
                print(table(f"release 1 ({artifact.stat().st_size} byte artifact): all serving "
                            f"{arrived - published:.2f}s after publish", ["cluster", "rollout s", "artifact bytes"],
                            rows))
                print(f"bytes from the gateway through the proxy for release 1, {len(names)} agents: "
                      f"{edge.proxy.downstream - before}")
                edge.proxy.cut()
                edge.release("2", models.torchscript(tmp, bias=2.0))
                end = time.monotonic() + args.cut
                while time.monotonic() < end:  # the cut itself is what is measured; nothing to poll
                    time.sleep(min(5.0, max(0.0, end - time.monotonic())))
                edge.proxy.restore()
                back = time.monotonic()
                edge.outcomes({("deployed", n, "2"): 1 for n in names}, timeout=300)
                print(f"reconnect-to-caught-up after a {args.cut:g}s cut: {time.monotonic() - back:.2f}s "
                      f"({len(names)} agents)")
            finally:
                edge.close()


if __name__ == "__main__":
    main()
