"""A consumer process for crash tests: consumes, acknowledges some, commits, then hangs.

argv: BUS_URL TOPIC GROUP EXPECTED ACK_FIRST OPTIONS_JSON. Prints ``READY`` once it holds
partitions and ``GOT n`` once it received EXPECTED records, then waits to be SIGKILLed.
"""

from __future__ import annotations

import json
import sys
import time

from cascade.events.bus import open_bus


def main() -> None:
    url, topic, group, expected, ack_first, options = sys.argv[1:7]
    bus = open_bus(url, **json.loads(options))
    consumer = bus.subscribe([topic], group, start="earliest")
    got = []
    announced = False
    while len(got) < int(expected):
        got += consumer.poll(0.2)
        if consumer.assignment() and not announced:
            print("READY", flush=True)
            announced = True
    got.sort(key=lambda r: (r.partition, r.offset))
    for record in got[: int(ack_first)]:
        consumer.ack(record)
    consumer.commit()
    print(f"GOT {len(got)}", flush=True)
    while True:
        consumer.poll(0.5)  # keep the membership alive until killed
        time.sleep(0.1)


if __name__ == "__main__":
    main()
