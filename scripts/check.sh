#!/usr/bin/env bash
# The repository's static rules, once per CI run, against the installed wheel (so that
# cascade.events, cascade.serving, ... resolve exactly as a user's install has them):
#   import-linter: layers point one way, implementations stay independent, third-party
#                  clients (kafka, redis, kubernetes) only in the modules that wrap them
#   mypy --strict: every module of the cascade package
#   ruff: unused imports, undefined names, import order (over the whole repository)
# Run from a scratch directory, so the repository's own folders never shadow the install.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.cache/wheel-venv"
python=$("$root/scripts/wheel-venv.sh" "$venv")
echo "check: ruff"
"$root/.venv/bin/ruff" check "$root"
cd "$(mktemp -d)"
echo "check: import-linter"
"$python" -c 'import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())' \
  "$root/.importlinter" --no-cache | sed -n '/^Contracts/,$p'
echo "check: mypy --strict"
"$root/.venv/bin/mypy" --python-executable "$python" --config-file "$root/pyproject.toml" \
  --cache-dir "$root/.cache/mypy" -p cascade
