#!/usr/bin/env bash
# Acceptance 4: every readiness style, random data both ways at once through
# one upgraded connection with a receive window small enough that credits run
# out all the time, then half-close; byte-exact, over RDMA (rxe packets move,
# the TCP connection carries only the handshake).
. "$(dirname "$0")/lib.sh"
need_rdma

# A receive window of 4 buffers (private RQ) or a send window of 4 (SRQ): credits run dry constantly. The blocking
# style uses 8 KiB buffers, the others 1 KiB buffers 16 MiB each way per style (32 MiB until
# 2026-12-06, cut for the suite's time; bulk.sh moves 128 MiB each way).
# block-late and block-swap: the blocking style again, with the server's
# writer thread deciding the connection while its reader waits for the
# client's first bytes (io_wait_first_bytes, docs/design.md): block-late makes
# the reader look at the state, then sleep 300 ms, so that its wait begins on
# the socketpair end put on the fd meanwhile; block-swap makes it sleep 100 ms
# while the writer, the HELLO taken, sleeps 300 ms before it puts the socketpair
# on the fd, so that the reader's wait begins on the TCP socket and the fd
# changes under it.
export SRQSHIM_RQ_DEPTH=4 SRQSHIM_SRQ_WINDOW=4 SRQSHIM_SQ_DEPTH=8
port=9200
# SRQSHIM_STREAM_STYLES: a subset to run (all by default).
for style in ${SRQSHIM_STREAM_STYLES:-block block-late block-swap epoll-lt epoll-et poll select nbconnect}; do
	bytes=$((16 << 20)) SRQSHIM_BUF_SIZE=1024 delays= tmo=600 name=$style
	case $style in
	block-late) delays=first-read=300 ;;
	block-swap) delays=first-read=100,server-pair=300 ;;
	esac
	[ -n "$delays" ] && style=block bytes=$((1 << 20)) tmo=60
	[ "$style" = block ] && SRQSHIM_BUF_SIZE=8192
	export SRQSHIM_BUF_SIZE
	[ -n "${SRQSHIM_TEST_BYTES:-}" ] && [ -z "$delays" ] && bytes=$SRQSHIM_TEST_BYTES
	port=$((port + 1))
	before=$(rdma_pkts)
	SRQSHIM_TEST_DELAYS=$delays "${SERVED[@]}" "$BUILD/tests/stream_check" server "$ADDR" $port "$style" $bytes \
		> "$WORK/server.log" 2>&1 &
	spid=$!
	wait_listen $port
	shimmed timeout $tmo "$BUILD/tests/stream_check" client "$ADDR" $port "$style" $bytes \
		> "$WORK/client.log" 2>&1 || { cat "$WORK/client.log" "$WORK/server.log"; fail "$name: client"; }
	wait $spid || { cat "$WORK/server.log"; fail "$name: server"; }
	cat "$WORK/client.log" "$WORK/server.log" | grep -v "listening"
	pkts=$(( $(rdma_pkts) - before ))
	# Both directions at MTU 1024 or less: at least bytes/1024 packets each way.
	[ $pkts -ge $((bytes / 1024)) ] || fail "$name: only $pkts RDMA packets for $bytes bytes"
	for log in "$WORK/client.log" "$WORK/server.log"; do
		for n in $(grep -o 'tcp_bytes_[a-z]*=[0-9]*' "$log" | cut -d= -f2); do
			[ "$n" -lt 4096 ] || fail "$name: the TCP connection carried $n bytes"
		done
	done
	grep -qi "error" "$WORK/client.log" "$WORK/server.log" && fail "$name: errors logged"
	same_streams "$WORK/client.log" "$WORK/server.log"
	pass "$name: $bytes bytes each way over RDMA ($pkts packets sent by $DEV)"
done
