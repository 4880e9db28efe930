#!/usr/bin/env bash
# Installs, starts, checks and stops the real services remote-wal's tests run against, all on loopback:
#   - Apache Kafka (KRaft, combined broker+controller, auto topic creation off) from Maven Central jars;
#   - etcd from Debian's etcd-server package.
# State (ports, pids, data, logs) lives under target/services/<name>/, so a stopped service restarts on the
# same port with its data (tests that stop and restart a service rely on that).
#
# usage: scripts/services.sh install                 apt packages (etcd, protoc) + Kafka jars into target/kafka-libs
#        scripts/services.sh start  kafka|etcd [NAME]  start (or restart) one service; prints nothing on success
#        scripts/services.sh stop   kafka|etcd [NAME]  stop it (data kept)
#        scripts/services.sh endpoint kafka|etcd [NAME] print host:port
#        scripts/services.sh pid    kafka|etcd [NAME]  print its process id (for a test that kills it abruptly)
#        scripts/services.sh logs   kafka|etcd [NAME]  print the tail of its log
#        scripts/services.sh start-cluster NAME N      start an N-node Kafka KRaft cluster NAME-1..NAME-N; prints
#                                                    the bootstrap endpoints (comma-separated)
#        scripts/services.sh start-etcd-cluster NAME N  start an N-member etcd cluster NAME-1..NAME-N (fresh data);
#                                                    prints the client endpoints (comma-separated)
#        scripts/services.sh remove-etcd-cluster NAME N stop NAME-1..NAME-N and delete their state and data
#        scripts/services.sh start etcd-secure [NAME]  an etcd serving TLS only, asking every client for a certificate
#                                                    (--client-cert-auth, --trusted-ca-file) and with auth enabled:
#                                                    users root, walctl (reads and writes every key) and reader
#                                                    (reads only). Certificates from scripts/certs.sh under
#                                                    NAME/certs/, the passwords in NAME/<user>.password.
#        scripts/services.sh start kafka-secure        one KRaft broker whose client listener is SASL_SSL only
#                                                    (SCRAM-SHA-256 and SCRAM-SHA-512; PLAIN is not offered);
#                                                    state, certificates and credentials in target/services/kafka-secure
#        scripts/services.sh start postgres [NAME]     a PostgreSQL cluster of its own (initdb in the state dir, run as an
#                                                    unprivileged user), user postgres with the password in
#                                                    NAME/password, database remote_wal; TLS on (certificates under
#                                                    NAME/certs/), and user walctl_tls (the same password) admitted
#                                                    over TLS with a client certificate only
#        scripts/services.sh remove NAME               stop NAME (any service) and delete its state
#        scripts/services.sh stop-all                stop everything this checkout started
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE="$ROOT/target/services"
KAFKA_LIBS="$ROOT/target/kafka-libs"
READY_TIMEOUT=${SERVICES_READY_TIMEOUT:-240}

log() { echo "[services] $*" >&2; }
die() { echo "[services] error: $*" >&2; exit 1; }

# A free loopback port that no service's state dir has saved (a stopped service keeps its port for its restart,
# and the kernel may hand a port it just gave out again: two members of one cluster once got the same peer port).
free_port() {
  python3 - "$STATE" <<'PY'
import glob, socket, sys
saved = set()
for f in glob.glob(sys.argv[1] + "/*/*port"):
    try:
        saved.add(int(open(f).read().strip()))
    except (OSError, ValueError):
        pass
held = []
for _ in range(100):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    if port not in saved:
        print(port)
        break
    held.append(s)  # kept bound, so the kernel offers another one next
else:
    sys.exit("no free port that no service has saved after 100 tries")
PY
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A port saved in the service's state dir, or a fresh free one (saved).
port_for() { # dir file
  local f="$1/$2"
  if [[ -s $f ]]; then cat "$f"; else free_port | tee "$f"; fi
}

install() {
  local need=()
  command -v etcd >/dev/null || need+=(etcd-server)
  command -v etcdctl >/dev/null || need+=(etcd-client)
  command -v protoc >/dev/null || need+=(protobuf-compiler)
  command -v java >/dev/null || need+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null || need+=(maven)
  # scripts/certs.sh makes the TLS tests' certificates with it.
  command -v openssl >/dev/null || need+=(openssl)
  # The PostgreSQL metadata store's tests run a cluster of their own (postgres_start); the package's own cluster is
  # not used.
  [[ -n $(pg_bin) ]] || need+=(postgresql)
  if ((${#need[@]})); then
    log "installing Debian packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  if ! ls "$KAFKA_LIBS"/kafka_2.13-*.jar >/dev/null 2>&1; then
    log "fetching Apache Kafka jars from Maven Central into $KAFKA_LIBS"
    mvn -q -B -f "$ROOT/scripts/kafka/pom.xml" dependency:copy-dependencies \
      -DoutputDirectory="$KAFKA_LIBS" -DincludeScope=runtime >&2
  fi
}

pid_alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_ready() { # name check-fn logfile pidfile
  local name=$1 check=$2 logf=$3 pidf=$4 deadline=$((SECONDS + READY_TIMEOUT))
  until $check; do
    if ! pid_alive "$pidf"; then
      # Exited (a bad flag, a port taken): waiting out the timeout would only hide it.
      log "$name exited before it was ready; last lines of $logf:"
      tail -n 40 "$logf" >&2 || true
      return 1
    fi
    if ((SECONDS > deadline)); then
      log "$name not ready after ${READY_TIMEOUT}s; last lines of $logf:"
      tail -n 40 "$logf" >&2 || true
      return 1
    fi
    sleep 0.5
  done
}

# ---- Kafka ---------------------------------------------------------------------------------------------------
# One KRaft node (broker + controller). Several named nodes may form a cluster: KAFKA_CLUSTER="a b c" names the
# members (all must be started); by default a node is its own single-node cluster.
kafka_start() {
  local name=${1:-kafka} dir="$STATE/$1"
  name=${name:-kafka}; dir="$STATE/$name"
  mkdir -p "$dir"
  pid_alive "$dir/pid" && return 0
  ls "$KAFKA_LIBS"/kafka_2.13-*.jar >/dev/null 2>&1 || die "Kafka jars missing under $KAFKA_LIBS: run scripts/services.sh install"
  local port cport node_id members voters=""
  port=$(port_for "$dir" port); cport=$(port_for "$dir" controller_port)
  members=${KAFKA_CLUSTER:-$name}
  node_id=$(cat "$dir/node_id" 2>/dev/null || true)
  if [[ -z $node_id ]]; then
    local i=1
    for m in $members; do [[ $m == "$name" ]] && node_id=$i; i=$((i + 1)); done
    [[ -n $node_id ]] || die "kafka node $name is not in KAFKA_CLUSTER=$members"
    echo "$node_id" >"$dir/node_id"
  fi
  if [[ ! -s $dir/voters ]]; then
    local i=1
    for m in $members; do
      mkdir -p "$STATE/$m"
      voters+="${voters:+,}$i@127.0.0.1:$(port_for "$STATE/$m" controller_port)"
      i=$((i + 1))
    done
    echo "$voters" >"$dir/voters"
  fi
  voters=$(cat "$dir/voters")
  local nmembers; nmembers=$(echo "$voters" | tr ',' '\n' | wc -l)
  local rf=$((nmembers < 3 ? nmembers : 3))
  cat >"$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=$node_id
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
auto.create.topics.enable=false
num.partitions=1
offsets.topic.replication.factor=$rf
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
  kafka_log4j "$dir"
  local cp="$KAFKA_LIBS/*"
  local java_opts=(-Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$dir/log4j2.properties")
  if [[ ! -f $dir/data/meta.properties ]]; then
    local cluster_id
    cluster_id=$(cat "$STATE/${members%% *}/cluster_id" 2>/dev/null || true)
    if [[ -z $cluster_id ]]; then
      # A base64 UUID as Kafka wants it; one starting with '-' would be taken for an option by the format tool.
      cluster_id=$(python3 -c 'import uuid,base64
while True:
    c = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not c.startswith("-"): print(c); break')
      echo "$cluster_id" >"$STATE/${members%% *}/cluster_id"
    fi
    java "${java_opts[@]}" -cp "$cp" kafka.tools.StorageTool format -t "$cluster_id" \
      -c "$dir/server.properties" >>"$dir/kafka.log" 2>&1 || { tail -n 30 "$dir/kafka.log" >&2; die "kafka storage format failed ($dir)"; }
  fi
  : >"$dir/started"
  nohup java "${java_opts[@]}" -cp "$cp" kafka.Kafka "$dir/server.properties" >>"$dir/kafka.log" 2>&1 &
  echo $! >"$dir/pid"
  if [[ ${KAFKA_NO_WAIT:-} != 1 ]]; then kafka_wait "$name"; fi
}

# One KRaft node (broker + controller) for the security tests. Clients reach it only on a SASL_SSL listener whose
# certificate (for localhost and 127.0.0.1) comes from scripts/certs.sh; the broker talks to itself on a loopback
# PLAINTEXT listener of its own. The user `walctl` gets SCRAM-SHA-256 and SCRAM-SHA-512 credentials when the storage
# is formatted, with a random password written to DIR/password (mode 600); DIR/username holds the name.
kafka_secure_start() {
  local name=kafka-secure dir="$STATE/kafka-secure"
  mkdir -p "$dir"
  pid_alive "$dir/pid" && return 0
  ls "$KAFKA_LIBS"/kafka_2.13-*.jar >/dev/null 2>&1 || die "Kafka jars missing under $KAFKA_LIBS: run scripts/services.sh install"
  "$ROOT/scripts/certs.sh" "$dir/certs"
  local port cport iport
  port=$(port_for "$dir" port); cport=$(port_for "$dir" controller_port); iport=$(port_for "$dir" internal_port)
  # The broker reads its key and certificate from one PEM file.
  cat "$dir/certs/server.key" "$dir/certs/server.pem" >"$dir/keystore.pem"
  chmod 600 "$dir/keystore.pem"
  echo walctl >"$dir/username"
  if [[ ! -s $dir/password ]]; then
    (umask 077; python3 -c 'import secrets; print(secrets.token_urlsafe(24))' >"$dir/password")
  fi
  local scram="org.apache.kafka.common.security.scram.ScramLoginModule required;"
  cat >"$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=SASL_SSL://127.0.0.1:$port,INTERNAL://127.0.0.1:$iport,CONTROLLER://127.0.0.1:$cport
advertised.listeners=SASL_SSL://127.0.0.1:$port,INTERNAL://127.0.0.1:$iport
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,SASL_SSL:SASL_SSL
inter.broker.listener.name=INTERNAL
sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=$scram
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=$scram
ssl.keystore.type=PEM
ssl.keystore.location=$dir/keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$dir/certs/ca.pem
ssl.client.auth=none
log.dirs=$dir/data
auto.create.topics.enable=false
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
  kafka_log4j "$dir"
  local cp="$KAFKA_LIBS/*"
  local java_opts=(-Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$dir/log4j2.properties")
  if [[ ! -f $dir/data/meta.properties ]]; then
    local cluster_id password
    cluster_id=$(python3 -c 'import uuid,base64
while True:
    c = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not c.startswith("-"): print(c); break')
    password=$(cat "$dir/password")
    java "${java_opts[@]}" -cp "$cp" kafka.tools.StorageTool format -t "$cluster_id" -c "$dir/server.properties" \
      --add-scram "SCRAM-SHA-256=[name=walctl,password=$password]" \
      --add-scram "SCRAM-SHA-512=[name=walctl,password=$password]" \
      >>"$dir/kafka.log" 2>&1 || { tail -n 30 "$dir/kafka.log" >&2; die "kafka storage format failed ($dir)"; }
  fi
  : >"$dir/started"
  nohup java "${java_opts[@]}" -cp "$cp" kafka.Kafka "$dir/server.properties" >>"$dir/kafka.log" 2>&1 &
  echo $! >"$dir/pid"
  kafka_wait "$name"
}

kafka_log4j() { # dir
  cat >"$1/log4j2.properties" <<'PROPS'
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = org.apache.kafka
logger.kafka.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
PROPS
}

kafka_wait() {
  local name=${1:-kafka} dir="$STATE/${1:-kafka}"
  local port; port=$(cat "$dir/port")
  check() { pid_alive "$dir/pid" && port_open "$port" && grep -q "Kafka Server started" "$dir/kafka.log"; }
  wait_ready "kafka($name)" check "$dir/kafka.log" "$dir/pid" || { stop_pid "$dir"; die "kafka $name did not start"; }
}

stop_pid() { # dir
  local dir=$1
  [[ -s $dir/pid ]] || return 0
  if [[ -s $dir/pg_bin ]]; then
    # PostgreSQL: a fast shutdown (SIGTERM would wait for every client to leave).
    as_pg "$(cat "$dir/pg_bin")/pg_ctl" -D "$dir/data" stop -m fast -w -t 60 >>"$dir/postgres.log" 2>&1 || true
  fi
  local pid; pid=$(cat "$dir/pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/pid"
}

# ---- PostgreSQL ----------------------------------------------------------------------------------------------
# A cluster of the test run's own (initdb into the state dir, a free loopback port, its socket in the state dir),
# run as an unprivileged user: PostgreSQL refuses to run as root, so under root the system user $PG_USER is created
# and runs it. Password authentication (scram-sha-256) for user postgres, the password generated once into
# NAME/password; database remote_wal. A restart keeps the data and the password.
PG_USER=${PG_USER:-rwpg}
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
as_pg() { if ((EUID == 0)); then runuser -u "$PG_USER" -- "$@"; else "$@"; fi; }

postgres_start() {
  local name=${1:-postgres} dir="$STATE/${1:-postgres}"
  mkdir -p "$dir"
  pid_alive "$dir/pid" && return 0
  local bin; bin=$(pg_bin)
  [[ -n $bin ]] || die "PostgreSQL not installed: run scripts/services.sh install"
  if ((EUID == 0)) && ! id -u "$PG_USER" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$PG_USER"
  fi
  echo "$bin" >"$dir/pg_bin"
  local port; port=$(port_for "$dir" port)
  [[ -s $dir/password ]] || (umask 077; python3 -c 'import secrets; print(secrets.token_hex(16))' >"$dir/password")
  mkdir -p "$dir/socket"
  touch "$dir/postgres.log"
  ((EUID == 0)) && chown "$PG_USER" "$dir/socket" "$dir/postgres.log"
  if [[ ! -s $dir/data/PG_VERSION ]]; then
    rm -rf "$dir/data"; mkdir -p "$dir/data"
    (umask 077; cp "$dir/password" "$dir/pwfile")
    ((EUID == 0)) && chown "$PG_USER" "$dir/data" "$dir/pwfile"
    as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=scram-sha-256 --pwfile="$dir/pwfile" -E UTF8 \
      >>"$dir/postgres.log" 2>&1 || { rm -f "$dir/pwfile"; tail -n 40 "$dir/postgres.log" >&2; die "initdb failed"; }
    rm -f "$dir/pwfile"
  fi
  # TLS: a server certificate for 127.0.0.1 from scripts/certs.sh (NAME/certs/), its key readable by the server's
  # user only, as PostgreSQL demands. User postgres may connect either way; user walctl_tls only over TLS with a
  # client certificate signed by NAME/certs/ca.pem (and its password: the same as postgres's).
  "$ROOT/scripts/certs.sh" "$dir/certs"
  cp "$dir/certs/server.pem" "$dir/data/server.crt"
  cp "$dir/certs/server.key" "$dir/data/server.key"
  cp "$dir/certs/ca.pem" "$dir/data/root.crt"
  chmod 600 "$dir/data/server.key"
  ((EUID == 0)) && chown "$PG_USER" "$dir/data/server.crt" "$dir/data/server.key" "$dir/data/root.crt"
  cat >"$dir/data/pg_hba.conf" <<'HBA'
local   all  all                      scram-sha-256
hostssl all  walctl_tls  127.0.0.1/32 scram-sha-256 clientcert=verify-ca
host    all  walctl_tls  127.0.0.1/32 reject
host    all  all         127.0.0.1/32 scram-sha-256
HBA
  ((EUID == 0)) && chown "$PG_USER" "$dir/data/pg_hba.conf"
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 120 \
    -o "-p $port -k $dir/socket -c listen_addresses=127.0.0.1 -c max_connections=200 -c ssl=on -c ssl_ca_file=root.crt" start >/dev/null 2>&1 \
    || { tail -n 40 "$dir/postgres.log" >&2; die "postgres $name did not start"; }
  head -n 1 "$dir/data/postmaster.pid" >"$dir/pid"
  check() { "$bin/pg_isready" -q -h 127.0.0.1 -p "$port"; }
  wait_ready "postgres($name)" check "$dir/postgres.log" "$dir/pid" || { stop_pid "$dir"; die "postgres $name did not start"; }
  local psql=("$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA)
  if [[ $(PGPASSWORD=$(cat "$dir/password") "${psql[@]}" -c "SELECT 1 FROM pg_database WHERE datname = 'remote_wal'") != 1 ]]; then
    PGPASSWORD=$(cat "$dir/password") "${psql[@]}" -c "CREATE DATABASE remote_wal" >/dev/null
  fi
  if [[ $(PGPASSWORD=$(cat "$dir/password") "${psql[@]}" -c "SELECT 1 FROM pg_roles WHERE rolname = 'walctl_tls'") != 1 ]]; then
    PGPASSWORD=$(cat "$dir/password") "${psql[@]}" \
      -c "CREATE ROLE walctl_tls LOGIN PASSWORD '$(cat "$dir/password")'" >/dev/null
  fi
  PGPASSWORD=$(cat "$dir/password") "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d remote_wal -v ON_ERROR_STOP=1 -qtA \
    -c "GRANT CREATE, USAGE ON SCHEMA public TO walctl_tls" >/dev/null
}

# ---- etcd ----------------------------------------------------------------------------------------------------
etcd_start() {
  local name=${1:-etcd} dir="$STATE/${1:-etcd}"
  mkdir -p "$dir"
  pid_alive "$dir/pid" && return 0
  command -v etcd >/dev/null || die "etcd not installed: run scripts/services.sh install"
  local port pport
  port=$(port_for "$dir" port); pport=$(port_for "$dir" peer_port)
  nohup etcd --name "$name" --data-dir "$dir/data" \
    --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
    --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "$name=http://127.0.0.1:$pport" >>"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/pid"
  check() { pid_alive "$dir/pid" && ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$port" --dial-timeout=1s endpoint health >/dev/null 2>&1; }
  wait_ready "etcd($name)" check "$dir/etcd.log" "$dir/pid" || { stop_pid "$dir"; die "etcd $name did not start"; }
}

# An etcd that serves TLS only, wants a client certificate its authority signed, and has auth enabled (users root,
# walctl and reader, passwords generated once into the state dir). Users and roles are set up over TLS before auth is
# enabled; a restart keeps the data, the certificates and the passwords. Auth tokens expire after 5 idle seconds
# (etcd's default is 5 minutes), so the tests' clients go through the token refresh.
etcd_secure_ctl() { # dir etcdctl-args...
  local dir=$1; shift
  ETCDCTL_API=3 etcdctl --endpoints="https://127.0.0.1:$(cat "$dir/port")" --dial-timeout=2s \
    --cacert "$dir/certs/ca.pem" --cert "$dir/certs/client.pem" --key "$dir/certs/client.key" "$@"
}

etcd_secure_start() {
  local name=${1:-etcd-secure} dir="$STATE/${1:-etcd-secure}"
  mkdir -p "$dir"
  pid_alive "$dir/pid" && return 0
  command -v etcd >/dev/null || die "etcd not installed: run scripts/services.sh install"
  "$ROOT/scripts/certs.sh" "$dir/certs"
  for user in root walctl reader; do
    [[ -s $dir/$user.password ]] || (umask 077; openssl rand -hex 16 >"$dir/$user.password")
  done
  local port pport
  port=$(port_for "$dir" port); pport=$(port_for "$dir" peer_port)
  nohup etcd --name "$name" --data-dir "$dir/data" \
    --listen-client-urls "https://127.0.0.1:$port" --advertise-client-urls "https://127.0.0.1:$port" \
    --cert-file "$dir/certs/server.pem" --key-file "$dir/certs/server.key" \
    --client-cert-auth --trusted-ca-file "$dir/certs/ca.pem" --auth-token-ttl "${ETCD_SECURE_TOKEN_TTL:-5}" \
    --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "$name=http://127.0.0.1:$pport" >>"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/pid"
  # Before auth is enabled the client certificate alone is enough; after, root's password is given too.
  check() {
    pid_alive "$dir/pid" || return 1
    if [[ -f $dir/auth_enabled ]]; then
      etcd_secure_ctl "$dir" --user "root:$(cat "$dir/root.password")" endpoint health >/dev/null 2>&1
    else
      etcd_secure_ctl "$dir" endpoint health >/dev/null 2>&1
    fi
  }
  wait_ready "etcd($name)" check "$dir/etcd.log" "$dir/pid" || { stop_pid "$dir"; die "etcd $name did not start"; }
  if [[ ! -f $dir/auth_enabled ]]; then
    local ctl=(etcd_secure_ctl "$dir")
    "${ctl[@]}" user add root --interactive=false <"$dir/root.password" >/dev/null \
      && "${ctl[@]}" user grant-role root root >/dev/null \
      && "${ctl[@]}" user add walctl --interactive=false <"$dir/walctl.password" >/dev/null \
      && "${ctl[@]}" role add walctl >/dev/null \
      && "${ctl[@]}" role grant-permission walctl readwrite --from-key '' >/dev/null \
      && "${ctl[@]}" user grant-role walctl walctl >/dev/null \
      && "${ctl[@]}" user add reader --interactive=false <"$dir/reader.password" >/dev/null \
      && "${ctl[@]}" role add reader >/dev/null \
      && "${ctl[@]}" role grant-permission reader read --from-key '' >/dev/null \
      && "${ctl[@]}" user grant-role reader reader >/dev/null \
      && "${ctl[@]}" auth enable >/dev/null \
      || { stop_pid "$dir"; die "etcd $name: setting up users and auth failed"; }
    : >"$dir/auth_enabled"
  fi
}

# N members NAME-1..NAME-N on free loopback ports, one initial cluster; fresh data each time (a new cluster token).
etcd_cluster_start() { # name n
  local name=$1 n=$2 members=() cluster="" m
  command -v etcd >/dev/null || die "etcd not installed: run scripts/services.sh install"
  for i in $(seq 1 "$n"); do
    m="$name-$i"; members+=("$m")
    stop_pid "$STATE/$m"; rm -rf "$STATE/$m"; mkdir -p "$STATE/$m"
    free_port >"$STATE/$m/port"; free_port >"$STATE/$m/peer_port"
    cluster+="${cluster:+,}$m=http://127.0.0.1:$(cat "$STATE/$m/peer_port")"
  done
  local token="$name-$(date +%s%N)"
  for m in "${members[@]}"; do
    local dir="$STATE/$m" port pport
    port=$(cat "$dir/port"); pport=$(cat "$dir/peer_port")
    echo "$cluster" >"$dir/initial_cluster"
    nohup etcd --name "$m" --data-dir "$dir/data" \
      --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
      --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
      --initial-cluster "$cluster" --initial-cluster-token "$token" --initial-cluster-state new \
      >>"$dir/etcd.log" 2>&1 &
    echo $! >"$dir/pid"
  done
  # Every member must be up before any is healthy (a quorum elects the raft leader): start all, then wait for each.
  for m in "${members[@]}"; do
    local dir="$STATE/$m" port
    port=$(cat "$dir/port")
    check() { pid_alive "$dir/pid" && ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$port" --dial-timeout=1s endpoint health >/dev/null 2>&1; }
    wait_ready "etcd($m)" check "$dir/etcd.log" "$dir/pid" || { for x in "${members[@]}"; do stop_pid "$STATE/$x"; done; die "etcd cluster $name did not start"; }
  done
  local eps=""; for m in "${members[@]}"; do eps+="${eps:+,}127.0.0.1:$(cat "$STATE/$m/port")"; done
  echo "$eps"
}

cmd=${1:-}; shift || true
case "$cmd" in
  install) install ;;
  start)
    case "${1:-}" in
      kafka-secure) kafka_secure_start ;;
      kafka) kafka_start "${2:-kafka}" ;;
      etcd) etcd_start "${2:-etcd}" ;;
      postgres) postgres_start "${2:-postgres}" ;;
      etcd-secure) etcd_secure_start "${2:-etcd-secure}" ;;
      *) die "start kafka|etcd|etcd-secure|postgres [NAME]" ;;
    esac ;;
  stop) [[ -n ${1:-} ]] || die "stop kafka|etcd [NAME]"; stop_pid "$STATE/${2:-$1}" ;;
  endpoint) echo "127.0.0.1:$(cat "$STATE/${2:-$1}/port")" ;;
  pid) pid_alive "$STATE/${2:-$1}/pid" || die "${2:-$1} is not running"; cat "$STATE/${2:-$1}/pid" ;;
  logs) tail -n "${LINES_SHOWN:-60}" "$STATE/${2:-$1}"/*.log ;;
  start-cluster)
    [[ -n ${1:-} && -n ${2:-} ]] || die "start-cluster NAME N"
    members=""; for i in $(seq 1 "$2"); do members+="${members:+ }$1-$i"; done
    # Every node must be up before any is ready (the controllers need a quorum): start all, then wait for each.
    for m in $members; do KAFKA_CLUSTER="$members" KAFKA_NO_WAIT=1 kafka_start "$m"; done
    for m in $members; do kafka_wait "$m"; done
    eps=""; for m in $members; do eps+="${eps:+,}127.0.0.1:$(cat "$STATE/$m/port")"; done
    echo "$eps" ;;
  start-etcd-cluster)
    [[ -n ${1:-} && -n ${2:-} ]] || die "start-etcd-cluster NAME N"
    etcd_cluster_start "$1" "$2" ;;
  remove-etcd-cluster)
    [[ -n ${1:-} && -n ${2:-} ]] || die "remove-etcd-cluster NAME N"
    for i in $(seq 1 "$2"); do stop_pid "$STATE/$1-$i"; rm -rf "${STATE:?}/$1-$i"; done ;;
  remove) [[ -n ${1:-} ]] || die "remove NAME"; stop_pid "$STATE/$1"; rm -rf "${STATE:?}/$1" ;;
  stop-all) for d in "$STATE"/*/; do [[ -d $d ]] && stop_pid "${d%/}"; done ;;
  *) die "usage: $0 install | start|stop|endpoint|pid|logs kafka|etcd [NAME] | start-cluster NAME N | start-etcd-cluster|remove-etcd-cluster NAME N | remove NAME | stop-all" ;;
esac
