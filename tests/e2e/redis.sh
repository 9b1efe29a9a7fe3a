#!/usr/bin/env bash
# Acceptance 1: redis-server and redis-benchmark (SET/GET, 10 clients), both
# preloaded: correct results over RDMA; a 200 KB value written and read back
# with redis-cli is identical.
. "$(dirname "$0")/lib.sh"
need_rdma

port=6400
"${SERVED[@]}" SRQSHIM_LOG_LEVEL=info redis-server --bind "$ADDR" --port $port --save '' --appendonly no \
	--protected-mode no > "$WORK/redis.log" 2>&1 &
spid=$!
wait_listen $port
cli() { shimmed redis-cli -h "$ADDR" -p $port "$@"; }

before=$(rdma_pkts)
[ "$(cli ping)" = PONG ] || fail "PING"
head -c 150000 /dev/urandom | base64 -w0 > "$WORK/value" # 200,000 bytes
[ "$(stat -c %s "$WORK/value")" = 200000 ] || fail "value size"
[ "$(cli -x set big < "$WORK/value")" = OK ] || fail "SET of 200 KB"
cli --raw get big | head -c 200000 > "$WORK/back"
cmp "$WORK/value" "$WORK/back" || fail "the 200 KB value came back different"
pass "200 KB value identical after SET and GET"

# The benchmark, with a TCP byte count of its connections taken while it runs.
"${SHIMMED[@]}" redis-benchmark -h "$ADDR" -p $port -c 10 -n 20000 -t set,get -d 64 -r 1000 \
	--csv > "$WORK/bench.csv" 2> "$WORK/bench.err" &
bpid=$!
# Sampled while it runs (a run may take less than a second): the first sample with all 10,
# and the server's status then (connections on RDMA, with the client's receive mode).
up=0
for _ in $(seq 1 100); do
	sleep 0.1
	ss -Htin "( sport = :$port )" > "$WORK/ss.txt"
	[ "$(grep -c ESTAB "$WORK/ss.txt" || true)" -ge 10 ] && up=$(upgraded_now $spid "$CLIENT_MODE") &&
		sleep 0.3 && break
done
ss -Htin "( sport = :$port )" > "$WORK/ss.new"
[ "$(grep -c ESTAB "$WORK/ss.new" || true)" -ge 10 ] && mv "$WORK/ss.new" "$WORK/ss.txt"
wait $bpid || { cat "$WORK/bench.err"; fail "redis-benchmark"; }
cat "$WORK/bench.csv"
grep -q '^"SET"' "$WORK/bench.csv" && grep -q '^"GET"' "$WORK/bench.csv" || fail "benchmark results"
conns=$(grep -c ESTAB "$WORK/ss.txt" || true)
[ "$conns" -ge 10 ] || { cat "$WORK/ss.txt"; fail "expected 10 live connections, saw $conns"; }
for n in $(grep -o 'bytes_\(acked\|received\):[0-9]*' "$WORK/ss.txt" | cut -d: -f2); do
	[ "$n" -lt 4096 ] || { cat "$WORK/ss.txt"; fail "a benchmark connection carried $n bytes over TCP"; }
done
# Values written by the benchmark read back right: SET of key:N then GET.
cli set key:check abcdef > /dev/null
[ "$(cli get key:check)" = abcdef ] || fail "GET after the benchmark"
pkts=$(( $(rdma_pkts) - before ))
[ $pkts -gt 40000 ] || fail "only $pkts RDMA packets for 40,000 requests"
grep -i "srqshim.*error" "$WORK/redis.log" && fail "the server logged shim errors"
[ "$up" -ge 10 ] || fail "srqshim-ctl showed $up of the server's connections upgraded with a $CLIENT_MODE peer (10 expected)"
pass "redis-benchmark SET/GET, 10 clients, over RDMA: $pkts packets, TCP carried only the handshake ($conns connections checked, $up shown upgraded)"
