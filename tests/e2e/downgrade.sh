#!/usr/bin/env bash
# The live downgrade (docs/protocol.md, section 4): while both ends stream
# random data at each other through one upgraded connection, an operator
# moves it back onto its TCP connection (`srqshim-ctl downgrade`), from the
# server's side, from the client's, or from both at once. Every byte is
# checked by stream_check against its generator and by SHA-256 across the
# two ends; the bytes before the move went over RDMA (the server's status
# shows them), the rest over TCP (the kernel's counters show them).
. "$(dirname "$0")/lib.sh"
need_rdma

# Long enough for the move to come mid-stream in every pairing
# (SRQSHIM_TEST_BYTES, which shortens the stream test, is not for this one).
bytes=$((32 << 20))
port=9700

# Starts stream_check at both ends ($1: style; SERVER_ENV, CLIENT_ENV: more
# variables), waits until a few MiB went over RDMA and asks for the move
# ($2: server, client, both). Sets spid, cpid, rx.
start_and_move() {
	local name=$1 style=$2 who=$3 out
	port=$((port + 1))
	"${SERVED[@]}" ${SERVER_ENV:-} "$BUILD/tests/stream_check" server "$ADDR" $port "$style" $bytes \
		> "$WORK/server.log" 2>&1 &
	spid=$!
	wait_listen $port
	"${SHIMMED[@]}" ${CLIENT_ENV:-} "$BUILD/tests/stream_check" client "$ADDR" $port "$style" $bytes \
		> "$WORK/client.log" 2>&1 &
	cpid=$!
	rx=0
	# Mid-stream: once a megabyte went over RDMA.
	for _ in $(seq 1 400); do
		rx=$(upgraded_rx $spid)
		[ "$rx" -ge $((1 << 20)) ] && break
		alive $cpid || break
		sleep 0.05
	done
	[ "$rx" -ge $((1 << 20)) ] || { cat "$WORK/client.log" "$WORK/server.log"; fail "$name: only $rx bytes over RDMA before the move"; }
	alive $cpid && alive $spid || fail "$name: the stream ended before the move"
	case $who in
	server) out=$("$BUILD/tools/srqshim-ctl" downgrade --pid $spid) ;;
	client) out=$("$BUILD/tools/srqshim-ctl" downgrade --pid $cpid) ;;
	both)
		# Each end's request may find the connection moving already (counted) or,
		# rarely, moved (0); at least one of them starts it.
		"$BUILD/tools/srqshim-ctl" downgrade --pid $cpid > "$WORK/ctl.out" &
		out=$("$BUILD/tools/srqshim-ctl" downgrade --pid $spid)
		wait $! || fail "$name: srqshim-ctl on the client"
		case "$out $(cat "$WORK/ctl.out")" in
		"1 connection"* | *" 1 connection"*) out="1 connection" ;;
		*) fail "$name: srqshim-ctl said: $out / $(cat "$WORK/ctl.out")" ;;
		esac
		;;
	esac
	case $out in "1 connection"*) ;; *) fail "$name: srqshim-ctl said: $out" ;; esac
}

run_case() {
	local name=$1 spid cpid rx
	start_and_move "$@"
	timeout 300 tail --pid=$cpid -f /dev/null
	wait $cpid || { cat "$WORK/client.log" "$WORK/server.log"; fail "$name: client"; }
	wait $spid || { cat "$WORK/server.log"; fail "$name: server"; }
	grep -qi "error" "$WORK/client.log" "$WORK/server.log" && { cat "$WORK/client.log" "$WORK/server.log"; fail "$name: errors logged"; }
	same_streams "$WORK/client.log" "$WORK/server.log"
	# After the move the kernel's TCP carried the rest, both ways.
	for log in "$WORK/client.log" "$WORK/server.log"; do
		for n in $(grep -o 'tcp_bytes_[a-z]*=[0-9]*' "$log" | cut -d= -f2); do
			[ "$n" -ge $((1 << 20)) ] || fail "$name: TCP carried only $n bytes after the move ($log)"
		done
	done
	pass "$name: $bytes bytes each way checked, $rx of them received over RDMA before the move"
}

run_case "the server moves the connection" block server
run_case "the client moves the connection" epoll-lt client
run_case "both ends move it at once" poll both

# The rule for a peer that answers late (docs/protocol.md, section 4): within
# SRQSHIM_LINGER_MS the move completes; past it the connection is reset, and
# both ends see an error, never a wrong byte. (A timer's rule: srq to srq
# only.)
if uncrossed "the peer's RETURN late"; then
	CLIENT_ENV=SRQSHIM_TEST_DELAYS=down-return=1500 \
		run_case "the peer's RETURN 1.5 s late (bound 5 s)" block server
	SERVER_ENV=SRQSHIM_LINGER_MS=1000 CLIENT_ENV=SRQSHIM_TEST_DELAYS=down-return=2500 \
		start_and_move "the peer's RETURN 2.5 s late (bound 1 s)" block server
	name="the peer's RETURN 2.5 s late (bound 1 s)"
	timeout 60 tail --pid=$cpid -f /dev/null || fail "$name: the client still runs"
	crc=0 src=0
	wait $cpid || crc=$?
	wait $spid || src=$?
	# Each application's next call fails (a write on a reset TCP connection: EPIPE and
	# SIGPIPE, exit status 141), and the shim says why in its log.
	[ $crc -ne 0 ] && [ $src -ne 0 ] || fail "$name: exit status client $crc, server $src"
	grep -q "differs" "$WORK/client.log" "$WORK/server.log" && { cat "$WORK/client.log" "$WORK/server.log"; fail "$name: a wrong byte"; }
	for log in "$WORK/client.log" "$WORK/server.log"; do
		grep -q "the move back to TCP failed.*the connection is reset" "$log" || { cat "$log"; fail "$name: no reset said in $log"; }
	done
	pass "$name: both ends reset (exit status client $crc, server $src; the server: $(grep -o 'failed ([^)]*)' "$WORK/server.log"))"
fi

# The client's application makes no socket call while the server moves the
# connection: it wrote 128 KiB into a window of 4 buffers (32 KiB), shut its
# side (that end of stream waits behind 96 KiB short of credits) and
# sleeps, for longer than the server's bound for the move (2 s here). Its
# shim answers alone; the 32 KiB the server received and never
# read come back, then the 96 KiB never posted, all over TCP, intact.
port=$((port + 1))
SERVED+=(SRQSHIM_SRQ_WINDOW=4 SRQSHIM_RQ_DEPTH=4)
SHIMMED+=(SRQSHIM_SRQ_WINDOW=4 SRQSHIM_RQ_DEPTH=4)
"${SERVED[@]}" SRQSHIM_LINGER_MS=2000 "$BUILD/tests/handover_check" idle-server "$ADDR" $port 131072 > "$WORK/idle-server.log" 2>&1 &
spid=$!
wait_listen $port
"${SHIMMED[@]}" "$BUILD/tests/handover_check" idle-client "$ADDR" $port 131072 > "$WORK/idle-client.log" 2>&1 &
cpid=$!
for _ in $(seq 1 100); do grep -q ready "$WORK/idle-server.log" && break; sleep 0.05; done
grep -q ready "$WORK/idle-server.log" || { cat "$WORK/idle-server.log"; fail "idle client: no connection"; }
sleep 0.5
out=$("$BUILD/tools/srqshim-ctl" downgrade --pid $spid)
case $out in "1 connection"*) ;; *) fail "idle client: srqshim-ctl said: $out" ;; esac
wait $spid || { cat "$WORK/idle-server.log" "$WORK/idle-client.log"; fail "idle client: server"; }
wait $cpid || { cat "$WORK/idle-client.log"; fail "idle client: client"; }
grep -q 'said "ok 131072"' "$WORK/idle-client.log" || { cat "$WORK/idle-client.log"; fail "idle client: answer"; }
grep -qi error "$WORK/idle-server.log" "$WORK/idle-client.log" && { cat "$WORK/idle-server.log" "$WORK/idle-client.log"; fail "idle client: errors logged"; }
SERVED=("${SERVED[@]:0:${#SERVED[@]}-2}")
SHIMMED=("${SHIMMED[@]:0:${#SHIMMED[@]}-2}")
pass "a client asleep outside any socket call, its end of stream behind bytes short of credits: its shim moves alone, 131072 bytes checked"

# An operator takes the device's connections down while a service runs:
# redis-benchmark's 10 connections move back to TCP mid-run, and no request
# fails.
port=6420
"${SERVED[@]}" redis-server --bind "$ADDR" --port $port --save '' --appendonly no \
	--protected-mode no > "$WORK/redis.log" 2>&1 &
rpid=$!
wait_listen $port
"${SHIMMED[@]}" redis-benchmark -h "$ADDR" -p $port -c 10 -n 40000 -t set,get -d 64 -r 1000 \
	--csv > "$WORK/bench.csv" 2> "$WORK/bench.err" &
bpid=$!
up=0
for _ in $(seq 1 200); do
	up=$(upgraded_now $rpid "$CLIENT_MODE")
	[ "$up" -ge 10 ] && break
	sleep 0.05
done
[ "$up" -ge 10 ] || fail "redis: $up connections upgraded before the move"
sleep 0.5
alive $bpid || fail "redis: the benchmark ended before the move"
out=$("$BUILD/tools/srqshim-ctl" downgrade --pid $rpid)
case $out in "10 connection"*) ;; *) fail "redis: srqshim-ctl said: $out" ;; esac
moved=0
for _ in $(seq 1 100); do
	moved=$(status_of $rpid "sum(1 for c in p['connections'] if c['state'] == 'tcp' and c['reason'] == 'downgraded')" 2> /dev/null || echo 0)
	[ "$moved" -ge 10 ] && break
	sleep 0.05
done
[ "$moved" -ge 10 ] || fail "redis: srqshim-ctl shows $moved connections moved back to TCP"
alive $bpid || fail "redis: the benchmark ended before its connections were shown moved"
wait $bpid || { cat "$WORK/bench.err"; fail "redis-benchmark"; }
grep -q '^"SET"' "$WORK/bench.csv" && grep -q '^"GET"' "$WORK/bench.csv" || { cat "$WORK/bench.csv" "$WORK/bench.err"; fail "redis: benchmark results"; }
[ ! -s "$WORK/bench.err" ] || { cat "$WORK/bench.err"; fail "redis: the benchmark reported errors"; }
[ "$(shimmed redis-cli -h "$ADDR" -p $port set key:after ok)" = OK ] || fail "redis: SET after the move"
grep -i "srqshim.*error" "$WORK/redis.log" && fail "redis: the server logged shim errors"
kill $rpid; wait $rpid 2> /dev/null || true
pass "redis-benchmark: 10 connections moved back to TCP mid-run (shown as downgraded), every request answered"
