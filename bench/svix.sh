# bench/run.sh section `svix` (sourced): the webhook fan-out beside Svix's
# open-source server (PostgreSQL + Redis), both driven by examples/fanout.rs
# at each of SVIX_SIZES ("ENDPOINTS:EVENTS …"): as fast as each goes, then
# at half of its own most events/s (open loop) for latency. The build of
# svix-server is docs/performance.md's ("Svix's server, built here").
#
#   SVIX_BIN=/path/to/svix-server ONLY=svix bench/run.sh
#
# Svix runs as its docker-compose sets it up: its queue in Redis
# (SVIX_QUEUE_TYPE=redis, appendonly with Redis's default everysec fsync),
# its messages and attempts in PostgreSQL 15 (fsync and synchronous_commit
# on, as Debian ships it). Each run gets a fresh database, an empty Redis
# and a new svix-server; spoold a fresh spool whose endpoint queues keep
# history (24 h, 1 MiB), since Svix always keeps its attempts.

SVIX_SIZES=${SVIX_SIZES:-100:300 1000:30 10000:5}
SVIX_PORT=${SVIX_PORT:-18071}
SVIX_PG_PORT=${SVIX_PG_PORT:-18072}
SVIX_REDIS_PORT=${SVIX_REDIS_PORT:-18073}
SVIX_PUBLISHERS=${SVIX_PUBLISHERS:-16}

# svix_postgres_start: a PostgreSQL cluster of its own (as user postgres,
# which it insists on), on a directory the postgres user owns.
svix_postgres_start() {
  local pg_bin
  pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  svix_pg_dir=$(mktemp -d /tmp/spoold-bench-pg.XXXXXX)
  chown postgres "$svix_pg_dir"
  runuser -u postgres -- "$pg_bin/initdb" -D "$svix_pg_dir/data" -U postgres --auth=trust >/dev/null
  runuser -u postgres -- "$pg_bin/pg_ctl" -D "$svix_pg_dir/data" -l "$svix_pg_dir/log" -w \
    -o "-p $SVIX_PG_PORT -k /tmp -c listen_addresses=127.0.0.1 -c max_connections=300" start >/dev/null
  svix_pg_ctl="$pg_bin/pg_ctl"
  svix_pg_pid=$(head -1 "$svix_pg_dir/data/postmaster.pid")
}

svix_postgres_stop() {
  runuser -u postgres -- "$svix_pg_ctl" -D "$svix_pg_dir/data" -m fast stop >/dev/null 2>&1 || true
  rm -rf "$svix_pg_dir"
}

# svix_start DB: svix-server on a fresh database DB and an empty Redis;
# sets $svix_pid and $svix_token.
svix_start() {
  local db=$1
  psql -h 127.0.0.1 -p "$SVIX_PG_PORT" -U postgres -qc "CREATE DATABASE $db" >/dev/null
  redis-cli -p "$SVIX_REDIS_PORT" flushall >/dev/null
  export SVIX_JWT_SECRET=bench-only-secret-not-for-production
  export SVIX_DB_DSN="postgresql://postgres@127.0.0.1:$SVIX_PG_PORT/$db"
  export SVIX_REDIS_DSN="redis://127.0.0.1:$SVIX_REDIS_PORT"
  export SVIX_QUEUE_TYPE=redis SVIX_CACHE_TYPE=memory
  export SVIX_LISTEN_ADDRESS="127.0.0.1:$SVIX_PORT"
  export SVIX_WHITELIST_SUBNETS="[127.0.0.1/32]"
  export SVIX_DB_POOL_MAX_SIZE=50 RUST_LOG=svix_server=warn
  # A task's lease in Redis outlives the slowest fan-out here (10 000
  # endpoints), so that none is redelivered as lost.
  export SVIX_REDIS_PENDING_DURATION_SECS=600
  "$SVIX_BIN" migrate >>"$work/svix.log" 2>&1
  svix_token=$("$SVIX_BIN" jwt generate | awk '{print $NF}')
  "$SVIX_BIN" >>"$work/svix.log" 2>&1 &
  svix_pid=$!
  pids+=("$svix_pid")
}

svix_stop() {
  kill -TERM "$svix_pid" 2>/dev/null || true
  wait "$svix_pid" 2>/dev/null || true
}

# svix_once SYSTEM ENDPOINTS EVENTS RUN [RATE]: one fan-out run; prints its
# RESULT fields.
svix_once() {
  local system=$1 endpoints=$2 events=$3 run=$4 rate=${5:-} line pids_arg url token=""
  if [ "$system" = spoold ]; then
    dir=$(fresh "fanout" true)
    run_spoold "$spoold_bin" "$dir"
    pids_arg=$spoold_pid
    url=http://127.0.0.1:$PORT
  else
    # A message's task sends to all its endpoints at once, each on a
    # connection of its own: with its default of 500 tasks, 5 events to
    # 10 000 endpoints went past the 20 000 descriptors this machine
    # allows a process ("Too many open files") and stalled. One task at a
    # time there.
    export SVIX_WORKER_MAX_TASKS=500
    [ "$endpoints" -ge 10000 ] && export SVIX_WORKER_MAX_TASKS=1
    svix_start "svix_$run"
    pids_arg=$svix_pid,$svix_redis_pid,$svix_pg_pid
    url=http://127.0.0.1:$SVIX_PORT
    token=$svix_token
  fi
  line=$("$work/bin/fanout" --system "$system" --url "$url" ${token:+--token "$token"} \
    --endpoints "$endpoints" --events "$events" --publishers "$SVIX_PUBLISHERS" \
    --sink "127.0.0.1:$SINK_PORT" --pids "$pids_arg" --device "$svix_device" ${rate:+--rate "$rate"} | grep RESULT)
  if [ "$system" = spoold ]; then stop_spoold; else svix_stop; fi
  echo "${line#RESULT }${token:+ svix_worker_max_tasks=$SVIX_WORKER_MAX_TASKS}"
}

svix_section() {
  [ -x "${SVIX_BIN:-}" ] || { echo "section svix needs SVIX_BIN=path/to/svix-server (docs/performance.md)" >&2; exit 1; }
  install_missing redis-server=redis-server psql=postgresql
  cargo build --release --quiet --example fanout
  cp target/release/examples/fanout "$work/bin/fanout"
  mkdir -p "$work/svix-redis"
  redis-server --bind 127.0.0.1 --port "$SVIX_REDIS_PORT" --dir "$work/svix-redis" --appendonly yes \
    --save "" --daemonize no --logfile "$work/svix-redis/log" &
  svix_redis_pid=$!
  pids+=("$svix_redis_pid")
  for _ in $(seq 1 100); do redis-cli -p "$SVIX_REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
  svix_postgres_start
  # The block device of the spools and of PostgreSQL's and Redis's files
  # (one disk here): its written bytes are each run's.
  svix_device=$(lsblk -no PKNAME "$(df --output=source "$work" | tail -1)" 2>/dev/null | head -1)
  [ -n "$svix_device" ] || svix_device=$(basename "$(df --output=source "$work" | tail -1)")
  local size endpoints events system most rate run=0 versions extra
  versions="svix=$("$SVIX_BIN" --version 2>/dev/null | awk '{print $NF}') postgres=$(psql --version | awk '{print $3}')"
  for size in $SVIX_SIZES; do
    endpoints=${size%%:*} events=${size##*:}
    for system in spoold svix; do
      run=$((run + 1))
      most=$(svix_once "$system" "$endpoints" "$events" "$run")
      extra=""
      [ "$system" = svix ] && extra=" $versions"
      if [ -z "$(field deliveries_per_s "$most")" ]; then
        result "svix system=$system endpoints=$endpoints events=$events load=max failed=1$extra"
        continue
      fi
      result "svix system=$system endpoints=$endpoints events=$events load=max $most$extra"
      # Half of the events a second it delivered (not of those it took in:
      # at its most each takes events faster than it fans them out).
      rate=$(python3 -c "print(max(0.01, round($(field deliveries_per_s "$most") / $endpoints / 2, 2)))")
      run=$((run + 1))
      result "svix system=$system endpoints=$endpoints events=$events load=half rate=$rate $(svix_once "$system" "$endpoints" "$events" "$run" "$rate")"
    done
  done
  svix_postgres_stop
  redis-cli -p "$SVIX_REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
}
