"""A job that holds its booking until the test lets it go: it waits (at most 120 s) for the file named by its
first argument, then reports one metric."""

import json
import os
import sys
import time
from pathlib import Path

flag = Path(sys.argv[1])
deadline = time.monotonic() + 120
while not flag.exists():
    if time.monotonic() > deadline:
        sys.exit("nobody let this job go within 120 s")
    time.sleep(0.1)
(Path(os.environ["CASCADE_OUTPUT_DIR"]) / "metrics.json").write_text(json.dumps({"held": 1}))
