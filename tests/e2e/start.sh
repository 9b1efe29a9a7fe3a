#!/usr/bin/env bash
# Connections that start on TCP (SRQSHIM_START=tcp at the client; issue 11):
# the client's HELLO asks for LATER, the server answers it wherever it sees
# the HELLO first (accept, its progress thread, its first I/O), and both
# ends stay on TCP with no QP and no socketpair. Every scenario runs over
# kernel TCP first, then under the shim (lib.sh, hs_scenario), with the
# races of a HELLO that is late, an answer that is late, and a server that
# turns out plain forced by delays; and the device sends no packet for them.
. "$(dirname "$0")/lib.sh"
need_rdma

HS=$BUILD/tests/hs_check
CTL=$BUILD/tools/srqshim-ctl
export SRQSHIM_HELLO_TIMEOUT_MS=300 SRQSHIM_ACKED_TIMEOUT_MS=1500 SRQSHIM_SERVER_WAIT_MS=200
# The start alone: these connections never move to RDMA (the move is move.sh's). Not -1:
# a client that may never move sends no HELLO, and a server that may never move declines.
export SRQSHIM_MOVE_AFTER_MS=86400000
BYTES=200000
port=9700
S=SRQSHIM_START=tcp
L=tcp:started-on-tcp
pkts0=$(rdma_pkts)

# One process: a server thread that waits for the client's connect() to return before its
# first I/O: the server's accept (or its progress thread) answers.
port=$((port + 1))
"${SERVED[@]}" $S CHECK_STATUS="$WORK/st" CHECK_CTL="$CTL" timeout 60 "$HS" same "$ADDR" $port $BYTES \
	|| fail "same process"
[ "$(outcome "$WORK/st.server")" = "$L $L" ] || fail "same process: $(outcome "$WORK/st.server")"
pass "same process, server waits for the client's connect(): both ends started on TCP"

hs_scenario "prompt server" $L $L server - "0" "$S" ""
hs_scenario "prompt server, non-blocking client" $L $L server - "0" "$S" "nb"
# The server's application does its first I/O late: LATER still comes at once.
hs_scenario "first I/O after the HELLO timeout" $L $L server - "500" "$S" ""
hs_scenario "first I/O after the HELLO timeout, non-blocking" $L $L server - "500" "$S" "nb"
# The same with the HELLO 100 ms after the connect, so that the server has
# accepted before it is there: LATER comes from the server's progress
# thread, at its nudge.
hs_scenario "HELLO after the accept, first I/O after the HELLO timeout" $L $L server - "500" \
	"$S SRQSHIM_TEST_DELAYS=client-hello=100" ""
hs_scenario "server writes first, HELLO in time" $L $L server - "0 greet" "$S" "greet"
# A non-blocking client that waits in poll for the greeting makes no call
# that could send its HELLO: the progress thread's nudge sends it, within
# the server's wait for it.
hs_scenario "server writes first, non-blocking client waits for it" $L $L server \
	- "0 greet" "$S" "nb greet"
# The HELLO comes after the server's first write gave up waiting for it: the
# client finds the greeting where LATER should be, resets that connection and
# connects plain; the greeting comes again on the new one.
hs_scenario "HELLO after the server wrote first" tcp:peer-plain tcp:peer-plain server \
	- "0 greet" "$S SRQSHIM_TEST_DELAYS=client-hello=600" "greet"
# LATER comes after the client's HELLO timeout: the client resets that
# connection and connects plain, its held bytes first on the new one.
hs_scenario "LATER after the HELLO timeout" tcp:peer-plain tcp:peer-plain server \
	"SRQSHIM_TEST_DELAYS=server-ack=800" "0" "$S" ""
hs_scenario "accept after the HELLO timeout" tcp:peer-plain tcp:peer-plain late-accept - "600" "$S" ""

# Programs that make no call the shim could use, each over kernel TCP then
# under the shim (start_check.py): their lines and the payloads their
# server received (a reset probe that carried a HELLO left out) must be the
# same. start_case CASE SERVER_MODE SERVER_ENV CLIENT_ENV; SERVER_ENV "-":
# a plain server (the client then resets its probe and connects again).
SC=$(dirname "$0")/start_check.py
# Each connection's line comes at its end (the server prints it, then
# closes): waits until no connection to port $1 is open on the server's side,
# accepted or queued (5 s at most; a line still missing then fails the
# comparison).
server_settle() {
	local queued
	for _ in $(seq 1 100); do
		queued=$(ss -Hltn "sport = :$1" | awk '{print $2}')
		# (No listener: a server that exec'd.)
		[ -z "$(ss -Htn state established state syn-recv state close-wait "sport = :$1")" ] &&
			[ "${queued:-0}" = 0 ] && return 0
		sleep 0.05
	done
}
start_case() {
	local c=$1 smode=$2 senv=$3 cenv=$4 how spid
	for how in tcp shim; do
		port=$((port + 1))
		pre_s=(env); pre_c=(env)
		if [ $how = shim ]; then
			[ "$senv" = - ] || pre_s=("${SERVED[@]}" $senv)
			pre_c=("${SHIMMED[@]}" $S $cenv)
		fi
		"${pre_s[@]}" "${PYTHON[@]}" "$SC" server "$ADDR" $port $smode > "$WORK/sc.$how.srv" 2>&1 &
		spid=$!
		wait_listen $port
		"${pre_c[@]}" timeout 60 "${PYTHON[@]}" "$SC" $c "$ADDR" $port > "$WORK/sc.$how.cli" 2>&1 ||
			{ cat "$WORK/sc.$how.cli"; fail "$c ($how): the client failed"; }
		server_settle $port
		# (A server that exec'd has ended by itself.)
		kill $spid 2>/dev/null || true; wait $spid 2>/dev/null || true
		grep -v "<probe>" "$WORK/sc.$how.srv" | sed 's/^conn [0-9]*: //' | sort > "$WORK/sc.$how.got"
	done
	diff -u <(cat "$WORK/sc.tcp.cli" "$WORK/sc.tcp.got") <(cat "$WORK/sc.shim.cli" "$WORK/sc.shim.got") ||
		fail "$c: other than over TCP (- TCP, + shim)"
	pass "$c: as over TCP: $(tr '\n' ' ' < "$WORK/sc.shim.cli")"
}
# close() before the answer, to a plain server: close returns at once, the
# bytes come on the connection made again (the progress thread's work).
start_case close silent - ""
# An event loop waits in poll for the reply of a plain server: the HELLO
# wait ends (the nudge does not replace the deadline), the connection is
# made again under the poll (which waits in slices), and the reply comes.
start_case poll reply - ""
# fork() right after connect: the child's bytes, then an exec'd program's,
# after what the parent's negotiation held.
start_case fork silent "" ""
# An edge-triggered writer of 200 KiB before the answer (LATER 500 ms late):
# the hold takes it as a socket buffer would; no EAGAIN while writable.
start_case et silent "SRQSHIM_TEST_DELAYS=server-ack=500" "SRQSHIM_HELLO_TIMEOUT_MS=3000"
# shutdown(SHUT_RD) before the answer: reads see the end at once, and after
# the answer too (the shutdown is applied to TCP once the answer is off it).
start_case shutrd silent "" ""
# The same to a plain server: the shutdown is held through the connection
# made again, and applied to it.
start_case shutrd silent - ""
# A server that shuts its reading right after accept, before the HELLO
# (100 ms late) is there: the shutdown decides the connection as a write
# does (here LATER, within the server's wait), so the HELLO never reaches
# the application and the end the server's reads find is its own.
start_case ping shutrd "" "SRQSHIM_TEST_DELAYS=client-hello=100"
# The same with the HELLO 400 ms late, after the server's wait: the shutdown
# makes it plain, and the late HELLO is taken off the stream by a read
# although the kernel's read gives the end (its own SHUT_RD's, not the
# client's FIN); the client gets DECLINE and its bytes follow on TCP.
start_case ping shutrd "" "SRQSHIM_TEST_DELAYS=client-hello=400"
# The same shutting its writing: the client reads the end, then its bytes
# reach the server.
start_case endfirst shutwr "" ""
# A plain client (never a HELLO): the server's read waits for the first
# bytes (unlocked), another thread's write goes out meanwhile, and its
# shutdown ends the read.
start_case readall greet-shut "" "SRQSHIM_MODE=tcp"
# A plain client whose first byte is the first of a handshake message: the
# server's blocking read gets it (part of a message for a second is the
# peer's own bytes), never EAGAIN.
start_case nul greet "" "SRQSHIM_MODE=tcp"
# A plain client whose whole first message is the first byte of a handshake
# message, and which then waits for the reply: the server's blocking read
# gets that byte once it has waited a second for more (a message is sent
# whole), not never.
start_case nulwait first "" "SRQSHIM_MODE=tcp"
# The error queue of a connection on TCP that may move (a MSG_ZEROCOPY
# send's completion): the kernel's, as TCP's; no stream byte is read for it.
start_case errqueue reply "" ""
# SO_RCVLOWAT above what is there: a blocking read of fewer bytes returns
# them at once, as TCP's (a connection on TCP that may move: its blocking
# reads look before they wait once the application set a low mark).
start_case lowat greet "" ""
# shutdown(SHUT_RD) shows at once in a wait, as TCP's, before the answer
# (LATER 500 ms late): the kernel's end of our own SHUT_RD, which the
# answer's read does not take for the server's.
start_case shutrd-poll silent "SRQSHIM_TEST_DELAYS=server-ack=500" "SRQSHIM_HELLO_TIMEOUT_MS=3000"
# The server resets while held bytes are still going to TCP (LATER 300 ms
# late, 1 MiB held): the error our send took is the application's, after
# the server's greeting that came before it.
start_case reset reset "SRQSHIM_TEST_DELAYS=server-ack=300" "SRQSHIM_HELLO_TIMEOUT_MS=3000"
# The same with the progress thread held up: the application's own write
# sends what is held and takes the error, which is that write's (no SIGPIPE).
start_case reset-write reset "SRQSHIM_TEST_DELAYS=server-ack=200" \
	"SRQSHIM_HELLO_TIMEOUT_MS=3000 SRQSHIM_TEST_DELAYS=client-look=5000"
# FIONREAD with the answer in but not taken (the progress thread held up):
# the answer's bytes are not the application's.
start_case fionread reply "" "SRQSHIM_TEST_DELAYS=client-look=400"
# A non-blocking read takes the answer itself (the progress thread held
# up): the greeting behind it is that read's.
start_case nbread greet "" "SRQSHIM_TEST_DELAYS=client-look=400"
# A blocking read shut for reading with the answer and the greeting in,
# before any look took the answer (the progress thread held up): the
# greeting is that read's, as TCP gives what was queued before its end.
start_case shutrd-late greet "" "SRQSHIM_TEST_DELAYS=client-look=400"

pkts=$(($(rdma_pkts) - pkts0))
[ $pkts -eq 0 ] || fail "the device sent $pkts packets for connections that start on TCP"
pass "no RDMA packet sent"

# After the check above (this client may move and send RDMA packets): the
# client moves at once (its mark right behind its request) while the
# server answers and closes before any look found that mark: the close
# passes it (an unread urgent byte makes a close a reset, and the client
# would lose the reply it had taken); the client reads the reply late.
start_case ping-late answer-close "" "SRQSHIM_MOVE_AFTER_MS=0 SRQSHIM_MOVE_AFTER_CALLS=1"
# Shuts of connections that upgrade (not started on TCP): after the check above.
# The server's shutdown(SHUT_RD) before the HELLO, as above: an upgrade.
upgraded_case() {
	local pkts0
	pkts0=$(rdma_pkts)
	start_case "$@"
	[ $(($(rdma_pkts) - pkts0)) -gt 0 ] || fail "$1 ($2): no RDMA packet sent: not upgraded"
}
upgraded_case ping shutrd "" "SRQSHIM_START=rdma SRQSHIM_TEST_DELAYS=client-hello=100"
# Its shutdown(SHUT_WR): the client reads the end over RDMA.
upgraded_case endfirst shutwr "" "SRQSHIM_START=rdma"
# The HELLO after the server's wait: plain, the HELLO taken off, as above.
start_case ping shutrd "" "SRQSHIM_START=rdma SRQSHIM_TEST_DELAYS=client-hello=400"
# A client shut for reading declines an ACCEPT that comes after its acked
# wait: the ACCEPT, 0.5 s later, is taken off the stream though the
# kernel's read of it now gives the end (our own SHUT_RD's, not the peer's).
start_case shutrd silent "SRQSHIM_TEST_DELAYS=server-accept=800" \
	"SRQSHIM_START=rdma SRQSHIM_ACKED_TIMEOUT_MS=300"
# SO_ZEROCOPY: the completions of MSG_ZEROCOPY sends come on the error
# queue, which an RDMA stream never gives, so such a connection is on TCP.
# An upgraded client that sets it moves back first (RDMA packets before).
start_case errqueue reply "" "SRQSHIM_START=rdma"
# Set before the connect (never upgraded), or on the listener (what it
# accepts declines the upgrade): no RDMA packet.
tcp_case() {
	local pkts0
	pkts0=$(rdma_pkts)
	start_case "$@"
	[ $(($(rdma_pkts) - pkts0)) -eq 0 ] || fail "$1 ($2): RDMA packets sent: upgraded"
}
tcp_case errqueue-first reply "" "SRQSHIM_START=rdma"
# Set right after a connect whose HELLO's answer is still on its way (the
# ACCEPT 300 ms late): the option waits for it and declines it.
tcp_case errqueue-now reply "SRQSHIM_TEST_DELAYS=server-accept=300" "SRQSHIM_START=rdma"
# Set while a non-blocking connect is under way: it sends no HELLO.
tcp_case errqueue-nb reply "" "SRQSHIM_START=rdma"
tcp_case ping zc "" "SRQSHIM_START=rdma"
# A blocking read with MSG_WAITALL gets all it asks for, as TCP's, when a
# move ends within it: the server starts the move after its first half (its
# second call), so the client's read takes that half on TCP and the rest on
# RDMA.
upgraded_case waitall halves "SRQSHIM_MOVE_AFTER_MS=0 SRQSHIM_MOVE_AFTER_CALLS=2" ""
# The reverse: an upgraded connection moves back to TCP within the read (the
# server's exec, whose program writes the second half).
upgraded_case waitall halves-exec "" "SRQSHIM_START=rdma"
