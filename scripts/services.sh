#!/usr/bin/env bash
# Starts (or stops) the real services Cascade's tests and its non-embedded mode use:
#   Apache Kafka 4.x, one KRaft node on 127.0.0.1:9092, fetched from Maven Central by scripts/kafka/pom.xml
#   Debian's redis-server on 127.0.0.1:6379
#   a Kubernetes control plane (`kube`, also started by `start` once scripts/tools.sh built it):
#   Debian's etcd on 127.0.0.1:12379 and kube-apiserver v1.34.4 on https://127.0.0.1:16443 with
#   RBAC, a token-authenticated admin (system:masters) and the pinned upstream CRDs in
#   scripts/kube/crds; its kubeconfig is ~/.cache/cascade/kube/run/kubeconfig (outside the
#   repository: every clone shares one control plane). No controllers run: tests write the
#   operators' status themselves. A fresh etcd each time it starts.
# Idempotent: a service that already answers is left alone; jars are cached in .cache/kafka/jars.
#   `cluster`: a three-broker KRaft cluster on 127.0.0.1:19092,19094,19096 (scripts/kafka_cluster.py;
#   replication factor 3, min.insync.replicas 2), for Kafka across machines
# Usage: scripts/services.sh [start|stop|status|cluster|cluster-stop|kube|kube-stop|kube-restart]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="${CASCADE_SERVICES_DIR:-$root/.cache}"
kdir="$cache/kafka"; jars="$kdir/jars"; data="$kdir/data"
kafka_port=9092; controller_port=9093; redis_port=6379
cluster_id="Q2FzY2FkZUxvY2FsS2Fma2E"   # any 16 bytes, base64url: one fixed local cluster
kube_bin="${CASCADE_TOOLS_DIR:-$HOME/.cache/cascade}/kube/v1.34.4/bin"
kube="${CASCADE_TOOLS_DIR:-$HOME/.cache/cascade}/kube/run"; etcd_port=12379; etcd_peer=12380; kube_port=16443

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() {  # wait_for NAME SECONDS COMMAND...
  local name=$1 secs=$2; shift 2
  for _ in $(seq 1 $((secs * 5))); do "$@" && return 0; sleep 0.2; done
  echo "services: $name did not answer within ${secs}s" >&2; return 1
}

kafka_ready() { port_open $kafka_port && grep -q "Kafka Server started" "$kdir/server.log" 2>/dev/null; }

fetch_kafka() {
  [ -n "$(ls "$jars"/kafka_2.13-*.jar 2>/dev/null)" ] && return 0
  echo "services: fetching Kafka jars from Maven Central into $jars"
  mkdir -p "$jars"
  mvn -q -B -f "$root/scripts/kafka/pom.xml" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$jars"
}

write_kafka_config() {
  mkdir -p "$kdir"
  cat > "$kdir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller_port
listeners=PLAINTEXT://127.0.0.1:$kafka_port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$kafka_port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$data
num.partitions=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
delete.topic.enable=true
PROPS
  cat > "$kdir/log4j2.properties" <<PROPS
appender.file.type=File
appender.file.name=file
appender.file.fileName=$kdir/server.log
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=[%d] %p %m (%c)%n
rootLogger.level=INFO
rootLogger.appenderRef.file.ref=file
logger.kafka.name=kafka
logger.kafka.level=INFO
logger.state.name=state.change.logger
logger.state.level=WARN
PROPS
}

start_kafka() {
  if kafka_ready || port_open $kafka_port; then echo "services: kafka already on 127.0.0.1:$kafka_port"; return 0; fi
  command -v java >/dev/null || { echo "services: Java 17 is needed for Kafka (apt-get install -y openjdk-17-jre-headless)" >&2; exit 1; }
  command -v mvn >/dev/null || { echo "services: Maven is needed to fetch Kafka (apt-get install -y maven)" >&2; exit 1; }
  fetch_kafka
  write_kafka_config
  if [ ! -f "$data/meta.properties" ]; then
    java -cp "$jars/*" -Dlog4j2.configurationFile="$kdir/log4j2.properties" kafka.tools.StorageTool format \
      -t "$cluster_id" -c "$kdir/server.properties" --ignore-formatted >/dev/null
  fi
  : > "$kdir/server.log"
  nohup java -Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true \
      -Dlog4j2.configurationFile="$kdir/log4j2.properties" \
      -cp "$jars/*" kafka.Kafka "$kdir/server.properties" > "$kdir/stdout.log" 2>&1 &
  echo $! > "$kdir/pid"
  if ! wait_for kafka 90 kafka_ready; then tail -30 "$kdir/server.log" "$kdir/stdout.log" >&2; exit 1; fi
  echo "services: kafka up on 127.0.0.1:$kafka_port (log: $kdir/server.log)"
}

start_redis() {
  if port_open $redis_port; then echo "services: redis already on 127.0.0.1:$redis_port"; return 0; fi
  if ! command -v redis-server >/dev/null; then
    echo "services: installing Debian's redis-server"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null
  fi
  mkdir -p "$cache/redis"  # append-only file: tokens, job records and claims survive a restart
  redis-server --daemonize yes --bind 127.0.0.1 --port $redis_port --save "" --appendonly yes \
      --appendfsync everysec --dir "$cache/redis" \
      --logfile "$cache/redis.log" --pidfile "$cache/redis.pid" >/dev/null
  wait_for redis 20 sh -c "[ \"\$(redis-cli -p $redis_port ping 2>/dev/null)\" = PONG ]"
  echo "services: redis up on 127.0.0.1:$redis_port"
}

kube_ready() {
  [ -f "$kube/admin.token" ] && curl -sf --cacert "$kube/serving.crt" -H "Authorization: Bearer $(cat "$kube/admin.token")" \
    "https://127.0.0.1:$kube_port/readyz" >/dev/null 2>&1
}

launch_apiserver() {  # the API server alone, on the etcd, keys and certificates already in $kube
  nohup "$kube_bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --secure-port $kube_port --advertise-address 127.0.0.1 \
    --tls-cert-file "$kube/serving.crt" --tls-private-key-file "$kube/serving.key" \
    --token-auth-file "$kube/tokens.csv" --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc --api-audiences https://kubernetes.default.svc \
    --service-account-key-file "$kube/sa.pub" --service-account-signing-key-file "$kube/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 --enable-priority-and-fairness=false \
    >> "$kube/apiserver.log" 2>&1 &
  echo $! > "$kube/apiserver.pid"
  if ! wait_for kube-apiserver 120 kube_ready; then tail -30 "$kube/apiserver.log" >&2; exit 1; fi
}

restart_apiserver() {  # for the fault tests: the API server goes away and comes back; etcd keeps the objects
  if [ -f "$kube/apiserver.pid" ]; then kill "$(cat "$kube/apiserver.pid")" 2>/dev/null || true; fi
  for _ in $(seq 1 100); do port_open $kube_port || break; sleep 0.2; done
  launch_apiserver
  echo "services: kube-apiserver restarted"
}

start_kube() {
  if kube_ready; then echo "services: kube-apiserver already on https://127.0.0.1:$kube_port"; return 0; fi
  if [ ! -x "$kube_bin/kube-apiserver" ] || ! command -v etcd >/dev/null; then
    echo "services: no kube-apiserver or etcd yet (scripts/tools.sh install builds them); skipping kube" >&2
    return 0
  fi
  stop_kube quiet
  for port in $kube_port $etcd_port; do
    if port_open "$port"; then
      echo "services: 127.0.0.1:$port is taken by a process this script did not start; stop it first" >&2; exit 1
    fi
  done
  rm -rf "$kube" && mkdir -p "$kube" && chmod 700 "$kube"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=kube-apiserver" \
    -addext "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc" \
    -keyout "$kube/serving.key" -out "$kube/serving.crt" >/dev/null 2>&1
  openssl genrsa -out "$kube/sa.key" 2048 >/dev/null 2>&1
  openssl rsa -in "$kube/sa.key" -pubout -out "$kube/sa.pub" >/dev/null 2>&1
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$kube/admin.token"
  (umask 077; echo "$(cat "$kube/admin.token"),cascade-admin,cascade-admin,system:masters" > "$kube/tokens.csv")
  nohup etcd --data-dir "$kube/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "default=http://127.0.0.1:$etcd_peer" > "$kube/etcd.log" 2>&1 &
  echo $! > "$kube/etcd.pid"
  wait_for etcd 30 port_open $etcd_port || { tail -20 "$kube/etcd.log" >&2; exit 1; }
  launch_apiserver
  cat > "$kube/kubeconfig" <<CONF
apiVersion: v1
kind: Config
clusters:
- name: cascade-test
  cluster: {server: "https://127.0.0.1:$kube_port", certificate-authority: "$kube/serving.crt"}
users:
- name: cascade-admin
  user: {token: "$(cat "$kube/admin.token")"}
contexts:
- name: cascade-test
  context: {cluster: cascade-test, user: cascade-admin}
current-context: cascade-test
CONF
  chmod 600 "$kube/kubeconfig"
  KUBECONFIG="$kube/kubeconfig" "$kube_bin/kubectl" apply --server-side -f "$root/scripts/kube/crds" >/dev/null \
    || { echo "services: installing the CRDs failed" >&2; exit 1; }
  crds_established || exit 1
  echo "services: kube-apiserver up on https://127.0.0.1:$kube_port (kubeconfig: $kube/kubeconfig)"
}

crds_established() {  # kubectl wait fails at once, rather than waiting, on a CRD whose status has no conditions yet
  local deadline=$((SECONDS + 60))  # (just created, on a loaded machine): ask again until each says Established
  until KUBECONFIG="$kube/kubeconfig" "$kube_bin/kubectl" wait --for condition=established --timeout=5s crd --all \
      >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { echo "services: the CRDs were not Established within 60s" >&2; return 1; }
    sleep 0.5
  done
}

stop_kube() {
  for name in apiserver etcd; do
    if [ -f "$kube/$name.pid" ]; then kill "$(cat "$kube/$name.pid")" 2>/dev/null || true; rm -f "$kube/$name.pid"; fi
  done
  for _ in $(seq 1 100); do port_open $kube_port || port_open $etcd_port || break; sleep 0.2; done
  [ "${1:-}" = quiet ] || echo "services: kube stopped"
}

stop_all() {
  stop_kube quiet
  if [ -f "$kdir/pid" ]; then kill "$(cat "$kdir/pid")" 2>/dev/null || true; rm -f "$kdir/pid"; fi
  if port_open $redis_port; then redis-cli -p $redis_port shutdown nosave >/dev/null 2>&1 || true; fi
  for _ in $(seq 1 100); do port_open $kafka_port || break; sleep 0.2; done
  echo "services: stopped"
}

mkdir -p "$cache"
case "${1:-start}" in
  start) start_redis; fetch_kafka; start_kafka; start_kube ;;  # the jars also serve the fault tests' own brokers
  stop) stop_all ;;
  kube) start_kube ;;
  kube-stop) stop_kube ;;
  kube-restart) restart_apiserver ;;
  cluster) start_redis; fetch_kafka
           python3 "$root/scripts/kafka_cluster.py" start "$cache/kafka-cluster" --nodes 3 --port 19092 ;;
  cluster-stop) python3 "$root/scripts/kafka_cluster.py" stop "$cache/kafka-cluster" --nodes 3 --port 19092 ;;
  status) port_open $kafka_port && echo "kafka: up" || echo "kafka: down"
          port_open $redis_port && echo "redis: up" || echo "redis: down"
          kube_ready && echo "kube: up" || echo "kube: down" ;;
  *) echo "usage: $0 [start|stop|status|cluster|cluster-stop|kube|kube-stop|kube-restart]" >&2; exit 2 ;;
esac
