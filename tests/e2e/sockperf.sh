#!/usr/bin/env bash
# Acceptance 3: sockperf ping-pong and throughput, both preloaded, over RDMA.
. "$(dirname "$0")/lib.sh"
need_rdma

port=11200
"${SERVED[@]}" sockperf server --tcp -i "$ADDR" -p $port > "$WORK/server.log" 2>&1 &
wait_listen $port
for mode in ping-pong throughput; do
	before=$(rdma_pkts)
	"${SHIMMED[@]}" sockperf $mode --tcp -i "$ADDR" -p $port -m 64 -t 3 > "$WORK/$mode.log" 2>&1 &
	cpid=$!
	sleep 2
	ss -Htin "( dport = :$port )" > "$WORK/ss.txt"
	wait $cpid || { cat "$WORK/$mode.log"; fail "sockperf $mode"; }
	grep -E "Summary|percentile 50.000|percentile 99.000" "$WORK/$mode.log" || true
	grep -q "Summary" "$WORK/$mode.log" || { cat "$WORK/$mode.log"; fail "$mode: no summary"; }
	grep -qi "error" "$WORK/$mode.log" && { cat "$WORK/$mode.log"; fail "$mode: errors"; }
	for n in $(grep -o 'bytes_\(acked\|received\):[0-9]*' "$WORK/ss.txt" | cut -d: -f2); do
		[ "$n" -lt 4096 ] || fail "$mode: the TCP connection carried $n bytes"
	done
	grep -q ESTAB "$WORK/ss.txt" || fail "$mode: no connection seen while it ran"
	pkts=$(( $(rdma_pkts) - before ))
	[ $pkts -gt 1000 ] || fail "$mode: only $pkts RDMA packets"
	pass "sockperf $mode over RDMA ($pkts packets)"
done
