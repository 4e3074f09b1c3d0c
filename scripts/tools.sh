#!/usr/bin/env bash
# Installs the real third-party servers the source tests drive, once, into a cache outside the
# repository (CASCADE_TOOLS_DIR, default ~/.cache/cascade), and reuses them on every later run:
#   MinIO server, built from the Go module proxy at a pinned version (minutes on 2 cores, once)
#   Label Studio 1.23.2 in a venv of its own, plus a migrated database with an admin user and a
#   legacy API token, so each test's Label Studio starts from a copy in seconds
#   kube-apiserver and kubectl v1.34.4, built from the Go module proxy (10-40 minutes on 2 cores,
#   once), and Debian's etcd: the real control plane the cluster-form tests apply manifests to
# Idempotent. A tool that cannot be installed is reported and the run goes on: its tests say why
# they skip (and fail under CI, where the install is expected to work).
# `bench` builds hey, the HTTP load generator bench/gateway_bench.py uses where wrk is missing.
# Usage: scripts/tools.sh [install|status|bench]
set -uo pipefail
tools="${CASCADE_TOOLS_DIR:-$HOME/.cache/cascade}"
minio_version="v0.0.0-20260212201848-7aac2a2c5b7c"   # github.com/minio/minio, the build these tests were written against
ls_version="1.23.2"
kube_version="v1.34.4"
hey_version="v0.1.4"
ls_token="0123456789abcdef0123456789abcdef01234567"  # the template's admin token: a throwaway install on loopback

install_minio() {
  local bin="$tools/minio/bin/minio"
  [ -x "$bin" ] && return 0
  command -v go >/dev/null || { echo "tools: Go is needed to build MinIO" >&2; return 1; }
  echo "tools: building MinIO $minio_version from the Go module proxy into $tools/minio (once)"
  mkdir -p "$tools/minio"
  GOBIN="$tools/minio/bin" GOFLAGS=-mod=mod go install "github.com/minio/minio@$minio_version" \
    > "$tools/minio/build.log" 2>&1 || { echo "tools: MinIO build failed, see $tools/minio/build.log" >&2; return 1; }
}

install_label_studio() {
  local dir="$tools/label-studio" python=${PYTHON:-python3}
  if [ ! -x "$dir/venv/bin/label-studio" ]; then
    echo "tools: installing Label Studio $ls_version into $dir/venv (once)"
    mkdir -p "$dir"
    "$python" -m venv "$dir/venv" && "$dir/venv/bin/pip" install -q "label-studio==$ls_version" > "$dir/install.log" 2>&1 \
      || { echo "tools: Label Studio install failed, see $dir/install.log" >&2; return 1; }
  fi
  [ -f "$dir/template/.ready" ] && return 0
  echo "tools: migrating a Label Studio template database (once)"
  rm -rf "$dir/template" && mkdir -p "$dir/template"
  local port pid
  port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  LABEL_STUDIO_BASE_DATA_DIR="$dir/template" SENTRY_DSN="" LATEST_VERSION_CHECK=false COLLECT_ANALYTICS=false \
  LABEL_STUDIO_USERNAME=admin@example.com LABEL_STUDIO_PASSWORD=cascade-tests LABEL_STUDIO_USER_TOKEN=$ls_token \
    "$dir/venv/bin/label-studio" start --no-browser --host 127.0.0.1 --port "$port" --enable-legacy-api-token \
    > "$dir/template.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    if curl -sf -o /dev/null -H "Authorization: Token $ls_token" "http://127.0.0.1:$port/api/projects/"; then
      kill "$pid"; wait "$pid" 2>/dev/null
      touch "$dir/template/.ready"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  kill "$pid" 2>/dev/null
  echo "tools: Label Studio did not start, see $dir/template.log" >&2
  return 1
}

install_kube() {
  # The module zip of k8s.io/kubernetes has no staging/ (nested modules are left out of module
  # zips): point each staging replace at the published module of the same release instead.
  local dir="$tools/kube/$kube_version"
  if ! command -v etcd >/dev/null; then
    echo "tools: installing Debian's etcd-server"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server) >/dev/null 2>&1 \
      || { echo "tools: etcd-server install failed" >&2; return 1; }
  fi
  [ -x "$dir/bin/kube-apiserver" ] && [ -x "$dir/bin/kubectl" ] && return 0
  command -v go >/dev/null || { echo "tools: Go is needed to build kube-apiserver" >&2; return 1; }
  echo "tools: building kube-apiserver and kubectl $kube_version from the Go module proxy into $dir (once)"
  mkdir -p "$dir"
  local module src="$dir/src"
  module=$(go mod download -json "k8s.io/kubernetes@$kube_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -d "$module" ] || { echo "tools: go mod download k8s.io/kubernetes@$kube_version failed" >&2; return 1; }
  rm -rf "$src" && cp -r "$module" "$src" && chmod -R u+w "$src" && rm -rf "$src/vendor" "$src/go.work" "$src/go.work.sum"
  sed -i -E "s#^(\s*)(k8s\.io/[a-z0-9-]+) => \./staging/src/k8s\.io/[a-z0-9-]+#\1\2 => \2 ${kube_version/v1/v0}#" "$src/go.mod"
  (cd "$src" && GOFLAGS=-mod=mod GOWORK=off go build -o "$dir/bin/" ./cmd/kube-apiserver ./cmd/kubectl) \
    > "$dir/build.log" 2>&1 || { echo "tools: kube-apiserver build failed, see $dir/build.log" >&2; return 1; }
  rm -rf "$src"
}

install_hey() {  # the benches' HTTP load generator where Debian's wrk is not installed
  [ -x "$tools/hey/bin/hey" ] && return 0
  command -v go >/dev/null || { echo "tools: Go is needed to build hey" >&2; return 1; }
  echo "tools: building hey $hey_version from the Go module proxy into $tools/hey (once)"
  GOBIN="$tools/hey/bin" GOFLAGS=-mod=mod go install "github.com/rakyll/hey@$hey_version" > /dev/null 2>&1 \
    || { echo "tools: hey build failed" >&2; return 1; }
}

case "${1:-install}" in
  install) install_minio; install_label_studio; install_kube; exit 0 ;;
  bench) install_hey; exit 0 ;;
  status)
    [ -x "$tools/minio/bin/minio" ] && echo "minio: $tools/minio/bin/minio" || echo "minio: not installed"
    [ -f "$tools/label-studio/template/.ready" ] && echo "label-studio: $tools/label-studio" || echo "label-studio: not installed"
    [ -x "$tools/kube/$kube_version/bin/kube-apiserver" ] && echo "kube: $tools/kube/$kube_version" || echo "kube: not installed" ;;
  *) echo "usage: $0 [install|status|bench]" >&2; exit 2 ;;
esac
