#!/usr/bin/env bash
# A connection that changes hands mid-stream (docs/protocol.md, section 4):
# the server echoes the first quarter of the client's stream itself, then
# execs a program that inherits the connection (CGI-style), forks a child
# that puts it on its stdin and stdout and execs a handler (inetd: the
# parent closes its copy before that exec, or only after the handler is
# done: inetd-open; inetd-shut: the server echoes all of a 64 KiB stream
# up to its end first, the handler finds the end on TCP), posix_spawns a handler with the connection dup2'd onto
# its stdin and stdout by the file actions (spawn), goes on with io_uring
# (uring: its reads and writes pass libc by), forks a child that holds it without using it and
# exits after the server's close (fork: the end of stream comes with the
# child's exit, as TCP's; no move), passes it to another process with SCM_RIGHTS (sendmsg, or sendmmsg:
# passm), or hands it to stdio; the new owner echoes the rest. Or it
# echoes the rest with dprintf, which stays on RDMA. Bytes are in flight
# both ways at that moment.
# Each case runs over kernel TCP first, then under the shim in both modes:
# the client checks every echoed byte; under the shim the first quarter
# went over RDMA and the rest over TCP. Then urgent data (MSG_OOB), whose
# observations must be those of kernel TCP.
. "$(dirname "$0")/lib.sh"
need_rdma

bytes=$((16 << 20))
# SRQSHIM_HANDOVER_CASES: a subset to run (all by default).
cases=${SRQSHIM_HANDOVER_CASES:-exec inetd inetd-open inetd-shut spawn uring fork pass passm stdio dprintf oob}
port=9800
HC=$BUILD/tests/handover_check

run_case() { # how, label, server prefix..., --, client prefix...
	local how=$1 label=$2 before spid
	shift 2
	local -a srv=() cli=()
	while [ "$1" != -- ]; do srv+=("$1"); shift; done
	shift
	cli=("$@")
	port=$((port + 1))
	before=$(rdma_pkts)
	"${srv[@]}" "$HC" server "$ADDR" $port $bytes "$how" > "$WORK/server.log" 2>&1 &
	spid=$!
	wait_listen $port
	timeout 300 "${cli[@]}" "$HC" client "$ADDR" $port $bytes > "$WORK/client.log" 2>&1 \
		|| { cat "$WORK/client.log" "$WORK/server.log"; fail "$how ($label): client"; }
	# Whether the server still lived when the client saw the end of its stream.
	ALIVE=0
	kill -0 $spid 2>/dev/null && ALIVE=1
	wait $spid || { cat "$WORK/server.log"; fail "$how ($label): server"; }
	grep -qi "error" "$WORK/client.log" "$WORK/server.log" && { cat "$WORK/client.log" "$WORK/server.log"; fail "$how ($label): errors logged"; }
	PKTS=$(( $(rdma_pkts) - before ))
	TCP_RX=$(sed -n 's/.*tcp_bytes_received=\([0-9]*\).*/\1/p' "$WORK/client.log")
}

# fork: the client's end of stream came with the child's exit (not before
# it, 50 ms of slack for the clocks' reading), while the server lived.
fork_ended_with_child() {
	local eof exit
	eof=$(sed -n 's/.*eof_ms=\([0-9]*\).*/\1/p' "$WORK/client.log")
	exit=$(sed -n 's/.*child_exit_ms=\([0-9]*\).*/\1/p' "$WORK/server.log")
	[ -n "$eof" ] && [ -n "$exit" ] && [ "$eof" -ge $((exit - 50)) ] \
		|| fail "fork ($1): the end of stream came at $eof, the child exited at $exit"
	[ $ALIVE = 1 ] || fail "fork ($1): the end of stream came only with the server's exit"
}

for how in $cases; do
	[ "$how" = oob ] && continue
	# inetd-shut: a short stream, all echoed before the fork.
	bytes=$((16 << 20))
	[ "$how" = inetd-shut ] && bytes=65536
	run_case $how "kernel TCP" env -- env
	[ "$how" != fork ] || fork_ended_with_child "kernel TCP"
	[ "$PKTS" -lt 100 ] || fail "$how: $PKTS RDMA packets without the shim"
	pass "$how over kernel TCP: $bytes bytes echoed and checked"
	for mode in srq rq; do
		run_case $how "$mode" env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode -- \
			env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode
		if [ "$how" = dprintf ] || [ "$how" = fork ] || [ "$how" = inetd-shut ]; then
			# dprintf is formatted in the shim and written through it; a
			# forked child that never execs needs no TCP socket: no move;
			# inetd-shut's handler gets a TCP socket with only the end.
			[ "$PKTS" -ge $((bytes / 4096 * 2)) ] || fail "$how ($mode): only $PKTS RDMA packets"
			[ "$TCP_RX" -lt $((bytes / 64)) ] || fail "$how ($mode): TCP carried $TCP_RX bytes"
			# The end of stream comes with the child's exit, as TCP's.
			[ "$how" != fork ] || fork_ended_with_child $mode
			pass "$how ($mode): $bytes bytes echoed and checked, all over RDMA ($PKTS packets, $TCP_RX bytes over TCP)"
			continue
		fi
		# The first quarter each way over RDMA (4 KiB packets at most), the rest over TCP.
		[ "$PKTS" -ge $((bytes / 4 / 4096 * 2)) ] || fail "$how ($mode): only $PKTS RDMA packets"
		[ "$TCP_RX" -ge $((bytes / 2)) ] || fail "$how ($mode): TCP carried only $TCP_RX bytes"
		pass "$how ($mode): $bytes bytes echoed and checked, $PKTS RDMA packets, $TCP_RX bytes over TCP after the handover"
	done
done

bytes=$((16 << 20))

# The race of a forked child's exec against its parent's answer: a parent
# that acts later (test point handover, 3 s) than the child waits (its
# answer 1 s, then twice SRQSHIM_LINGER_MS = 1 s). The rule
# (docs/protocol.md, section 4): the new program gets a socket that is not
# connected and says so, and no wrong byte reaches the client (its stream
# ends short or is reset, never with a byte that differs).
late_handover() {
	local mode=$1 spid rc
	port=$((port + 1))
	env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode SRQSHIM_LINGER_MS=500 \
		SRQSHIM_TEST_DELAYS=handover=3000 \
		"$HC" server "$ADDR" $port $bytes inetd > "$WORK/server.log" 2>&1 &
	spid=$!
	wait_listen $port
	rc=0
	timeout 120 env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode \
		"$HC" client "$ADDR" $port $bytes > "$WORK/client.log" 2>&1 || rc=$?
	wait $spid || true
	[ $rc != 0 ] && [ $rc != 124 ] || { cat "$WORK/client.log" "$WORK/server.log"; fail "late handover ($mode): client exit status $rc (want a failure, not a hang)"; }
	grep -q "differs" "$WORK/client.log" && { cat "$WORK/client.log"; fail "late handover ($mode): a wrong byte"; }
	# The handler's first read says ENOTCONN (handover_check prints it).
	grep -q "read: Transport endpoint is not connected" "$WORK/server.log" || { cat "$WORK/server.log"; fail "late handover ($mode): the new program's socket is not the unconnected one the rule gives"; }
	pass "late handover ($mode): the child gave up, the client's stream ended short (exit $rc: $(grep -v '^$' "$WORK/client.log" | tail -1)), no wrong byte"
}
case " $cases " in *" inetd "*) for mode in srq rq; do late_handover $mode; done ;; esac

# Urgent data: the same observations as kernel TCP (EINVAL before any, the
# urgent byte apart from the stream, the stream intact).
oob() {
	port=$((port + 1))
	"$@" "$HC" oob-server "$ADDR" $port > "$WORK/oob-server.log" 2>&1 &
	local spid=$!
	wait_listen $port
	timeout 60 "$@" "$HC" oob-client "$ADDR" $port > "$WORK/oob-client.log" 2>&1 \
		|| { cat "$WORK/oob-client.log" "$WORK/oob-server.log"; fail "MSG_OOB: client"; }
	wait $spid || { cat "$WORK/oob-server.log"; fail "MSG_OOB: server"; }
	grep -v listening "$WORK/oob-server.log"
}
case " $cases " in *" oob "*) ;; *) exit 0 ;; esac
want=$(oob env)
echo "$want" | grep -q "urgent 1 '!'" || fail "MSG_OOB over kernel TCP: $want"
for mode in srq rq; do
	got=$(oob env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode)
	[ "$got" = "$want" ] || fail "MSG_OOB ($mode): $got, kernel TCP: $want"
	pass "MSG_OOB ($mode): as kernel TCP: $(echo "$got" | tr '\n' ' ')"
done
