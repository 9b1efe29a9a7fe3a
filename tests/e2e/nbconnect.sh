#!/usr/bin/env bash
# Non-blocking connect against kernel TCP (issue 11): nbconnect_check's
# scenarios (a listener that accepts, a refused port, a destination that
# never answers with TCP_SYNCNT 1, an event loop that connects to itself,
# shutdown while the connect runs, and while it ends: shut-race),
# each waited for in epoll, poll and select style, over kernel TCP, then
# under the shim in each mode; every observation must be what TCP gave, and
# the loop's connections to itself must have been upgraded.
. "$(dirname "$0")/lib.sh"
need_rdma

NC=$BUILD/tests/nbconnect_check
DEAD=192.0.2.99 # on dummy0: its packets go nowhere
port=9850

CTL=$BUILD/tools/srqshim-ctl

# ends SNAPSHOT PORT MODE: "N M": the connections to or from $ADDR:PORT the
# snapshot shows, and how many of them are upgraded with a peer in MODE.
ends() {
	snap_of "$1" "'%d %d' % (len(cs := [c for c in p['connections'] if sys.argv[2] in (c['local'], c['peer'])]), sum(c['state'] == 'upgraded' and c['peer_mode'] == sys.argv[3] for c in cs))" "$ADDR:$2" "$3"
}

timeout 300 "$NC" "$ADDR" $port $DEAD > "$WORK/tcp.txt" || { cat "$WORK/tcp.txt"; fail "over TCP"; }
for mode in srq rq; do
	port=$((port + 10))
	env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode CHECK_STATUS="$WORK/$mode" CHECK_CTL="$CTL" \
		timeout 300 "$NC" "$ADDR" $port $DEAD > "$WORK/$mode.txt" 2> "$WORK/$mode.log" ||
		{ cat "$WORK/$mode.txt" "$WORK/$mode.log"; fail "$mode: nbconnect_check failed"; }
	diff -u "$WORK/tcp.txt" "$WORK/$mode.txt" ||
		fail "$mode: non-blocking connect showed other than over TCP (- TCP, + shim)"
	# In each style: ok's pair on PORT, self's 3 pairs on PORT+2+style, all upgraded.
	ups=0 st=0
	for style in epoll poll select; do
		got=$(ends "$WORK/$mode.ok-$style" $port $mode)
		[ "$got" = "2 2" ] || fail "$mode: ok $style: $got (connections, upgraded), want 2 2"
		ups=$((ups + ${got#* }))
		got=$(ends "$WORK/$mode.self-$style" $((port + 2 + st)) $mode)
		[ "$got" = "6 6" ] || fail "$mode: self $style: $got (connections, upgraded), want 6 6"
		ups=$((ups + ${got#* })) st=$((st + 1))
	done
	pass "$mode: $(wc -l < "$WORK/tcp.txt") observations as over kernel TCP, $ups ends upgraded (the loop that connects to itself included)"
done

# Connections that start on TCP (SRQSHIM_START=tcp): the same observations,
# and every end (the loop's connections to itself included) on TCP because
# the server said LATER.
port=$((port + 10))
env LD_PRELOAD="$PRELOAD" SRQSHIM_START=tcp SRQSHIM_MOVE_AFTER_MS=86400000 CHECK_STATUS="$WORK/late" CHECK_CTL="$CTL" \
	timeout 300 "$NC" "$ADDR" $port $DEAD > "$WORK/late.txt" 2> "$WORK/late.log" ||
	{ cat "$WORK/late.txt" "$WORK/late.log"; fail "start on TCP: nbconnect_check failed"; }
diff -u "$WORK/tcp.txt" "$WORK/late.txt" ||
	fail "start on TCP: non-blocking connect showed other than over TCP (- TCP, + shim)"
st=0
for style in epoll poll select; do
	for what in "ok $port 2" "self $((port + 2 + st)) 6"; do
		set -- $what
		got=$(snap_of "$WORK/late.$1-$style" "'%d %d' % (len(cs := [c for c in p['connections'] if sys.argv[2] in (c['local'], c['peer'])]), sum(c['state'] == 'tcp' and c['reason'] == 'started-on-tcp' for c in cs))" "$ADDR:$2")
		[ "$got" = "$3 $3" ] || fail "start on TCP: $1 $style: $got (connections, started on TCP), want $3 $3"
	done
	st=$((st + 1))
done
pass "start on TCP: $(wc -l < "$WORK/tcp.txt") observations as over kernel TCP, every end started on TCP"

# shut-race: a shutdown that finds the connect running, the connect ending
# before it shuts (SRQSHIM_TEST_DELAYS=shut-connect holds the shim between
# its look and the shutdown): the shutdown applies to the connection, as
# TCP's when it comes after the connect (AT_MS 1500 over TCP), and no HELLO
# goes on it. In each mode, and starting on TCP. Then shut-race-held.
port=$((port + 10))
timeout 120 "$NC" "$ADDR" $port $DEAD shut-race 1500 > "$WORK/race-tcp.txt" ||
	{ cat "$WORK/race-tcp.txt"; fail "shut-race over TCP"; }
grep -q "shut-race epoll: SO_ERROR 0" "$WORK/race-tcp.txt" ||
	{ cat "$WORK/race-tcp.txt"; fail "shut-race over TCP: the connect had not ended at 1.5 s"; }
for how in srq rq tcp; do
	port=$((port + 10))
	if [ $how = tcp ]; then set -- SRQSHIM_START=tcp SRQSHIM_MOVE_AFTER_MS=86400000; else set -- SRQSHIM_MODE=$how; fi
	env LD_PRELOAD="$PRELOAD" "$@" SRQSHIM_TEST_DELAYS=shut-connect=1000 \
		timeout 120 "$NC" "$ADDR" $port $DEAD shut-race 500 > "$WORK/race-$how.txt" ||
		{ cat "$WORK/race-$how.txt"; fail "shut-race ($*) failed"; }
	diff -u "$WORK/race-tcp.txt" "$WORK/race-$how.txt" ||
		fail "shut-race ($*): the shutdown after the connect ended showed other than over TCP (- TCP, + shim)"
done
pass "shut-race: a connect that ends between the shim's look and its shutdown is shut as over TCP (srq, rq, starting on TCP)"

# shut-race-held: the same race with 5 bytes written before the shutdown
# (held by the shim; TCP's write says EAGAIN then, so there is no TCP
# transcript): in each style the bytes reach the server, or the connection
# fails where the application sees it (ECONNRESET); never an end without them.
# Starting on TCP only: in srq and rq mode a write while TCP connects says
# EAGAIN, as TCP's, so nothing is held there.
port=$((port + 10))
env LD_PRELOAD="$PRELOAD" SRQSHIM_START=tcp SRQSHIM_MOVE_AFTER_MS=86400000 SRQSHIM_TEST_DELAYS=shut-connect=1000 \
	timeout 120 "$NC" "$ADDR" $port $DEAD shut-race-held 500 > "$WORK/held.txt" ||
	{ cat "$WORK/held.txt"; fail "shut-race-held failed"; }
for style in epoll poll select; do
	grep -q "^shut-race-held $style: the server got 'hello'$" "$WORK/held.txt" ||
		grep -q "^shut-race-held $style: the client's SO_ERROR ECONNRESET$" "$WORK/held.txt" ||
		{ cat "$WORK/held.txt"; fail "shut-race-held ($style): the held bytes were lost without an error"; }
done
pass "shut-race-held: bytes held during a connect that ends before its shutdown fail visibly (starting on TCP)"
