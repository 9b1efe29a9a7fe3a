#!/usr/bin/env bash
# Acceptance 2: a plain client against a preloaded server, and preloaded
# clients (redis-benchmark, 10 at once) against a plain server: both work
# over TCP with identical values, and the plain server sees at most one
# probe connection for the whole test.
. "$(dirname "$0")/lib.sh"
need_rdma

head -c 150000 /dev/urandom | base64 -w0 > "$WORK/value"

# Plain client, preloaded server.
port=6401
"${SERVED[@]}" redis-server --bind "$ADDR" --port $port --save '' --appendonly no \
	--protected-mode no > "$WORK/redis1.log" 2>&1 &
wait_listen $port
[ "$(redis-cli -h "$ADDR" -p $port -x set big < "$WORK/value")" = OK ] || fail "plain SET"
redis-cli -h "$ADDR" -p $port --raw get big | head -c 200000 > "$WORK/back"
cmp "$WORK/value" "$WORK/back" || fail "plain client: value differs"
redis-benchmark -h "$ADDR" -p $port -c 10 -n 2000 -t set,get --csv > /dev/null 2>&1 || fail "plain benchmark"
pass "plain client against a preloaded server"

# A handshake of a version we do not speak (our magic, a version 0 header)
# from a plain client to a preloaded echo server: the connection stays on
# TCP (reason version-mismatch) and every byte goes to the application,
# which echoes them unchanged.
eport=6403
"${SERVED[@]}" SRQSHIM_LOG_LEVEL=warn python3 -c '
import socket, sys, time
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((sys.argv[1], int(sys.argv[2]))); l.listen(1)
c, _ = l.accept()
while True:
    d = c.recv(4096)
    if not d: break
    c.sendall(d)
c.shutdown(socket.SHUT_WR)
time.sleep(600) # the connection stays for the status
' "$ADDR" $eport > "$WORK/echo.log" 2>&1 &
epid=$!
wait_listen $eport
python3 - "$ADDR" $eport <<'PY' || { cat "$WORK/echo.log"; fail "a handshake of another version: bytes lost or changed"; }
import socket, sys
msg = b"\0SRQSHM\xa5\x00\x01\x00\x40" + b"application bytes after it" * 10
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
s.sendall(msg)
s.shutdown(socket.SHUT_WR)
back = b""
while True:
    d = s.recv(4096)
    if not d: break
    back += d
sys.exit(0 if back == msg else 1)
PY
got=$(status_of $epid "[c['reason'] for c in p['connections']]")
[ "$got" = "['version-mismatch']" ] || { cat "$WORK/echo.log"; fail "the server's connection: $got"; }
kill $epid
pass "a handshake of another version stays on TCP (version-mismatch) and its bytes reach the application"

# Preloaded clients, plain server. Count its connections first without the shim.
port=6402
redis-server --bind "$ADDR" --port $port --save '' --appendonly no --protected-mode no \
	> "$WORK/redis2.log" 2>&1 &
wait_listen $port
conns() { redis-cli -h "$ADDR" -p $port info stats | tr -d '\r' | sed -n 's/^total_connections_received://p'; }
c0=$(conns)
redis-benchmark -h "$ADDR" -p $port -c 10 -n 2000 -t set,get --csv > /dev/null 2>&1 || fail "benchmark"
c1=$(conns)
plain_cost=$((c1 - c0 - 1))
# Now preloaded: ten clients connect at once to a destination never seen.
shimmed redis-benchmark -h "$ADDR" -p $port -c 10 -n 2000 -t set,get --csv > "$WORK/b.csv" \
	|| fail "preloaded benchmark against a plain server"
c2=$(conns)
shim_cost=$((c2 - c1 - 1))
[ $((shim_cost - plain_cost)) -le 1 ] || fail "the plain server saw $((shim_cost - plain_cost)) probe connections (at most 1 allowed)"
[ "$(shimmed redis-cli -h "$ADDR" -p $port -x set big < "$WORK/value")" = OK ] || fail "SET"
shimmed redis-cli -h "$ADDR" -p $port --raw get big | head -c 200000 > "$WORK/back"
cmp "$WORK/value" "$WORK/back" || fail "preloaded client against a plain server: value differs"
c3=$(conns)
[ $((c3 - c2 - 1)) -eq 2 ] || fail "redis-cli made $((c3 - c2 - 1)) connections for 2 commands (a probe was repeated)"
# A stray byte would have shown as a protocol error on the data connections.
grep -qi "protocol error" "$WORK/redis2.log" && fail "the plain server logged a protocol error"
pass "preloaded clients against a plain server: $((shim_cost - plain_cost)) probe connection(s), values identical"

# A destination outside SRQSHIM_PEERS never sees a HELLO: not even one probe.
port=6404
redis-server --bind "$ADDR" --port $port --save '' --appendonly no --protected-mode no \
	> "$WORK/redis3.log" 2>&1 &
wait_listen $port
c0=$(conns)
for i in 1 2 3; do
	SRQSHIM_PEERS=192.0.2.99,198.51.100.0/24 shimmed redis-cli -h "$ADDR" -p $port set k$i v$i > /dev/null
done
hold_client "$ADDR" $port SRQSHIM_PEERS=192.0.2.99,198.51.100.0/24
c1=$(conns)
[ $((c1 - c0 - 1)) -eq 4 ] || fail "a destination outside the policy saw $((c1 - c0 - 1 - 4)) probe(s)"
got=$(status_of $HELD_PID "[c['reason'] for c in p['connections']]")
[ "$got" = "['policy']" ] || fail "a connection outside the policy: $got"
kill $HELD_PID
pass "a destination outside SRQSHIM_PEERS gets no probe (reason: policy)"
