"""A job that keeps a checkpoint in its output folder: a second run finds it and says so. It holds its booking
until the file named by its first argument appears (at most 120 s)."""

import json
import os
import sys
import time
from pathlib import Path

out = Path(os.environ["CASCADE_OUTPUT_DIR"])
checkpoint = out / "checkpoint.json"
resumed = checkpoint.exists()
checkpoint.write_text(json.dumps({"step": 1}))
print("resumed from the checkpoint" if resumed else "started fresh", flush=True)
flag = Path(sys.argv[1])
deadline = time.monotonic() + 120
while not flag.exists():
    if time.monotonic() > deadline:
        sys.exit("nobody let this job go within 120 s")
    time.sleep(0.1)
(out / "metrics.json").write_text(json.dumps({"resumed": int(resumed)}))
