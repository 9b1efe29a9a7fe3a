#!/usr/bin/env bash
# The RDMA path lost while TCP lives: connections over 127.0.0.1 use rxe0
# (SRQSHIM_DEVICE), then rxe0's netdev goes down (`ip link set dummy0
# down`; loopback TCP is unaffected). In each mode: 8 connections that
# stream 16 MiB each way (FAULTS_MIB=256 for the issue's figure) move to
# TCP (docs/protocol.md, section 4, "When RDMA does not work") and every
# stream completes, checked byte by byte
# and by SHA-256 at both ends; srqshim-ctl shows each end on TCP with
# reason rdma-lost and the moment it moved. A new connection from new
# processes then stays on TCP with every byte, its reason shown by
# srqshim-ctl. Then a live move (srqshim-ctl downgrade) whose RETURN is held
# back while the port goes down completes as a lost one. The netdev comes
# back up at the end.
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

for mode in ${FAULTS_MODES:-srq rq}; do
	restore
	pre=(env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode SRQSHIM_DEVICE="$DEV")
	# 8 x 256 MiB each way takes minutes per mode in the guest (stream_check
	# checks and hashes every byte at both ends): the suite runs 16 MiB
	# (64 until 2026-12-04, 32 until 2026-12-07, cut for the suite's time:
	# the streams still have most of their bytes to come when the port
	# goes down, and one that ended before would not show the move).
	N=${FAULTS_CONNS:-8}
	BYTES=$((${FAULTS_MIB:-16} << 20))
	spids=() cpids=()
	# The servers listen first, then the clients start together, so that the
	# first streams have not ended when the last ones begin. The streams run
	# at a lower priority than this script: on the guest's 2 vCPUs, 16 busy
	# streams left its status reads a round every 10 to 20 s (2026-12-06:
	# the ends seen upgraded 39 s after the start, moved 18 s after the
	# port went down).
	for i in $(seq 1 $N); do
		nice -n 10 "${pre[@]}" "$SC" server $LO $((port + i)) block $BYTES 5 > "$WORK/s$i.log" 2>&1 &
		spids+=($!)
		wait_listen $((port + i))
	done
	for i in $(seq 1 $N); do
		nice -n 10 "${pre[@]}" "$SC" client $LO $((port + i)) block $BYTES 5 > "$WORK/c$i.log" 2>&1 &
		cpids+=($!)
	done
	port=$((port + N))
	# Every end upgraded, and bytes moving over RDMA, before the port goes
	# down: at once then, so that most of each stream is still to come.
	for _ in $(seq 1 200); do
		"$CTL" status --json > "$WORK/st.json"
		up=$("${PYTHON[@]}" -c '
import json, sys
d = json.load(open(sys.argv[1]))
pids = set(int(p) for p in sys.argv[2:])
print(sum(1 for p in d["processes"] if p["pid"] in pids for c in p["connections"] if c["state"] == "upgraded"))' "$WORK/st.json" "${spids[@]}" "${cpids[@]}")
		[ "$up" = $((2 * N)) ] && break
		sleep 0.05
	done
	[ "$up" = $((2 * N)) ] || fail "$mode: $up of $((2 * N)) ends upgraded"
	echo "  $mode: $up ends upgraded at $SECONDS s"
	pk=$(rdma_pkts)
	sleep 0.2
	[ $(($(rdma_pkts) - pk)) -gt 100 ] || fail "$mode: the streams do not move over RDMA"
	# The moment is taken before the port goes down: on a loaded guest the
	# moves were seen to come more than a second before a date taken after
	# it returned (CI of 21c8d83: moved_at 904.97 against down_at 906).
	down_at=$(date +%s)
	ip link set "$NETDEV" down
	echo "  $mode: the port down at $SECONDS s"
	# Each end shows the move: on TCP, reason rdma-lost, with its moment
	# (an end is counted once seen; the ends hold their checked connections
	# open 5 s before closing, for a status reader under load to see them).
	declare -A seen=()
	: > "$WORK/seen.log"
	# For 90 s at most (a bound in time, not in rounds: one round of the
	# status and python takes longer on a loaded machine).
	while [ $(($(date +%s) - down_at)) -lt 90 ]; do
		"$CTL" status --json > "$WORK/st.json"
		for p in $("${PYTHON[@]}" -c '
import json, sys
d = json.load(open(sys.argv[1]))
for p in d["processes"]:
    for c in p["connections"]:
        print(p["pid"], c["state"], c["reason"], c["moved_at"], file=sys.stderr)
    if any(c["state"] == "tcp" and c["reason"] == "rdma-lost" and (c["moved_at"] or 0) >= float(sys.argv[2]) for c in p["connections"]):
        print(p["pid"])' "$WORK/st.json" $((down_at - 1)) 2>> "$WORK/seen.log"); do
			seen[$p]=1
		done
		moved=0
		for p in "${spids[@]}" "${cpids[@]}"; do [ -n "${seen[$p]:-}" ] && moved=$((moved + 1)); done
		[ $moved = $((2 * N)) ] && break
		sleep 0.1
	done
	if [ $moved != $((2 * N)) ]; then
		for i in $(seq 1 $N); do
			for p in ${spids[$((i - 1))]}:s$i ${cpids[$((i - 1))]}:c$i; do
				[ -n "${seen[${p%%:*}]:-}" ] && continue
				echo "== end ${p#*:} (pid ${p%%:*}) not seen moved; what the status showed of it (state, reason, moved_at), then its log:"
				grep "^${p%%:*} " "$WORK/seen.log" | uniq -c || true
				tail -n 5 "$WORK/${p#*:}.log"
			done
		done
		fail "$mode: $moved of $((2 * N)) ends show the move to TCP (rdma-lost)"
	fi
	pass "$mode: all $((2 * N)) ends moved to TCP, shown as rdma-lost with their moment"
	# Bounded: a stream that stops shows its logs and the status.
	for p in "${spids[@]}" "${cpids[@]}"; do
		timeout 600 tail --pid=$p -f /dev/null || { "$CTL" status; tail -n 5 "$WORK"/[cs]?.log; fail "$mode: a stream still runs 10 min after the move"; }
	done
	for i in $(seq 1 $N); do
		wait ${cpids[$((i - 1))]} || { tail -5 "$WORK/c$i.log" "$WORK/s$i.log"; fail "$mode: client $i failed after the move"; }
		wait ${spids[$((i - 1))]} || { tail -5 "$WORK/s$i.log"; fail "$mode: server $i failed after the move"; }
		same_streams "$WORK/c$i.log" "$WORK/s$i.log"
	done
	pass "$mode: $N streams of $((BYTES >> 20)) MiB each way completed over TCP after the port went down, every byte checked"

	# A new connection, from new processes, with the port still down: TCP, every byte.
	port=$((port + 1))
	"${pre[@]}" "$SC" server $LO $port block $((16 << 20)) > "$WORK/s2.log" 2>&1 &
	s=$!
	wait_listen $port
	"${pre[@]}" "$SC" client $LO $port block $((16 << 20)) > "$WORK/c2.log" 2>&1 &
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
	reasons=$("${PYTHON[@]}" -c '
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
	pass "$mode: a new connection with the port down stays on TCP, 16 MiB each way checked ($reasons)"

	# A live move the break overtakes: the server asks for the move, the
	# client holds its RETURN 2 s (SRQSHIM_TEST_DELAYS) and the port goes
	# down meanwhile; each end goes on as a lost move (shim/down.c,
	# down_check_lost) and every byte is checked.
	restore
	port=$((port + 1))
	"${pre[@]}" SRQSHIM_LOG_LEVEL=info "$SC" server $LO $port block $((32 << 20)) > "$WORK/s3.log" 2>&1 &
	s=$!
	wait_listen $port
	"${pre[@]}" SRQSHIM_LOG_LEVEL=info SRQSHIM_TEST_DELAYS=down-return=2000 \
		"$SC" client $LO $port block $((32 << 20)) > "$WORK/c3.log" 2>&1 &
	c=$!
	rx=0
	for _ in $(seq 1 400); do
		rx=$(upgraded_rx $s)
		[ "$rx" -ge $((1 << 20)) ] || ! alive $c && break
		sleep 0.05
	done
	[ "$rx" -ge $((1 << 20)) ] || { cat "$WORK/c3.log" "$WORK/s3.log"; fail "$mode: only $rx bytes over RDMA before the move"; }
	out=$("$CTL" downgrade --pid $s)
	case $out in "1 connection"*) ;; *) fail "$mode: srqshim-ctl said: $out" ;; esac
	sleep 0.5
	ip link set "$NETDEV" down
	timeout 300 tail --pid=$c -f /dev/null || fail "$mode: the moved stream still runs after 5 min"
	wait $c || { tail -n 20 "$WORK/c3.log" "$WORK/s3.log"; fail "$mode: client of the broken move failed"; }
	wait $s || { tail -n 20 "$WORK/s3.log"; fail "$mode: server of the broken move failed"; }
	same_streams "$WORK/c3.log" "$WORK/s3.log"
	grep -q "the RDMA path broke during the move" "$WORK/c3.log" "$WORK/s3.log" \
		|| { grep srqshim "$WORK/c3.log" "$WORK/s3.log"; fail "$mode: no end saw the break during the move"; }
	pass "$mode: a live move broken by the port going down completed as a lost one, 32 MiB each way checked"
done
