#!/usr/bin/env bash
# Churn (issue 11): cycles of connect, one echo, close, both ends preloaded,
# in each mode. After cycle 10 (warm) and after the last, once what closes
# in the background has ended: the device's QPs, CQs and MRs (rdma res), and
# each process's fds, threads and RSS, must be where they were at cycle 10
# (fds within 2: what the shim makes once, on first need, such as a thread's
# wake-up eventfd at its first sleep, may come later; RSS within 4 MiB):
# nothing grows with the cycle count (a leak per cycle would show 50 times).
# No cycle may stall: the longest must stay under 5 s (a cycle takes tens of
# ms; a stall waits for a handshake deadline, 15 s by default, as every
# cycle that lost its watch did before 2026-12-02). SRQSHIM_CHURN_CYCLES
# (default 60) sets the count. Last, the destination cache's memo: cycles to
# a destination known shimmed do not open the cache file. In both modes,
# connections take QPs the progress thread made ahead (SRQSHIM_QP_POOL); in
# rq mode they also take receive pools kept from closed connections (as
# many, one MR each: counted out of the MRs that must not grow).
. "$(dirname "$0")/lib.sh"
need_rdma

IE=$BUILD/tools/idle_echo
cycles=${SRQSHIM_CHURN_CYCLES:-60}
ulimit -n 65536
port=9950

res() { rdma res show "$1" 2>/dev/null | wc -l; }
# Process $1's ready-QP pool, as srqshim-ctl shows it: ready taken own.
qp_pool() { status_of "$1" '"%d %d %d" % (p["qp_pool"]["ready"], p["qp_pool"]["taken"], p["qp_pool"]["own"])'; }
# Private receive pools kept (registered: one MR each) by process $1 for its next connections.
rq_kept() { status_of "$1" 'p["rq_pools_kept"]'; }
proc_line() { # PID: fds threads rss_kib
	echo "$(ls /proc/$1/fd | wc -l) $(ls /proc/$1/task | wc -l) $(awk '/^VmRSS/ {print $2}' /proc/$1/status)"
}

for mode in srq rq; do
	port=$((port + 1))
	env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode "$IE" server "$ADDR" $port 2> "$WORK/server.err" &
	spid=$!
	wait_listen $port
	mkfifo "$WORK/go.$mode"
	exec 3<> "$WORK/go.$mode"
	before=$(rdma_pkts)
	env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode "$IE" churn "$ADDR" $port "$cycles" \
		< "$WORK/go.$mode" > "$WORK/churn.$mode" 2> "$WORK/churn.err" &
	cpid=$!
	marks=0
	end=$((SECONDS + 600))
	while [ $marks -lt 2 ]; do
		alive $cpid || { cat "$WORK/churn.$mode" "$WORK/churn.err" "$WORK/server.err"; fail "$mode: the client ended early"; }
		[ $SECONDS -lt $end ] || { cat "$WORK/churn.$mode"; fail "$mode: $cycles cycles took more than 600 s"; }
		if [ "$(grep -c '^mark' "$WORK/churn.$mode")" -gt $marks ]; then
			marks=$((marks + 1))
			echo "$(res qp) $(res cq) $(res mr) $(proc_line $spid)" > "$WORK/at.$marks"
			echo "$(qp_pool $spid) $(qp_pool $cpid)" > "$WORK/pool.$marks"
			echo "$(rq_kept $spid) $(rq_kept $cpid)" > "$WORK/kept.$marks"
			echo go >&3
		fi
		sleep 0.2
	done
	wait $cpid || { cat "$WORK/churn.err"; fail "$mode: the client failed"; }
	exec 3>&-
	kill $spid; wait $spid 2>/dev/null || true
	pkts=$(( $(rdma_pkts) - before ))
	cat "$WORK/churn.$mode"
	read -r q1 c1 m1 f1 t1 r1 < "$WORK/at.1"
	read -r q2 c2 m2 f2 t2 r2 < "$WORK/at.2"
	read -r _ _ _ cf1 _ ct1 _ cr1 < <(grep '^mark' "$WORK/churn.$mode" | head -1)
	read -r _ _ _ cf2 _ ct2 _ cr2 < <(grep '^mark' "$WORK/churn.$mode" | tail -1)
	echo "  $mode: QPs $q1 -> $q2, CQs $c1 -> $c2, MRs $m1 -> $m2; server fds $f1 -> $f2, threads $t1 -> $t2, RSS $r1 -> $r2 KiB; client fds $cf1 -> $cf2, threads $ct1 -> $ct2, RSS $cr1 -> $cr2 KiB; $pkts RDMA packets"
	# rq mode keeps up to SRQSHIM_QP_POOL (4) closed connections' receive pools per process,
	# one MR each: the MRs not so kept must not grow.
	read -r ks1 kc1 < "$WORK/kept.1"
	read -r ks2 kc2 < "$WORK/kept.2"
	echo "  $mode: receive pools kept (server, client) $ks1, $kc1 -> $ks2, $kc2"
	[ "$q1" = "$q2" ] && [ "$c1" = "$c2" ] && [ $((m1 - ks1 - kc1)) -eq $((m2 - ks2 - kc2)) ] ||
		fail "$mode: verbs objects grew with the cycles"
	[ $ks2 -le "${SRQSHIM_QP_POOL:-4}" ] && [ $kc2 -le "${SRQSHIM_QP_POOL:-4}" ] ||
		fail "$mode: more receive pools kept than SRQSHIM_QP_POOL"
	if [ $mode = rq ]; then
		[ $ks2 -ge 1 ] && [ $kc2 -ge 1 ] || fail "$mode: no closed connection's receive pool was kept"
	else
		[ "$ks2 $kc2" = "0 0" ] || fail "$mode: receive pools kept in srq mode"
	fi
	[ $((f2 - f1)) -le 2 ] && [ "$t1" = "$t2" ] || fail "$mode: the server's fds or threads grew"
	[ $((cf2 - cf1)) -le 2 ] && [ "$ct1" = "$ct2" ] || fail "$mode: the client's fds or threads grew"
	[ $((r2 - r1)) -lt 4096 ] && [ $((cr2 - cr1)) -lt 4096 ] || fail "$mode: RSS grew by more than 4 MiB"
	[ $pkts -gt $((cycles * 4)) ] || fail "$mode: only $pkts RDMA packets for $cycles cycles"
	# Connections take ready QPs (made ahead by the progress thread), and the
	# pool is full again once the cycles pause.
	read -r sready staken sown cready ctaken cown < "$WORK/pool.2"
	echo "  $mode: ready QPs at the end (server, client) $sready, $cready; taken $staken, $ctaken; made on the spot $sown, $cown"
	[ "$sready" -eq 4 ] && [ "$cready" -eq 4 ] || fail "$mode: the QP pools were not refilled"
	[ $((staken + sown)) -eq "$cycles" ] && [ $((ctaken + cown)) -eq "$cycles" ] ||
		fail "$mode: pool takes do not add up to the cycles"
	[ "$staken" -ge $((cycles / 2)) ] && [ "$ctaken" -ge $((cycles / 2)) ] ||
		fail "$mode: fewer than half of the connections found a ready QP"
	read -r _ _ _ secs _ longest < <(grep '^done' "$WORK/churn.$mode")
	awk -v l="$longest" 'BEGIN {exit !(l < 5)}' || fail "$mode: a cycle stalled for $longest s"
	pass "$mode: $cycles cycles of connect, echo, close in $secs s, the longest $longest s: nothing grew"
done

# A destination known as shimmed costs no system call of the destination
# cache (shim/cache.c's memo): over 20 cycles the client opens the cache
# file only at its first connect (it probes) and at the first answer.
port=$((port + 1))
env LD_PRELOAD="$PRELOAD" "$IE" server "$ADDR" $port 2> "$WORK/server.err" &
spid=$!
wait_listen $port
printf 'go\ngo\n' | strace -f -e trace=openat -o "$WORK/opens" \
	env LD_PRELOAD="$PRELOAD" "$IE" churn "$ADDR" $port 20 > "$WORK/churn.memo" 2> "$WORK/churn.err" ||
	{ cat "$WORK/churn.err"; fail "memo: the client failed"; }
kill $spid; wait $spid 2>/dev/null || true
opens=$(grep -c 'srqshim-.*\.cache' "$WORK/opens" || true)
[ "$opens" -le 2 ] || fail "memo: the cache file was opened $opens times in 20 cycles to one shimmed destination"
pass "memo: 20 cycles to one shimmed destination opened the cache file $opens times"

