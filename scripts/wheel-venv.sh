#!/usr/bin/env bash
# Builds Cascade's wheel and installs it (not editable) into a fresh venv at $1, as a user's
# `pip install cascade-ml` would. Third-party dependencies come from the project's .venv
# (a .pth line), so the check needs no second multi-gigabyte PyTorch install; Cascade itself
# comes only from the wheel. Prints the venv's python.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:?usage: scripts/wheel-venv.sh DIR}
rm -rf "$root/build"
dist=$(mktemp -d)
trap 'rm -rf "$dist" "$root/build"' EXIT
"$root/.venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$dist" "$root" >/dev/null 2>&1 \
  || "$root/.venv/bin/python" -m pip wheel -q --no-deps -w "$dist" "$root"
rm -rf "$venv"
"$root/.venv/bin/python" -m venv --without-pip "$venv"
"$root/.venv/bin/python" -m pip --python "$venv/bin/python" install -q --no-deps "$dist"/cascade_ml-*.whl
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
deps=$("$root/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$deps" > "$site/zz-cascade-deps.pth"
echo "$venv/bin/python"
