"""A job that keeps a checkpoint in its output folder: a second run finds it and says so. It holds its booking
until the file named by its first argument appears (at most 120 s)."""

import json
import os
import sys
import time
from pathlib import Path

from watchfiles import watch

out = Path(os.environ["CASCADE_OUTPUT_DIR"])
checkpoint = out / "checkpoint.json"
resumed = checkpoint.exists()
checkpoint.write_text(json.dumps({"step": 1}))
print("resumed from the checkpoint" if resumed else "started fresh", flush=True)
flag = Path(sys.argv[1])
deadline = time.monotonic() + 120
# wake on changes to the flag's folder (and every second, in case it appeared before the watch began)
for _ in watch(flag.parent, debounce=50, step=10, rust_timeout=1000, yield_on_timeout=True, recursive=False):
    if flag.exists():
        break
    if time.monotonic() > deadline:
        sys.exit("nobody let this job go within 120 s")
(out / "metrics.json").write_text(json.dumps({"resumed": int(resumed)}))
