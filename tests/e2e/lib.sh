# Shared helpers of the end-to-end tests (sourced). They run inside the rxe
# guest (tools/rxe-vm), where rxe0 sits on dummy0 with 192.0.2.1.
set -euo pipefail

BUILD=${BUILD:-$(cd "$(dirname "$0")/../../build" && pwd)}
SHIM=$BUILD/shim/libsrqshim.so
# A sanitizer build of the shim needs its runtime loaded first (ASan insists).
SAN_RT=$(ldd "$SHIM" 2>/dev/null | awk '/lib(asan|tsan)\.so/ {print $3}')
PRELOAD=${SAN_RT:+$SAN_RT:}$SHIM
# Programs under the shim are not ours to check for leaks; every other report is fatal.
[ -n "$SAN_RT" ] && export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:halt_on_error=1:abort_on_error=1} \
	UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
ADDR=${ADDR:-192.0.2.1}
DEV=${DEV:-rxe0}
export SRQSHIM_LOG_LEVEL=${SRQSHIM_LOG_LEVEL:-warn}
WORK=$(mktemp -d /tmp/srqshim-e2e.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# Device tests skip (77) where there is no RDMA device; tools/rdma-suite fails on skips.
need_rdma() {
	[ -r "/sys/class/infiniband/$DEV/ports/1/hw_counters/sent_pkts" ] || {
		echo "no RDMA device $DEV here: skipped" >&2; exit 77; }
}
# Each result line says when it came, in seconds since the test began (the
# suite's time, case by case).
pass() { echo "ok (${SECONDS} s): $*"; }

# Packets the RDMA device has sent so far.
rdma_pkts() { cat "/sys/class/infiniband/$DEV/ports/1/hw_counters/sent_pkts"; }
# RNR NAKs the device has received so far (all processes).
rnr() { cat "/sys/class/infiniband/$DEV/ports/1/hw_counters/rcvd_rnr_err"; }
# Hard credit requests received, summed over the "connection done" lines of
# log $1 (the second of "credit requests S/R"; SRQSHIM_LOG_LEVEL=info).
requests() { sed -n 's/.*credit requests [0-9]*\/\([0-9]*\).*/\1/p' "$1" | awk '{s += $1} END {print s + 0}'; }

# Waits until something listens on TCP port $1.
wait_listen() {
	for _ in $(seq 1 200); do
		ss -Hltn "sport = :$1" | grep -q . && return 0
		sleep 0.05
	done
	fail "nothing listens on port $1"
}

# The receive model of each side (srq or rq); the suite runs the tests in
# every pairing. SERVED and SHIMMED prefix a server's and a client's command
# line: started in the background with "&", $! is the program itself (env
# execs it), so the exit trap really ends it.
SERVER_MODE=${SERVER_MODE:-srq}
CLIENT_MODE=${CLIENT_MODE:-srq}
SERVED=(env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE="$SERVER_MODE")
SHIMMED=(env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE="$CLIENT_MODE")
shimmed() { "${SHIMMED[@]}" "$@"; }
echo "modes: server $SERVER_MODE, client $CLIENT_MODE"

# True unless this is a crossed pairing (an srq end and an rq end), where it
# says that the scenario $1 is left out. A crossed pairing differs from srq
# to srq only in an upgraded connection's receive modes: what does not
# depend on them (a run over kernel TCP, whose checks are the same in every
# pairing; a scenario that ends on TCP at both ends; a timer's rule) runs in
# the srq-to-srq pairing alone, for the suite's time.
uncrossed() {
	[ "$SERVER_MODE" = "$CLIENT_MODE" ] && return 0
	echo "not in a crossed pairing (run srq to srq): $1"
	return 1
}

# Python for the tests' own helpers and programs, without the site module
# (none of them needs site-packages): it starts in 0.15 s in the guest
# where a plain start takes 0.3-0.7 s, and the suite starts hundreds.
PYTHON=(python3 -S)

# Prints the Python expression $1 evaluated over the one process of the
# `srqshim-ctl status --json` output on stdin (p: its process object;
# further arguments in sys.argv[2:]).
status_eval() {
	"${PYTHON[@]}" -c '
import json, sys
(p,) = json.load(sys.stdin)["processes"]
print(eval(sys.argv[1]))' "$@"
}

# status_eval over process $1 as `srqshim-ctl status --pid $1 --json` shows
# it now; fails when the process is not shown.
status_of() {
	local pid=$1
	shift
	"$BUILD/tools/srqshim-ctl" status --pid "$pid" --json | status_eval "$@"
}

# status_eval over the snapshot a check program wrote (tests/status_snap.h).
snap_of() {
	local file=$1
	shift
	status_eval "$@" < "$file"
}

# How many connections of process $1 srqshim-ctl shows upgraded, with a
# peer in receive mode $2, now (from the status file, not from a log).
upgraded_now() {
	status_of "$1" "sum(1 for c in p['connections'] if c['state'] == 'upgraded' and c['peer_mode'] == sys.argv[2])" \
		"$2" 2> /dev/null || echo 0
}

# Bytes process $1's upgraded connections received over RDMA so far (0 when not shown).
upgraded_rx() { status_of "$1" "sum(c['rx_bytes'] for c in p['connections'] if c['state'] == 'upgraded')" 2> /dev/null || echo 0; }

# hold_client ADDR PORT [VAR=value ...]: a preloaded client (the shim of
# $PRELOAD, SHIMMED's mode, the variables given) connects to a redis server
# at ADDR:PORT, gets the answer to a PING and keeps the connection open;
# its pid goes to HELD_PID once the answer came. The caller kills it.
hold_client() {
	local addr=$1 port=$2 out
	shift 2
	out=$(mktemp "$WORK/hold.XXXXXX")
	"${SHIMMED[@]}" "$@" python3 -c '
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
s.sendall(b"PING\r\n")
got = s.recv(64)
print("held" if got == b"+PONG\r\n" else "answer %r" % got, flush=True)
time.sleep(600)' "$addr" "$port" > "$out" 2>&1 &
	HELD_PID=$!
	for _ in $(seq 1 400); do
		grep -q "^held" "$out" && return 0
		grep -q "^answer" "$out" && break
		alive $HELD_PID || break
		sleep 0.05
	done
	cat "$out"
	fail "the holding client got no PONG"
}

# True while process $1 runs (a zombie child has ended).
alive() { [ -d "/proc/$1" ] && ! grep -q '^State:.*zombie' "/proc/$1/status" 2>/dev/null; }

# Fails unless what stream_check's client (log $1) sent is what its server (log $2)
# received and the reverse, by the SHA-256 each end printed.
same_streams() {
	local c s
	c=$(sed -n 's/.*client sent_sha256=\([0-9a-f]*\) received_sha256=\([0-9a-f]*\).*/\1 \2/p' "$1")
	s=$(sed -n 's/.*server sent_sha256=\([0-9a-f]*\) received_sha256=\([0-9a-f]*\).*/\2 \1/p' "$2")
	[ -n "$c" ] || fail "no SHA-256 in $1"
	[ "$c" = "$s" ] || fail "the SHA-256 of the streams differ: client sent/received $c, server received/sent $s"
}

# The negotiation's scenarios (negotiate.sh, start.sh): hs_check's server
# role and client over kernel TCP, then under the shim (each side's extra
# variables given); the bytes must come through both times, and each side's
# outcome, from srqshim-ctl status --json taken while its connection is open,
# must be the one wanted. Uses BYTES and the next port from $port.
# outcome FILE: "upgraded" or "tcp:REASON" for the one connection of that status file.
outcome() {
	"${PYTHON[@]}" - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
conns = [c for p in d["processes"] for c in p["connections"]]
print(" ".join("upgraded" if c["state"] == "upgraded" else "tcp:" + c["reason"] for c in conns))
PY
}

# hs_scenario NAME WANT_SERVER WANT_CLIENT SERVER_ROLE SERVER_ENV SERVER_ARGS CLIENT_ENV CLIENT_ARGS
# (ARGS: what follows the byte count; ENV as "VAR=value ..." or "-"). WANT_*:
# the expected outcome.
hs_scenario() {
	local name=$1 want_s=$2 want_c=$3 role=$4 senv=$5 sargs=$6 cenv=$7 cargs=$8 how pre_s pre_c
	[[ $want_s == tcp:* && $want_c == tcp:* ]] && ! uncrossed "$name (both ends on TCP)" && return 0
	for how in tcp shim; do
		[ $how = tcp ] && ! uncrossed "$name over kernel TCP" && continue
		port=$((port + 1))
		pre_s=(env); pre_c=(env)
		if [ $how = shim ]; then
			pre_s=("${SERVED[@]}"); pre_c=("${SHIMMED[@]}")
			[ "$senv" = - ] || pre_s+=($senv)
			[ "$cenv" = - ] || pre_c+=($cenv)
			pre_s+=(CHECK_STATUS="$WORK/st" CHECK_CTL="$BUILD/tools/srqshim-ctl"); pre_c+=(CHECK_STATUS="$WORK/st" CHECK_CTL="$BUILD/tools/srqshim-ctl")
		fi
		rm -f "$WORK"/st.*
		"${pre_s[@]}" timeout 60 "$BUILD/tests/hs_check" $role "$ADDR" $port $BYTES $sargs \
			> "$WORK/server.log" 2>&1 &
		local spid=$!
		wait_listen $port
		"${pre_c[@]}" timeout 60 "$BUILD/tests/hs_check" client "$ADDR" $port $BYTES $cargs \
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
