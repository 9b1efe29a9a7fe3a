#!/usr/bin/env bash
# Acceptance 5: a server-first protocol with a preloaded and with a plain
# client; write-then-close delivers every byte; a killed peer gives the
# survivor end of file or ECONNRESET within 5 seconds.
. "$(dirname "$0")/lib.sh"
need_rdma

PC=$BUILD/tests/peer_check
port=9300
"${SERVED[@]}" "$PC" greet-server "$ADDR" $port 300000 2 > "$WORK/gs.log" 2>&1 &
gs=$!
wait_listen $port
before=$(rdma_pkts)
shimmed timeout 120 "$PC" greet-client "$ADDR" $port 300000 || fail "preloaded client of a server-first protocol"
[ $(( $(rdma_pkts) - before )) -gt 290 ] || fail "the greeting did not go over RDMA"
timeout 120 "$PC" greet-client "$ADDR" $port 300000 || fail "plain client of a preloaded server-first server"
wait $gs || { cat "$WORK/gs.log"; fail "greet-server"; }
pass "server-first protocol, write-then-close: preloaded and plain clients got every byte"

for victim in server client; do
	port=$((port + 1))
	"${SERVED[@]}" "$PC" hold-server "$ADDR" $port > "$WORK/hs.log" 2>&1 &
	hs=$!
	wait_listen $port
	"${SHIMMED[@]}" "$PC" hold-client "$ADDR" $port > "$WORK/hc.log" 2>&1 &
	hc=$!
	sleep 2
	if [ $victim = server ]; then kill -9 $hs; survivor=$hc; log=$WORK/hc.log; else kill -9 $hc; survivor=$hs; log=$WORK/hs.log; fi
	start=$(date +%s.%N)
	for _ in $(seq 1 100); do alive $survivor || break; sleep 0.1; done
	took=$(echo "$(date +%s.%N) - $start" | bc)
	if alive $survivor; then kill -9 $survivor; fail "killed $victim: the survivor still waits after 10 s"; fi
	wait $survivor || { cat "$log"; fail "killed $victim: the survivor failed"; }
	cat "$log"
	awk -v t="$took" 'BEGIN { exit !(t < 5) }' || fail "killed $victim: the survivor took $took s"
	pass "killed $victim: the survivor saw the end in $took s"
	wait 2>/dev/null || true
done
