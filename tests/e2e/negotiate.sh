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

# outcome FILE: "upgraded" or "tcp:REASON" for the one connection of that status file.
outcome() {
	python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
conns = [c for p in d["processes"] for c in p["connections"]]
print(" ".join("upgraded" if c["state"] == "upgraded" else "tcp:" + c["reason"] for c in conns))
PY
}

# scenario NAME WANT_SERVER WANT_CLIENT SERVER_ROLE SERVER_ENV SERVER_ARGS CLIENT_ENV CLIENT_ARGS
# (ARGS: what follows the byte count; ENV as "VAR=value ..." or "-"). WANT_*:
# the expected outcome.
scenario() {
	local name=$1 want_s=$2 want_c=$3 role=$4 senv=$5 sargs=$6 cenv=$7 cargs=$8 how pre_s pre_c
	for how in tcp shim; do
		port=$((port + 1))
		pre_s=(env); pre_c=(env)
		if [ $how = shim ]; then
			pre_s=("${SERVED[@]}"); pre_c=("${SHIMMED[@]}")
			[ "$senv" = - ] || pre_s+=($senv)
			[ "$cenv" = - ] || pre_c+=($cenv)
			pre_s+=(CHECK_STATUS="$WORK/st" CHECK_CTL="$CTL"); pre_c+=(CHECK_STATUS="$WORK/st" CHECK_CTL="$CTL")
		fi
		rm -f "$WORK"/st.*
		"${pre_s[@]}" timeout 60 "$HS" $role "$ADDR" $port $BYTES $sargs \
			> "$WORK/server.log" 2>&1 &
		local spid=$!
		wait_listen $port
		"${pre_c[@]}" timeout 60 "$HS" client "$ADDR" $port $BYTES $cargs \
			> "$WORK/client.log" 2>&1 || { cat "$WORK/client.log" "$WORK/server.log"; fail "$name ($how): client"; }
		wait $spid || { cat "$WORK/server.log" "$WORK/client.log"; fail "$name ($how): server"; }
		grep -h "ok" "$WORK/server.log" "$WORK/client.log" | sed "s/^/  $how: /"
		if [ $how = shim ]; then
			local got_s got_c
			got_s=$(outcome "$WORK/st.server"); got_c=$(outcome "$WORK/st.client")
			[ "$got_s" = "$want_s" ] || fail "$name: server $got_s, want $want_s"
			[ "$got_c" = "$want_c" ] || fail "$name: client $got_c, want $want_c"
			pass "$name: bytes as over TCP; server $got_s, client $got_c"
		fi
	done
}

# The issue's case: one process, a server thread that waits for the client's
# connect() to return before its first I/O. It must upgrade.
port=$((port + 1))
timeout 60 "$HS" same "$ADDR" $port $BYTES || fail "same process (tcp)"
port=$((port + 1))
"${SERVED[@]}" CHECK_STATUS="$WORK/st" CHECK_CTL="$CTL" timeout 60 "$HS" same "$ADDR" $port $BYTES \
	|| fail "same process (shim)"
[ "$(outcome "$WORK/st.server")" = "upgraded upgraded" ] || fail "same process: $(outcome "$WORK/st.server")"
pass "same process, server waits for the client's connect(): upgraded both ends"

scenario "prompt server" upgraded upgraded server - "0" - ""
scenario "prompt server, non-blocking client" upgraded upgraded server - "0" - "nb"
# The server's first I/O after the client's HELLO timeout: it was acknowledged
# (at accept or by the progress thread), so the client waits and upgrades.
scenario "first I/O after the HELLO timeout" upgraded upgraded server - "500" - ""
# The server's transport is slow to load (SRQSHIM_TEST_DELAYS=load): it is
# loaded before listen(), so the accepted client's HELLO is still
# acknowledged in time (loaded at accept, the ACK came after the timeout).
# The client's HELLO comes 100 ms after its connect, so that the server
# always accepts before it is there.
scenario "transport slow to load at the server" upgraded upgraded server "SRQSHIM_TEST_DELAYS=load=600" \
	"0" "SRQSHIM_TEST_DELAYS=client-hello=100" ""
# After the acknowledged wait too: the client says DECLINE and goes on over
# TCP on the same connection; the server finds HELLO and DECLINE together.
scenario "first I/O after the acknowledged wait" tcp:timeout tcp:timeout server - "2000" - ""
scenario "first I/O after the acknowledged wait, non-blocking" tcp:timeout tcp:timeout server - "2000" - "nb"
# The client gives up while the server, which saw no DECLINE yet, sends
# ACCEPT: both sides end on TCP, the server after the fact, and the client
# takes the late ACCEPT off the stream.
scenario "ACCEPT crosses the client's DECLINE" tcp:timeout tcp:timeout server \
	"SRQSHIM_TEST_DELAYS=server-accept=2000" "0" - ""
# The server writes a greeting at once; the client is slow to say READY: the
# greeting waits in the connection and goes over RDMA after the commit.
scenario "greeting before the commit point" upgraded upgraded server \
	- "0 greet" "SRQSHIM_TEST_DELAYS=client-ready=500" "greet"
scenario "server writes first, HELLO in time" upgraded upgraded server - "0 greet" - "greet"
# The HELLO comes after the server's first write gave up waiting for it: the
# server is plain (and takes the late HELLO off its stream); the client sees
# the greeting where an answer should be, resets that connection and connects
# plain. The server sees one reset probe, then the real connection.
scenario "HELLO after the server wrote first" tcp:peer-plain tcp:peer-plain server \
	- "0 greet" "SRQSHIM_TEST_DELAYS=client-hello=600" "greet"
# The server's ACK comes only after the client's HELLO timeout (it is made to
# wait before acknowledging): the client resets that connection and connects
# plain; the server sees a reset probe, then the real connection.
scenario "ACK after the HELLO timeout" tcp:peer-plain tcp:peer-plain server \
	"SRQSHIM_TEST_DELAYS=server-ack=800" "0" - ""
# The server accepts only after the client's HELLO timeout: no ACK came, so
# the client resets the probe and connects plain; the server sees the probe.
scenario "accept after the HELLO timeout" tcp:peer-plain tcp:peer-plain late-accept - "600" - ""

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
