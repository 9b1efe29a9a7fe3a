#!/usr/bin/env bash
# Non-blocking connect against kernel TCP (issue 11): nbconnect_check's
# scenarios (a listener that accepts, a refused port, a destination that
# never answers with TCP_SYNCNT 1, an event loop that connects to itself),
# each waited for in epoll, poll and select style, over kernel TCP, then
# under the shim in each mode; every observation must be what TCP gave, and
# the loop's connections to itself must have been upgraded.
. "$(dirname "$0")/lib.sh"
need_rdma

NC=$BUILD/tests/nbconnect_check
DEAD=192.0.2.99 # on dummy0: its packets go nowhere
port=9850

timeout 300 "$NC" "$ADDR" $port $DEAD > "$WORK/tcp.txt" || { cat "$WORK/tcp.txt"; fail "over TCP"; }
for mode in srq rq; do
	port=$((port + 10))
	env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode SRQSHIM_LOG_LEVEL=info \
		timeout 300 "$NC" "$ADDR" $port $DEAD > "$WORK/$mode.txt" 2> "$WORK/$mode.log" ||
		{ cat "$WORK/$mode.txt" "$WORK/$mode.log"; fail "$mode: nbconnect_check failed"; }
	diff -u "$WORK/tcp.txt" "$WORK/$mode.txt" ||
		fail "$mode: non-blocking connect showed other than over TCP (- TCP, + shim)"
	# ok (1 pair) and self (3 pairs) in each of 3 styles: 24 ends upgraded.
	ups=$(grep -c "upgraded (peer $mode)" "$WORK/$mode.log" || true)
	[ "$ups" -ge 24 ] || { cat "$WORK/$mode.log"; fail "$mode: only $ups ends upgraded, 24 expected"; }
	pass "$mode: $(wc -l < "$WORK/tcp.txt") observations as over kernel TCP, $ups ends upgraded (the loop that connects to itself included)"
done
