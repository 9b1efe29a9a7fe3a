#!/usr/bin/env bash
# SRQ acceptance 2 and 3: 64 connections of one process pair stream at once
# into a deliberately small shared receive pool (RNR retries and hard credit
# requests happen; every byte is checked; no post error), then the same with
# a slow reader: one connection left unread while 63 others stream; they
# finish, its unread data leaves the pool (copied out), and the pool stays
# within its bound.
. "$(dirname "$0")/lib.sh"
need_rdma

MC=$BUILD/tests/many_check
n=64

# Checks the server's log: no shim error, pool within its bound; prints the summary.
check_pool() {
	local log=$1 bound=$2 line blocks held
	grep -i "error" "$log" && fail "errors logged"
	line=$(grep "at exit:" "$log") || { cat "$log"; fail "no summary at exit"; }
	echo "$line"
	blocks=$(echo "$line" | sed -n 's/.*SRQ pool \([0-9]*\) blocks.*/\1/p')
	held=$(echo "$line" | sed -n 's/.*at most \([0-9]*\) held.*/\1/p')
	[ "$blocks" -le "$bound" ] || fail "the pool grew to $blocks blocks, bound $bound"
	[ "$held" -le "$bound" ] || fail "$held blocks held at once, bound $bound"
}

run() { # name port bytes [slow] (SERVER_ENV: more variables for the server)
	local name=$1 port=$2 bytes=$3 slow=${4:-}
	SRQSHIM_LOG_LEVEL=info "${SERVED[@]}" ${SERVER_ENV:-} "$MC" server "$ADDR" $port $n $bytes $slow \
		> "$WORK/$name-server.log" 2>&1 &
	local spid=$!
	wait_listen $port
	"${SHIMMED[@]}" timeout 900 "$MC" client "$ADDR" $port $n $bytes > "$WORK/$name-client.log" 2>&1 ||
		{ cat "$WORK/$name-client.log" "$WORK/$name-server.log"; fail "$name: client"; }
	wait $spid || { cat "$WORK/$name-server.log"; fail "$name: server"; }
	grep -v "connection done\|upgraded" "$WORK/$name-server.log" "$WORK/$name-client.log"
	grep -i "error" "$WORK/$name-client.log" && fail "$name: client errors logged"
	[ "$(grep -c "upgraded (peer srq)" "$WORK/$name-server.log")" -eq $n ] ||
		fail "$name: not all $n connections upgraded"
}

# 1. Stress: the server's pool has 8 buffers at first, at most 32, against
# 64 send windows of 16 (the client keeps the default pool).
r0=$(rnr)
SERVER_ENV="SRQSHIM_SRQ_POOL=8 SRQSHIM_SRQ_POOL_MAX=32" run stress 9400 $((2 << 20))
rnrs=$(( $(rnr) - r0 ))
check_pool "$WORK/stress-server.log" 32
reqs=$(requests "$WORK/stress-server.log")
echo "RNR NAKs: $rnrs, hard credit requests received by the server: $reqs"
[ "$rnrs" -gt 0 ] || fail "stress: no RNR retry happened (the pool was not small enough)"
[ "$reqs" -gt 0 ] || fail "stress: no hard credit request happened"
pass "stress: $n connections x 2 MiB into a pool of at most 32 buffers, every byte checked ($rnrs RNR NAKs, $reqs hard requests)"

# 2. Slow reader, default pool.
run slow 9401 $((1 << 20)) slow
check_pool "$WORK/slow-server.log" 4096
grep -q "the others finished while connection 0 sat unread" "$WORK/slow-server.log" || fail "slow: the others did not finish"
copied=$(sed -n 's/.*copied out \([0-9]*\).*/\1/p' "$WORK/slow-server.log" | sort -n | tail -1)
[ "${copied:-0}" -gt 0 ] || fail "slow: nothing was copied out of the pool"
pass "slow reader: 63 connections finished while one sat unread; $copied of its messages left the pool"
