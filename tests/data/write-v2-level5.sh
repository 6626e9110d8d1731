#!/usr/bin/env bash
# Writes tests/data/v2-level5/: a spool that the first build of format 2,
# level 5 wrote over HTTP, holding every record and checkpoint chunk kind
# that level reads. Run once, by the build named in tests/data/README.md,
# and committed; never run again (a fixture's worth is that no later build
# wrote it). Kept so that the next level's fixture is written the same way.
#
#   cargo build --features testing
#   SPOOLD_BIN=target/debug/spoold bash tests/data/write-v2-level5.sh
#
# Needs curl, jq and python3 (the push queues' sink).
set -euo pipefail

cd "$(dirname "$0")/../.."
BIN="${SPOOLD_BIN:-target/debug/spoold}"
OUT="tests/data/v2-level5"
[ -e "$OUT" ] && { echo "$OUT exists: a fixture is never rewritten" >&2; exit 1; }

WORK="$(mktemp -d)"
SINK_PID=""
SPOOLD_PID=""
cleanup() {
  [ -n "$SPOOLD_PID" ] && kill "$SPOOLD_PID" 2>/dev/null || true
  [ -n "$SINK_PID" ] && kill "$SINK_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# The push queues' sink: `/ok…` answers 200, anything else 500.
python3 - "$WORK/sink.port" <<'EOF' &
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200 if self.path.startswith("/ok") else 500)
        self.send_header("content-length", "0")
        self.end_headers()
    do_PUT = do_POST
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
open(sys.argv[1], "w").write(str(s.server_port))
s.serve_forever()
EOF
SINK_PID=$!
until [ -s "$WORK/sink.port" ]; do sleep 0.1; done
SINK="http://127.0.0.1:$(cat "$WORK/sink.port")"

cat >"$WORK/spoold.toml" <<EOF
[server]
listen = "127.0.0.1:0"
[spool]
dir = "$WORK/spool"
segment_bytes = "64KiB"
compaction_interval = "1s"
EOF
SPOOLD_LOG=info "$BIN" run --config "$WORK/spoold.toml" 2>"$WORK/log" &
SPOOLD_PID=$!
until grep -q 'addr=' "$WORK/log"; do sleep 0.1; done
ADDR="$(grep -o 'addr=[0-9.:]*' "$WORK/log" | head -1 | cut -d= -f2)"
B="http://$ADDR"
until curl -sf "$B/readyz" >/dev/null; do sleep 0.1; done

# curl that fails on an HTTP error and says what was answered.
c() { curl -sS --fail-with-body "$@"; echo; }
put_queue() { c -X PUT "$B/v1/queues/$1" -H 'content-type: application/json' -d "$2" >/dev/null; }
send() { # queue body [header…]: the new message's id
  local q="$1" body="$2"; shift 2
  local args=()
  for h in "$@"; do args+=(-H "$h"); done
  c -X POST "$B/v1/queues/$q/messages" -H 'content-type: text/plain' "${args[@]}" --data-binary "$body" | jq -r .id
}
publish() { # json [header…]
  local json="$1"; shift
  local args=()
  for h in "$@"; do args+=(-H "$h"); done
  c -X POST "$B/v1/events" -H 'content-type: application/json' "${args[@]}" -d "$json" >/dev/null
}
receive() { # queue: "id token" of the next message
  curl -sS -D - -o /dev/null -X POST "$B/v1/queues/$1/receive" |
    tr -d '\r' | awk -F': ' 'tolower($1)=="spooler-message-id"{i=$2} tolower($1)=="spooler-lease-token"{t=$2} END{print i, t}'
}
settle() { c -X POST "$B/v1/queues/$1/leases/$2/$3" >/dev/null; }
wait_for() { # what, then a command that succeeds once it is so
  local what="$1"; shift
  for _ in $(seq 600); do "$@" && return 0; sleep 0.1; done
  echo "timed out waiting for $what" >&2; exit 1
}

S1='whsec_bGV2ZWwtZml2ZS1maXJzdC1zZWNyZXQtMDAwMDA='
S2='whsec_bGV2ZWwtZml2ZS1zZWNvbmQtc2VjcmV0LTAwMDA='
S3='whsec_Zmxha3ktZmlyc3Qtc2VjcmV0LTAwMDAwMDAwMDA='
S4='whsec_Zmxha3ktc2Vjb25kLXNlY3JldC0wMDAwMDAwMDA='
TRACE1='00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
TRACE2='00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'

echo "== the catalogue: two types, a third set and removed"
c -X PUT "$B/v1/event-types/order.created" -H 'content-type: application/json' -d '{"description":"An order was placed","schema":{"type":"object","required":["region"],"properties":{"region":{"type":"string"},"n":{"type":"integer"}}},"example":{"region":"eu","n":1}}' >/dev/null
c -X PUT "$B/v1/event-types/order.paid" -H 'content-type: application/json' -d '{"description":"An order was paid"}' >/dev/null
c -X PUT "$B/v1/event-types/temp.gone" -H 'content-type: application/json' -d '{"description":"Removed again"}' >/dev/null
c -X DELETE "$B/v1/event-types/temp.gone" >/dev/null

echo "== queues"
put_queue orders '{"events":["order.>"],"filter":{"payload":{"region":["eu"]}},"ordering":"per_key","orderingOnFailure":"hold","maxRetries":0,"dedupWindowSeconds":3600,"historyRetentionSeconds":86400}'
put_queue audit '{"events":["order.>"]}'
put_queue ops '{"events":["spoold.>"]}'
put_queue hooks "{\"destination\":\"$SINK/ok\",\"signingSecret\":\"$S1\",\"events\":[\"order.paid\"],\"tenant\":\"cus_42\",\"historyRetentionSeconds\":86400}"
put_queue flaky "{\"destination\":\"$SINK/fail\",\"signingSecret\":\"$S3\",\"maxRetries\":3,\"backoff\":{\"initialSeconds\":3600,\"multiplier\":2,\"maxSeconds\":7200,\"jitter\":0}}"
put_queue jobs '{"maxRetries":0}'
put_queue receipts '{"historyRetentionSeconds":1}'
put_queue churn '{}'
c -X POST "$B/v1/queues/hooks/secret/rotate" -H 'content-type: application/json' -d "{\"secret\":\"$S2\",\"overlapSeconds\":2592000}" >/dev/null

echo "== orders: a key that fails and holds its next message"
send orders 'cust-2 first' 'spooler-ordering-key: cust-2' >/dev/null
send orders 'cust-2 second' 'spooler-ordering-key: cust-2' >/dev/null
read -r id token < <(receive orders)
settle orders "$token" nack

echo "== events"
publish '{"type":"order.created","payload":{"region":"eu","n":1},"orderingKey":"cust-1"}' 'idempotency-key: evt-1' "traceparent: $TRACE1"
publish '{"type":"order.created","payload":{"region":"us","n":2}}'
publish '{"type":"order.paid","payload":{"region":"eu","n":3},"orderingKey":"cust-1","tenant":"cus_42"}'
wait_for "hooks to deliver" sh -c "curl -sf '$B/v1/queues/hooks/history' | jq -e '.messages | length == 1' >/dev/null"

echo "== orders: deliver the first event into the history, resend it"
read -r id token < <(receive orders)
settle orders "$token" ack
c -X POST "$B/v1/queues/orders/history/$id/resend" >/dev/null
send orders 'traced' "traceparent: $TRACE2" 'spooler-hops: 1' >/dev/null
send orders 'delayed' 'spooler-delay: 3600000' 'idempotency-key: key-1' >/dev/null

echo "== flaky: one attempt answered 500"
send flaky 'attempted' >/dev/null
wait_for "flaky's attempt" sh -c "curl -sf '$B/v1/queues/flaky/messages' | jq -e '.messages[0].retryCount == 1' >/dev/null"

echo "== jobs: dead letters, one redriven, one cancelled"
for n in 1 2 3 4; do send jobs "job $n" >/dev/null; done
for _ in 1 2; do read -r id token < <(receive jobs); settle jobs "$token" nack; done
job2="$(curl -sf "$B/v1/queues/jobs.failed/messages" | jq -r '.messages[] | select(.body == "job 2") | .id')"
c -X POST "$B/v1/queues/jobs/redrive?id=$job2" >/dev/null
job3="$(curl -sf "$B/v1/queues/jobs/messages" | jq -r '.messages[] | select(.body == "job 3") | .id')"
c -X DELETE "$B/v1/queues/jobs/messages/$job3" >/dev/null
wait_for "ops to be told of three failures" sh -c "curl -sf '$B/v1/queues/ops/messages' | jq -e '.messages | length >= 3' >/dev/null"

echo "== churn: 150 messages of 1 KiB, 50 acked, 100 purged, then compacted"
kib="$(head -c 1024 /dev/zero | tr '\0' 'c')"
for _ in $(seq 150); do send churn "$kib" >/dev/null; done
for _ in $(seq 50); do read -r id token < <(receive churn); settle churn "$token" ack; done
c -X DELETE "$B/v1/queues/churn/messages" >/dev/null
compacted() { ls "$WORK/spool"/*.ckpt "$WORK/spool"/*.pack >/dev/null 2>&1 && ! ls "$WORK/spool"/0000000000000001.seg >/dev/null 2>&1; }
wait_for "a checkpoint and a pack" compacted
sleep 2
ls -la "$WORK/spool"

echo "== after the checkpoint"
c -X PATCH "$B/v1/queues/orders" -H 'content-type: application/json' -d '{"leaseTimeoutSeconds":45}' >/dev/null
c -X PUT "$B/v1/event-types/order.shipped" -H 'content-type: application/json' -d '{"description":"An order was shipped","example":{"region":"eu"}}' >/dev/null
publish '{"type":"order.created","payload":{"region":"eu","n":4},"orderingKey":"cust-3"}' 'idempotency-key: evt-2' "traceparent: $TRACE1"
send orders 'cust-1 after' 'spooler-ordering-key: cust-1' >/dev/null
# A lease held at SIGTERM: leases are not journaled, so it is visible again.
read -r id token < <(receive orders)
c -X POST "$B/v1/queues/flaky/secret/rotate" -H 'content-type: application/json' -d "{\"secret\":\"$S4\",\"overlapSeconds\":1}" >/dev/null
send receipts 'receipt' >/dev/null
read -r id token < <(receive receipts)
settle receipts "$token" ack
wait_for "flaky's old secret to expire and receipts' history to drop" sh -c \
  "curl -sf '$B/v1/queues/receipts/history' | jq -e '.messages | length == 0' >/dev/null"
sleep 2
c -X POST "$B/v1/queues/flaky/pause" >/dev/null

kill -TERM "$SPOOLD_PID"
wait "$SPOOLD_PID" || { echo "spoold exited non-zero" >&2; cat "$WORK/log" >&2; exit 1; }
SPOOLD_PID=""
mkdir -p "$OUT"
for f in "$WORK/spool"/*; do
  case "$f" in *.tmp|*/spool.lock) continue ;; esac
  cp "$f" "$OUT/"
done
ls -la "$OUT"
du -sh "$OUT"
