#!/usr/bin/env bash
# Reliability: 128 MiB each way at once (SRQSHIM_BULK_BYTES; 1 GiB until
# 2026-12-04, 256 MiB until 2026-12-06, cut for the suite's time: over 128
# MiB a run in srq mode still meets hundreds of RNR NAKs and thousands of
# hard credit requests) through one upgraded connection per
# mode, random write and read sizes, through a receive pool small enough that
# the sender meets RNR retries (srq: a pool of 8 blocks, at most 16, against a
# send window of 16) and runs out of credits (both modes: hard credit
# requests). Every byte is checked against the sender's generator, and the
# SHA-256 of what each end sent must equal the SHA-256 of what the other end
# received. (In rq mode data never meets RNR, the window being the posted
# receives; control messages may, between a control receive's completion
# and its repost (transport/credit.h), so RNR is required in srq mode only.)
. "$(dirname "$0")/lib.sh"
need_rdma

bytes=${SRQSHIM_BULK_BYTES:-$((1 << 27))}

port=9500
for mode in srq rq; do
	port=$((port + 1))
	if [ $mode = srq ]; then
		small=(SRQSHIM_SRQ_POOL=8 SRQSHIM_SRQ_POOL_MAX=16)
	else
		small=(SRQSHIM_RQ_DEPTH=4)
	fi
	run=(env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode SRQSHIM_LOG_LEVEL=info "${small[@]}")
	r0=$(rnr) p0=$(rdma_pkts) t0=$(date +%s)
	"${run[@]}" "$BUILD/tests/stream_check" server "$ADDR" $port block $bytes > "$WORK/server.log" 2>&1 &
	spid=$!
	wait_listen $port
	"${run[@]}" timeout 1200 "$BUILD/tests/stream_check" client "$ADDR" $port block $bytes \
		> "$WORK/client.log" 2>&1 &
	cpid=$!
	# While it streams: the server's status shows the connection on RDMA, with a peer in this mode.
	up=0
	for _ in $(seq 1 100); do
		up=$(upgraded_now $spid $mode)
		[ "$up" -ge 1 ] || ! alive $cpid && break
		sleep 0.2
	done
	# Hard credit requests, from the server's status while it streams (until one is seen;
	# the "connection done" lines, logged when a socket is freed, may miss a process that
	# exits first).
	seen=0
	while alive $cpid && [ "$seen" -eq 0 ]; do
		seen=$(status_of $spid "sum(c['requests_sent'] + c['requests_received'] for c in p['connections'])" \
			2> /dev/null || true)
		[[ $seen =~ ^[0-9]+$ ]] || seen=0
		sleep 1
	done
	wait $cpid || { cat "$WORK/client.log" "$WORK/server.log"; fail "$mode: client"; }
	[ "$up" -eq 1 ] || fail "$mode: srqshim-ctl showed $up upgraded connections with a $mode peer on the server (1 expected)"
	wait $spid || { cat "$WORK/server.log"; fail "$mode: server"; }
	secs=$(( $(date +%s) - t0 )) rnrs=$(( $(rnr) - r0 )) pkts=$(( $(rdma_pkts) - p0 ))
	grep "stream_check:\|connection done" "$WORK/client.log" "$WORK/server.log" | grep -v listening
	grep -qi "error" "$WORK/client.log" "$WORK/server.log" && fail "$mode: errors logged"
	same_streams "$WORK/client.log" "$WORK/server.log"
	[ $pkts -ge $((2 * bytes / 8192)) ] || fail "$mode: only $pkts RDMA packets for $bytes bytes each way"
	reqs=$(( $(requests "$WORK/client.log") + $(requests "$WORK/server.log") ))
	[ $reqs -ge $seen ] || reqs=$seen
	[ $reqs -gt 0 ] || fail "$mode: no hard credit request happened (the window was not small enough)"
	[ $mode = rq ] || [ $rnrs -gt 0 ] || fail "$mode: no RNR retry happened (the pool was not small enough)"
	pass "$mode: $bytes bytes each way in $secs s, SHA-256 equal both ways; $rnrs RNR NAKs, $reqs hard credit requests, $pkts RDMA packets"
done
