#!/usr/bin/env bash
# Acceptance 4: every readiness style, random data both ways at once through
# one upgraded connection with a receive window small enough that credits run
# out all the time, then half-close; byte-exact, over RDMA (rxe packets move,
# the TCP connection carries only the handshake).
. "$(dirname "$0")/lib.sh"
need_rdma

# A receive window of 4 buffers (private RQ) or a send window of 4 (SRQ): credits run dry constantly. The blocking
# style uses 8 KiB buffers, the others 1 KiB buffers (bulk.sh moves 1 GiB each way).
export SRQSHIM_RQ_DEPTH=4 SRQSHIM_SRQ_WINDOW=4 SRQSHIM_SQ_DEPTH=8
port=9200
for style in block epoll-lt epoll-et poll select nbconnect; do
	bytes=$((32 << 20)) SRQSHIM_BUF_SIZE=1024
	[ "$style" = block ] && SRQSHIM_BUF_SIZE=8192
	export SRQSHIM_BUF_SIZE
	[ -n "${SRQSHIM_TEST_BYTES:-}" ] && bytes=$SRQSHIM_TEST_BYTES
	port=$((port + 1))
	before=$(rdma_pkts)
	"${SERVED[@]}" "$BUILD/tests/stream_check" server "$ADDR" $port "$style" $bytes > "$WORK/server.log" 2>&1 &
	spid=$!
	wait_listen $port
	shimmed timeout 600 "$BUILD/tests/stream_check" client "$ADDR" $port "$style" $bytes \
		> "$WORK/client.log" 2>&1 || { cat "$WORK/client.log" "$WORK/server.log"; fail "$style: client"; }
	wait $spid || { cat "$WORK/server.log"; fail "$style: server"; }
	cat "$WORK/client.log" "$WORK/server.log" | grep -v "listening"
	pkts=$(( $(rdma_pkts) - before ))
	# Both directions at MTU 1024 or less: at least bytes/1024 packets each way.
	[ $pkts -ge $((bytes / 1024)) ] || fail "$style: only $pkts RDMA packets for $bytes bytes"
	for log in "$WORK/client.log" "$WORK/server.log"; do
		for n in $(grep -o 'tcp_bytes_[a-z]*=[0-9]*' "$log" | cut -d= -f2); do
			[ "$n" -lt 4096 ] || fail "$style: the TCP connection carried $n bytes"
		done
	done
	grep -qi "error" "$WORK/client.log" "$WORK/server.log" && fail "$style: errors logged"
	same_streams "$WORK/client.log" "$WORK/server.log"
	pass "$style: $bytes bytes each way over RDMA ($pkts packets sent by $DEV)"
done
