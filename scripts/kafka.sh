#!/usr/bin/env bash
# A single-node Apache Kafka (KRaft, combined broker+controller) on 127.0.0.1, from jars that
# Maven fetches (scripts/kafka/pom.xml). No Docker needed.
#
#   scripts/kafka.sh start     fetch jars if needed, format storage, start, wait until it serves
#   scripts/kafka.sh stop      stop it cleanly (SIGTERM, then SIGKILL after 30 s)
#   scripts/kafka.sh status    exit 0 if it serves requests
#   scripts/kafka.sh fetch     only fetch the jars
#
# Environment: GPUCOST_KAFKA_PORT (19092; the controller uses PORT+1), GPUCOST_KAFKA_DATA
# (/tmp/gpucost-kafka-PORT), GPUCOST_KAFKA_HOME (jar cache, ~/.cache/gpucost/kafka-VERSION).
# Optional secured listeners, beside the plaintext one:
#   GPUCOST_KAFKA_SSL_KEYSTORE (+ _SSL_KEYSTORE_PASSWORD): a PKCS12 keystore → SSL://127.0.0.1:PORT+2
#   GPUCOST_KAFKA_SCRAM_USER (+ _SCRAM_PASSWORD): a SCRAM-SHA-256 user → SASL_PLAINTEXT://127.0.0.1:PORT+3
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$HERE/kafka/pom.xml")
PORT=${GPUCOST_KAFKA_PORT:-19092}
CONTROLLER_PORT=$((PORT + 1))
HOME_DIR=${GPUCOST_KAFKA_HOME:-${HOME:-/root}/.cache/gpucost/kafka-$VERSION}
LIBS=$HOME_DIR/libs
DATA=${GPUCOST_KAFKA_DATA:-/tmp/gpucost-kafka-$PORT}
PIDFILE=$DATA/kafka.pid
PY=$(command -v python3)

fetch() {
  [ -f "$LIBS/.complete" ] && return 0
  echo "kafka.sh: fetching Kafka $VERSION jars with Maven into $LIBS" >&2
  rm -rf "$LIBS" && mkdir -p "$LIBS"
  mvn -q -B -Dstyle.color=never -f "$HERE/kafka/pom.xml" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$LIBS"
  touch "$LIBS/.complete"
}

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

ready() { "$PY" "$HERE/kafka_ready.py" 127.0.0.1 "$PORT" "${1:-2}"; }

configure() {
  mkdir -p "$DATA/logs"
  local listeners="PLAINTEXT://127.0.0.1:$PORT" map="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT" extra=""
  if [ -n "${GPUCOST_KAFKA_SSL_KEYSTORE:-}" ]; then
    listeners="$listeners,SSL://127.0.0.1:$((PORT + 2))"; map="$map,SSL:SSL"
    extra="ssl.keystore.type=PKCS12
ssl.keystore.location=$GPUCOST_KAFKA_SSL_KEYSTORE
ssl.keystore.password=${GPUCOST_KAFKA_SSL_KEYSTORE_PASSWORD:-}
ssl.key.password=${GPUCOST_KAFKA_SSL_KEYSTORE_PASSWORD:-}"
  fi
  if [ -n "${GPUCOST_KAFKA_SCRAM_USER:-}" ]; then
    listeners="$listeners,SASL_PLAINTEXT://127.0.0.1:$((PORT + 3))"; map="$map,SASL_PLAINTEXT:SASL_PLAINTEXT"
    extra="$extra
sasl.enabled.mechanisms=SCRAM-SHA-256
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
  fi
  cat > "$DATA/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=$listeners,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=${listeners}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$map
$extra
log.dirs=$DATA/logs
num.partitions=4
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.cleaner.dedupe.buffer.size=8388608
PROPS
  cat > "$DATA/log4j2.properties" <<'LOG'
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
LOG
}

start() {
  if running && ready 2; then echo "kafka.sh: already serving on 127.0.0.1:$PORT" >&2; return 0; fi
  if ready 2; then
    echo "kafka.sh: 127.0.0.1:$PORT already serves a broker that was not started with data in $DATA;" \
         "stop it, or choose another GPUCOST_KAFKA_PORT" >&2
    return 1
  fi
  fetch
  configure
  if [ ! -f "$DATA/logs/meta.properties" ]; then
    local id
    id=$(java -cp "$LIBS/*" kafka.tools.StorageTool random-uuid)
    local scram=()
    if [ -n "${GPUCOST_KAFKA_SCRAM_USER:-}" ]; then
      scram=(--add-scram "SCRAM-SHA-256=[name=$GPUCOST_KAFKA_SCRAM_USER,password=${GPUCOST_KAFKA_SCRAM_PASSWORD:-}]")
    fi
    java -cp "$LIBS/*" kafka.tools.StorageTool format -t "$id" -c "$DATA/server.properties" --ignore-formatted \
      "${scram[@]}" >/dev/null
  fi
  # a session of its own, so it outlives the shell that started it
  setsid nohup java -Xms512m -Xmx512m -XX:+UseG1GC -Dkafka.logs.dir="$DATA" \
    -Dlog4j2.configurationFile="$DATA/log4j2.properties" \
    -cp "$LIBS/*" kafka.Kafka "$DATA/server.properties" > "$DATA/stdout.log" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  if ! ready 120; then
    echo "kafka.sh: broker did not come up; last lines of $DATA/stdout.log and server.log:" >&2
    tail -n 20 "$DATA/stdout.log" "$DATA/server.log" >&2 || true
    stop
    return 1
  fi
  echo "kafka.sh: serving on 127.0.0.1:$PORT (pid $(cat "$PIDFILE"), data $DATA)" >&2
}

stop() {
  running || { rm -f "$PIDFILE"; return 0; }
  local pid; pid=$(cat "$PIDFILE")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$PIDFILE"
  echo "kafka.sh: stopped" >&2
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) running && ready 2 ;;
  fetch) fetch ;;
  *) echo "usage: $0 start|stop|status|fetch" >&2; exit 2 ;;
esac
