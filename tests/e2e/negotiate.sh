#!/usr/bin/env bash
# The negotiation's races (docs/protocol.md, "Rules"), each forced with
# delays on one side: every scenario runs over kernel TCP first (the bytes
# must come through there too), then under the shim, where the bytes must
# be the same and each side's outcome (from srqshim-ctl status --json,
# taken while its connection is open) must be what the rules say.
. "$(dirname "$0")/lib.sh"
need_rdma

HS=$BUILD/tests/hs_check
CTL=$BUILD/tools/srqshim-ctl
# Short waits, so that the races happen within a test's time; each forced
# delay is at least 200 ms (HELLO) or 500 ms (acknowledged wait) away from
# the timeout it races, since a loaded two-vCPU guest takes a few hundred
# milliseconds to make a queue pair at times.
export SRQSHIM_HELLO_TIMEOUT_MS=300 SRQSHIM_ACKED_TIMEOUT_MS=1500 SRQSHIM_SERVER_WAIT_MS=200
BYTES=200000
port=9500

# The issue's case: one process, a server thread that waits for the client's
# connect() to return before its first I/O. It must upgrade.
port=$((port + 1))
timeout 60 "$HS" same "$ADDR" $port $BYTES || fail "same process (tcp)"
port=$((port + 1))
"${SERVED[@]}" CHECK_STATUS="$WORK/st" CHECK_CTL="$CTL" timeout 60 "$HS" same "$ADDR" $port $BYTES \
	|| fail "same process (shim)"
[ "$(outcome "$WORK/st.server")" = "upgraded upgraded" ] || fail "same process: $(outcome "$WORK/st.server")"
pass "same process, server waits for the client's connect(): upgraded both ends"

hs_scenario "prompt server" upgraded upgraded server - "0" - ""
hs_scenario "prompt server, non-blocking client" upgraded upgraded server - "0" - "nb"
# The server's first I/O after the client's HELLO timeout: it was acknowledged
# (at accept or by the progress thread), so the client waits and upgrades.
hs_scenario "first I/O after the HELLO timeout" upgraded upgraded server - "500" - ""
# The server's transport is slow to load (SRQSHIM_TEST_DELAYS=load): it is
# loaded before listen(), so the accepted client's HELLO is still
# acknowledged in time (loaded at accept, the ACK came after the timeout).
# The client's HELLO comes 100 ms after its connect, so that the server
# always accepts before it is there.
hs_scenario "transport slow to load at the server" upgraded upgraded server "SRQSHIM_TEST_DELAYS=load=600" \
	"0" "SRQSHIM_TEST_DELAYS=client-hello=100" ""
# After the acknowledged wait too: the client says DECLINE and goes on over
# TCP on the same connection; the server finds HELLO and DECLINE together.
hs_scenario "first I/O after the acknowledged wait" tcp:timeout tcp:timeout server - "2000" - ""
hs_scenario "first I/O after the acknowledged wait, non-blocking" tcp:timeout tcp:timeout server - "2000" - "nb"
# The client gives up while the server, which saw no DECLINE yet, sends
# ACCEPT: both sides end on TCP, the server after the fact, and the client
# takes the late ACCEPT off the stream.
hs_scenario "ACCEPT crosses the client's DECLINE" tcp:timeout tcp:timeout server \
	"SRQSHIM_TEST_DELAYS=server-accept=2000" "0" - ""
# The server writes a greeting at once; the client is slow to say READY: the
# greeting waits in the connection and goes over RDMA after the commit.
hs_scenario "greeting before the commit point" upgraded upgraded server \
	- "0 greet" "SRQSHIM_TEST_DELAYS=client-ready=500" "greet"
hs_scenario "server writes first, HELLO in time" upgraded upgraded server - "0 greet" - "greet"
# The HELLO comes after the server's first write gave up waiting for it: the
# server is plain (and takes the late HELLO off its stream); the client sees
# the greeting where an answer should be, resets that connection and connects
# plain. The server sees one reset probe, then the real connection.
hs_scenario "HELLO after the server wrote first" tcp:peer-plain tcp:peer-plain server \
	- "0 greet" "SRQSHIM_TEST_DELAYS=client-hello=600" "greet"
# The server's ACK comes only after the client's HELLO timeout (it is made to
# wait before acknowledging): the client resets that connection and connects
# plain; the server sees a reset probe, then the real connection.
hs_scenario "ACK after the HELLO timeout" tcp:peer-plain tcp:peer-plain server \
	"SRQSHIM_TEST_DELAYS=server-ack=800" "0" - ""
# The server accepts only after the client's HELLO timeout: no ACK came, so
# the client resets the probe and connects plain; the server sees the probe.
hs_scenario "accept after the HELLO timeout" tcp:peer-plain tcp:peer-plain late-accept - "600" - ""

# fork() while another thread is in a handshake holding the socket's lock:
# the child closes that socket at once (every lock is made anew in a child).
# The server is plain and silent; the shim's HELLO wait is made long, and its
# HELLO is held back, so the connecting thread holds the lock at the fork.
port=$((port + 1))
"$HS" silent "$ADDR" $port 0 > "$WORK/silent.log" 2>&1 &
wait_listen $port
SRQSHIM_HELLO_TIMEOUT_MS=3000 SRQSHIM_TEST_DELAYS=client-hello=2000 "${SHIMMED[@]}" timeout 30 \
	"$HS" fork "$ADDR" $port 0 || fail "fork during a handshake"
pass "fork while a thread is in a handshake: the child closes that socket at once"
