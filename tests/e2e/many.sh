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
CTL=$BUILD/tools/srqshim-ctl
n=64

# check_pool NAME BOUND: the server's SRQ pool, as its status snapshot
# showed it after the streams, stayed within BOUND blocks.
check_pool() {
	local snap=$WORK/$1.server bound=$2 blocks held
	blocks=$(snap_of "$snap" "p['srq_pool']['blocks']")
	held=$(snap_of "$snap" "p['srq_pool']['peak_in_use']")
	echo "server's SRQ pool: $blocks blocks, at most $held held at once (bound $bound)"
	[ "$blocks" -le "$bound" ] || fail "the pool grew to $blocks blocks, bound $bound"
	[ "$held" -le "$bound" ] || fail "$held blocks held at once, bound $bound"
}

# stuck PID: what a server that stopped shows (for the failure's report).
stuck() {
	echo "the server's status:"
	"$CTL" status --pid "$1" --json | python3 -c '
import json, sys
(p,) = json.load(sys.stdin)["processes"]
print("srq_pool", p["srq_pool"])
for c in p["connections"]:
    print(" ", {k: c[k] for k in ("fd", "state", "rx_bytes", "rx_msgs", "tx_credits", "credits_owed",
                                   "grants_sent", "requests_received", "copied_out")})' || true
	command -v gdb > /dev/null && gdb -p "$1" -batch -ex "thread apply all bt 15" 2>/dev/null | grep -E "^Thread|^#" || true
}

run() { # name port bytes [slow] (SERVER_ENV: more variables for the server)
	local name=$1 port=$2 bytes=$3 slow=${4:-} ups
	"${SERVED[@]}" ${SERVER_ENV:-} CHECK_STATUS="$WORK/$name" CHECK_CTL="$CTL" \
		"$MC" server "$ADDR" $port $n $bytes $slow > "$WORK/$name-server.log" 2>&1 &
	local spid=$!
	wait_listen $port
	"${SHIMMED[@]}" timeout 900 "$MC" client "$ADDR" $port $n $bytes > "$WORK/$name-client.log" 2>&1 ||
		{ cat "$WORK/$name-client.log" "$WORK/$name-server.log"; stuck $spid; fail "$name: client"; }
	wait $spid || { cat "$WORK/$name-server.log"; fail "$name: server"; }
	cat "$WORK/$name-server.log" "$WORK/$name-client.log"
	grep -i "error" "$WORK/$name-server.log" "$WORK/$name-client.log" && fail "$name: errors logged"
	ups=$(snap_of "$WORK/$name.server" \
		"sum(1 for c in p['connections'] if c['state'] == 'upgraded' and c['peer_mode'] == sys.argv[2])" \
		"$CLIENT_MODE")
	[ "$ups" -eq $n ] || fail "$name: $ups of $n connections upgraded"
}

# 1. Stress: the server's pool has 8 buffers at first, at most 32, against
# 64 send windows of 16 (the client keeps the default pool).
r0=$(rnr)
SERVER_ENV="SRQSHIM_SRQ_POOL=8 SRQSHIM_SRQ_POOL_MAX=32" run stress 9400 $((2 << 20))
rnrs=$(( $(rnr) - r0 ))
check_pool stress 32
reqs=$(snap_of "$WORK/stress.server" "sum(c['requests_received'] for c in p['connections'])")
echo "RNR NAKs: $rnrs, hard credit requests received by the server: $reqs"
[ "$rnrs" -gt 0 ] || fail "stress: no RNR retry happened (the pool was not small enough)"
[ "$reqs" -gt 0 ] || fail "stress: no hard credit request happened"
pass "stress: $n connections x 2 MiB into a pool of at most 32 buffers, every byte checked ($rnrs RNR NAKs, $reqs hard requests)"

# 2. Slow reader, default pool.
run slow 9401 $((1 << 20)) slow
check_pool slow 4096
grep -q "the others finished while connection 0 sat unread" "$WORK/slow-server.log" || fail "slow: the others did not finish"
copied=$(snap_of "$WORK/slow.server" "max(c['copied_out'] for c in p['connections'])")
[ "$copied" -gt 0 ] || fail "slow: nothing was copied out of the pool"
pass "slow reader: 63 connections finished while one sat unread; $copied of its messages left the pool"
