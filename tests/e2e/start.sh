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

pkts=$(($(rdma_pkts) - pkts0))
[ $pkts -eq 0 ] || fail "the device sent $pkts packets for connections that start on TCP"
pass "no RDMA packet sent"
