#!/usr/bin/env bash
# The README's test command: installs what the tests need into .venv, installs the real MinIO,
# Label Studio and kube-apiserver once outside the repository (scripts/tools.sh), starts the
# real Kafka, Redis and Kubernetes control plane (scripts/services.sh), installs Debian's
# Chromium for the dashboard's browser test, checks layers and types against the built wheel (scripts/check.sh; only
# without arguments), and runs the whole test suite. Extra arguments go to pytest
# (e.g. scripts/test.sh tests/unit -x).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
scripts/tools.sh install  # MinIO, Label Studio, kube-apiserver: built once into ~/.cache/cascade
scripts/services.sh start  # Kafka, Redis and the Kubernetes control plane
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  echo "test.sh: installing Debian's chromium and chromium-driver for the dashboard's browser test"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >/dev/null
fi
if [ $# -eq 0 ]; then
  scripts/check.sh  # layers and strict typing, once, against the installed wheel
fi
exec .venv/bin/python -m pytest "$@"
