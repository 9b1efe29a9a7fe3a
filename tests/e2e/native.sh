#!/usr/bin/env bash
# Acceptance 6, run natively (no RDMA device here): preloaded programs give
# the same results as without the shim, over TCP, with the reason recorded;
# likewise where the RDMA transport (libibverbs) cannot be loaded.
. "$(dirname "$0")/lib.sh"
ADDR=127.0.0.1

[ -e /sys/class/infiniband ] && [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ] && {
	echo "this host has an RDMA device: the no-device case cannot be shown here" >&2; exit 77; }

run_case() { # $1: label, $2: the shim library, $3: the reason the status must show, $4: port
	local label=$1 lib=$2 reason=$3 port=$4
	env LD_PRELOAD="$lib" redis-server --bind $ADDR --port $port --save '' --appendonly no \
		--protected-mode no > "$WORK/server-$port.log" 2>&1 &
	wait_listen $port
	head -c 150000 /dev/urandom | base64 -w0 > "$WORK/value"
	[ "$(env LD_PRELOAD="$lib" redis-cli -h $ADDR -p $port -x set big < "$WORK/value" 2> "$WORK/cli.log")" = OK ] ||
		fail "$label: SET"
	env LD_PRELOAD="$lib" redis-cli -h $ADDR -p $port --raw get big 2>> "$WORK/cli.log" | head -c 200000 > "$WORK/back"
	cmp "$WORK/value" "$WORK/back" || fail "$label: value differs"
	env LD_PRELOAD="$lib" redis-benchmark -h $ADDR -p $port -c 10 -n 2000 -t set,get --csv \
		> "$WORK/bench.csv" 2>> "$WORK/cli.log" || fail "$label: benchmark"
	grep -q '^"GET"' "$WORK/bench.csv" || fail "$label: benchmark output"
	hold_client $ADDR $port LD_PRELOAD="$lib"
	got=$(status_of $HELD_PID "[(c['state'], c['reason']) for c in p['connections']]")
	kill $HELD_PID
	[ "$got" = "[('tcp', '$reason')]" ] || { cat "$WORK/cli.log"; fail "$label: the status shows $got"; }
	pass "$label: same results over TCP, the status shows reason '$reason'"
}

# No RDMA device on this host (a configured one, so loopback is no excuse).
SRQSHIM_DEVICE=rxe0 run_case "no RDMA device" "$PRELOAD" no-device 6501
# The transport module (and so libibverbs) cannot be loaded: the shim alone.
mkdir "$WORK/alone"
cp "$SHIM" "$WORK/alone/"
SRQSHIM_DEVICE=rxe0 run_case "libibverbs cannot be loaded" "${SAN_RT:+$SAN_RT:}$WORK/alone/libsrqshim.so" \
	no-rdma-core 6502
