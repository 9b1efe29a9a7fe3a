#!/usr/bin/env bash
# The differential test of readiness (docs/design.md, "Readiness"):
# wait_check's scenarios (epoll level and edge triggered, one-shot, MOD,
# shutdown, SHUT_RD and reset, maxevents below the ready count, two instances,
# close and dup while registered, a dup of the epoll fd (also with its first
# number closed and taken by a new instance, and made with the last free fd),
# timeouts,
# signals, poll, select, a sleeping thread, a connection upgraded while
# a thread sleeps on it, a poller cancelled asleep,
# fork) run over kernel TCP,
# then under the shim in each mode; every wait call must return what it
# returned over TCP. poll-swap and poll-swap-mixed run again alone with the
# server's upgrade delayed (SRQSHIM_TEST_DELAYS=server-pair=300), so that
# their poll begins between the HELLO's taking and the upgrade.
. "$(dirname "$0")/lib.sh"
need_rdma

WC=$BUILD/tests/wait_check
CTL=$BUILD/tools/srqshim-ctl
port=9700

# Both connections of the status in $1 upgraded in mode $2.
both_upgraded() {
	python3 - "$1" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
conns = [c for p in d["processes"] for c in p["connections"]]
ok = len(conns) == 2 and all(c["state"] == "upgraded" and c["mode"] == sys.argv[2] for c in conns)
sys.exit(0 if ok else 1)
PY
}

timeout 300 "$WC" "$ADDR" $port > "$WORK/tcp.txt" || { cat "$WORK/tcp.txt"; fail "over TCP"; }
port=$((port + 1))
timeout 60 "$WC" "$ADDR" $port poll-swap poll-swap-mixed > "$WORK/tcp-swap.txt" || fail "poll-swap over TCP"
for mode in srq rq; do
	port=$((port + 1))
	rm -f "$WORK/st"
	env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode WC_STATUS="$WORK/st" WC_CTL="$CTL" \
		timeout 300 "$WC" "$ADDR" $port > "$WORK/$mode.txt" ||
		{ cat "$WORK/$mode.txt"; fail "$mode: wait_check failed"; }
	both_upgraded "$WORK/st" $mode || { cat "$WORK/st"; fail "$mode: the pair was not upgraded"; }
	if ! diff -u "$WORK/tcp.txt" "$WORK/$mode.txt"; then
		fail "$mode: wait calls returned other than over TCP (- TCP, + shim)"
	fi
	pass "$mode: $(grep -c '^ ' "$WORK/tcp.txt") observations in $(grep -c '^[a-z]' "$WORK/tcp.txt") scenarios as over TCP"

	port=$((port + 1))
	rm -f "$WORK/st"
	env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode WC_STATUS="$WORK/st" WC_CTL="$CTL" \
		SRQSHIM_TEST_DELAYS=server-pair=300 \
		timeout 60 "$WC" "$ADDR" $port poll-swap poll-swap-mixed > "$WORK/$mode-swap.txt" ||
		{ cat "$WORK/$mode-swap.txt"; fail "$mode: poll-swap failed"; }
	both_upgraded "$WORK/st" $mode || { cat "$WORK/st"; fail "$mode: poll-swap's pair was not upgraded"; }
	diff -u "$WORK/tcp-swap.txt" "$WORK/$mode-swap.txt" ||
		fail "$mode: poll-swap (the upgrade delayed) returned other than over TCP (- TCP, + shim)"
	pass "$mode: a poll begun while another thread upgrades the socket ends as over TCP"
done
