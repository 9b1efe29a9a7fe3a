#!/usr/bin/env bash
# The RDMA path lost while TCP lives: connections over 127.0.0.1 use rxe0
# (SRQSHIM_DEVICE), then rxe0's netdev goes down (`ip link set dummy0
# down`; loopback TCP is unaffected). In each mode: the streaming
# connections end with an error within 1 s (the port's async event fails
# them), the processes survive, and a new connection from new processes
# stays on TCP with every byte, its reason shown by srqshim-ctl. The netdev
# comes back up at the end.
. "$(dirname "$0")/lib.sh"
need_rdma

SC=$BUILD/tests/stream_check
CTL=$BUILD/tools/srqshim-ctl
LO=127.0.0.1
NETDEV=$(rdma link show "$DEV/1" | awk '{for (i = 1; i < NF; i++) if ($i == "netdev") print $(i + 1)}')
[ -n "$NETDEV" ] || fail "no netdev under $DEV"
# The GID of $ADDR (IPv4-mapped), which the netdev's going down takes away.
GID=$(printf 'ffff:%02x%02x:%02x%02x' $(echo "$ADDR" | tr . ' '))
restore() {
	ip link set "$NETDEV" up
	for _ in $(seq 1 100); do
		# (Outputs taken first: grep -q under pipefail fails the pipeline it leaves early.)
		local link gids
		link=$(rdma link show "$DEV/1" 2>/dev/null || true)
		gids=$(cat /sys/class/infiniband/"$DEV"/ports/1/gids/* 2>/dev/null || true)
		[[ $link == *"state ACTIVE"* && $gids == *"$GID"* ]] && return 0
		sleep 0.1
	done
	echo "faults: $DEV did not come back (ACTIVE with $ADDR's GID) within 10 s" >&2
}
trap 'restore; kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
port=9800

for mode in srq rq; do
	restore
	pre=(env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode SRQSHIM_DEVICE="$DEV")
	port=$((port + 1))
	"${pre[@]}" "$SC" server $LO $port block $((4 << 30)) > "$WORK/s.log" 2>&1 &
	s=$!
	wait_listen $port
	"${pre[@]}" "$SC" client $LO $port block $((4 << 30)) > "$WORK/c.log" 2>&1 &
	c=$!
	sleep 2
	"$CTL" status --json > "$WORK/st.json"
	python3 - "$WORK/st.json" $s <<'PY' || { cat "$WORK/st.json"; fail "$mode: the stream is not upgraded"; }
import json, sys
d = json.load(open(sys.argv[1]))
p = [p for p in d["processes"] if p["pid"] == int(sys.argv[2])][0]
sys.exit(0 if p["connections"] and all(c["state"] == "upgraded" for c in p["connections"]) else 1)
PY
	start=$(date +%s.%N)
	ip link set "$NETDEV" down
	for _ in $(seq 1 100); do alive $s || alive $c || break; sleep 0.05; done
	took=$(echo "$(date +%s.%N) - $start" | bc)
	alive $s && { kill -9 $s; fail "$mode: the server still streams 5 s after the port went down"; }
	alive $c && { kill -9 $c; fail "$mode: the client still streams 5 s after the port went down"; }
	set +e; wait $s; rs=$?; wait $c; rc=$?; set -e
	# An error (exit 1 with a message), or SIGPIPE from a write after the
	# reset (as over TCP); never a crash (another signal).
	for r in $rs $rc; do
		[ $r -ge 1 ] && { [ $r -lt 128 ] || [ $r = 141 ]; } || { cat "$WORK/s.log" "$WORK/c.log"; fail "$mode: exit status $r"; }
	done
	grep -h -i "error\|reset\|short\|fail" "$WORK/s.log" "$WORK/c.log" | head -2 | sed 's/^/  /'
	awk -v t="$took" 'BEGIN { exit !(t < 1) }' || fail "$mode: the streams ended $took s after the port went down"
	pass "$mode: both ends failed with an error $took s after the port went down"

	# A new connection, from new processes, with the port still down: TCP, every byte.
	port=$((port + 1))
	"${pre[@]}" "$SC" server $LO $port block $((64 << 20)) > "$WORK/s2.log" 2>&1 &
	s=$!
	wait_listen $port
	"${pre[@]}" "$SC" client $LO $port block $((64 << 20)) > "$WORK/c2.log" 2>&1 &
	c=$!
	# Its status while it streams (each end is listed once decided).
	for _ in $(seq 1 100); do
		"$CTL" status --json > "$WORK/st2.json"
		[ "$(grep -o '"state"' "$WORK/st2.json" | wc -l)" -ge 2 ] && break
		sleep 0.05
	done
	wait $c || { cat "$WORK/c2.log" "$WORK/s2.log"; fail "$mode: a new connection failed with the port down"; }
	wait $s || { cat "$WORK/s2.log"; fail "$mode: its server failed"; }
	# The client's reason: a new process finds no usable GID (no-device); one
	# that saw the port go down says device-down. Its server sees no HELLO.
	reasons=$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
cl = [c for p in d["processes"] if " client " in p["command"] for c in p["connections"]]
sv = [c for p in d["processes"] if " server " in p["command"] for c in p["connections"]]
print(" ".join(c["state"] + ":" + str(c["reason"]) for c in cl + sv))
' "$WORK/st2.json")
	case "$reasons" in
	"tcp:no-device tcp:peer-plain" | "tcp:device-down tcp:peer-plain") ;;
	*) cat "$WORK/st2.json"; fail "$mode: client and server show '$reasons'" ;;
	esac
	pass "$mode: a new connection with the port down stays on TCP, 64 MiB each way checked ($reasons)"
done
