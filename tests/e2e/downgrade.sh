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

bytes=${SRQSHIM_TEST_BYTES:-$((32 << 20))}
[ "$bytes" -ge $((8 << 20)) ] || bytes=$((8 << 20))
port=9700

# Bytes the server's one connection received over RDMA so far (0 when not shown).
server_rx() { status_of "$1" "sum(c['rx_bytes'] for c in p['connections'] if c['state'] == 'upgraded')" 2> /dev/null || echo 0; }

run_case() {
	local name=$1 style=$2 who=$3 spid cpid rx=0 out
	port=$((port + 1))
	"${SERVED[@]}" "$BUILD/tests/stream_check" server "$ADDR" $port "$style" $bytes \
		> "$WORK/server.log" 2>&1 &
	spid=$!
	wait_listen $port
	"${SHIMMED[@]}" "$BUILD/tests/stream_check" client "$ADDR" $port "$style" $bytes \
		> "$WORK/client.log" 2>&1 &
	cpid=$!
	# Mid-stream: once a few MiB went over RDMA.
	for _ in $(seq 1 400); do
		rx=$(server_rx $spid)
		[ "$rx" -ge $((2 << 20)) ] && break
		alive $cpid || break
		sleep 0.05
	done
	[ "$rx" -ge $((2 << 20)) ] || { cat "$WORK/client.log" "$WORK/server.log"; fail "$name: only $rx bytes over RDMA before the move"; }
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
