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

# What TCP does with time, the shim does too: a cork (TCP_CORK, MSG_MORE)
# times out, blocking calls honour SA_RESTART, EINTR, SO_RCVTIMEO and
# SO_SNDTIMEO. First over kernel TCP, to show that the checks hold there.
for how in plain shimmed; do
	[ $how = plain ] && ! uncrossed "corks, signals and socket timeouts over kernel TCP" && continue
	port=$((port + 1))
	pre=(); [ $how = shimmed ] && pre=("${SERVED[@]}")
	"${pre[@]}" "$PC" calls-server "$ADDR" $port > "$WORK/ss.log" 2>&1 &
	ss_pid=$!
	wait_listen $port
	before=$(rdma_pkts)
	pre=(); [ $how = shimmed ] && pre=("${SHIMMED[@]}")
	"${pre[@]}" timeout 120 "$PC" calls-client "$ADDR" $port || fail "corks, signals and timeouts ($how)"
	wait $ss_pid || { cat "$WORK/ss.log"; fail "calls-server ($how)"; }
	pkts=$(( $(rdma_pkts) - before ))
	if [ $how = shimmed ]; then [ $pkts -gt 100 ] || fail "calls: only $pkts RDMA packets"; fi
	pass "corks, signals and socket timeouts ($how): as over TCP ($pkts RDMA packets)"
done

# After a reset, errno and SIGPIPE as TCP gives them: the first of a write, a
# read or SO_ERROR reports ECONNRESET (no SIGPIPE), then reads see the end,
# SO_ERROR is 0 and writes fail with EPIPE and SIGPIPE. Over kernel TCP
# first, then under the shim (where the victim's death fails the connection).
for how in plain shimmed; do
	for order in write read soerror; do
		[ $how = plain ] && ! uncrossed "reset, $order first, over kernel TCP" && continue
		port=$((port + 1))
		pre_s=(); pre_c=()
		[ $how = shimmed ] && pre_s=("${SERVED[@]}") && pre_c=("${SHIMMED[@]}")
		"${pre_s[@]}" "$PC" reset-survivor "$ADDR" $port $order > "$WORK/rs.log" 2>&1 &
		rs=$!
		wait_listen $port
		"${pre_c[@]}" "$PC" reset-victim "$ADDR" $port > "$WORK/rv.log" 2>&1 &
		rv=$!
		for _ in $(seq 1 100); do grep -q ready "$WORK/rs.log" && grep -q ready "$WORK/rv.log" && break; sleep 0.1; done
		kill -9 $rv
		wait $rv 2>/dev/null || true
		sleep 2 # the shim fails the connection within the 500 ms grace after the TCP end
		kill -USR1 $rs
		wait $rs || { cat "$WORK/rs.log"; fail "reset, $order first ($how)"; }
		pass "reset, $order first ($how): $(grep -c 'reset:' "$WORK/rs.log") observations as TCP's"
	done
done

# A server that closes with bytes unread while the client still writes
# (the client out of credits): TCP resets, so a write fails; under the shim
# too, once the server's end of stream came and its TCP end is gone
# (transport/conn.c, conn_check_closed_peer). Over kernel TCP first.
for how in plain shimmed; do
	[ $how = plain ] && ! uncrossed "a server closed with bytes unread, over kernel TCP" && continue
	port=$((port + 1))
	pre_s=(); pre_c=()
	[ $how = shimmed ] && pre_s=("${SERVED[@]}") && pre_c=("${SHIMMED[@]}")
	"${pre_s[@]}" "$PC" unread-server "$ADDR" $port > "$WORK/us.log" 2>&1 &
	us=$!
	wait_listen $port
	"${pre_c[@]}" "$PC" unread-client "$ADDR" $port > "$WORK/uc.log" 2>&1 \
		|| { cat "$WORK/uc.log" "$WORK/us.log"; fail "a server closed with bytes unread ($how): the writer did not fail"; }
	wait $us || { cat "$WORK/us.log"; fail "unread-server ($how)"; }
	pass "a server closed with bytes unread ($how): $(grep unread-client "$WORK/uc.log")"
done

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

# A process that exits (exit(), not _exit()) right after its last write,
# with data still in flight: every byte arrives, then the end, as over TCP.
# The reader is slow at first, so that the writer's bytes are still queued
# at its exit. Over kernel TCP first, then under the shim.
head -c 3000000 /dev/urandom > "$WORK/inflight"
want=$(sha256sum < "$WORK/inflight" | cut -d' ' -f1)
for how in plain shimmed; do
	[ $how = plain ] && ! uncrossed "exit with data in flight, over kernel TCP" && continue
	port=$((port + 1))
	pre_s=(env); pre_c=(env)
	[ $how = shimmed ] && { pre_s=("${SERVED[@]}"); pre_c=("${SHIMMED[@]}"); }
	"${pre_s[@]}" timeout 120 python3 -c '
import hashlib, socket, sys, time
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((sys.argv[1], int(sys.argv[2]))); l.listen(1)
c, _ = l.accept()
time.sleep(1)  # the writer has exited by now
h = hashlib.sha256(); n = 0
while True:
    d = c.recv(65536)
    if not d: break
    h.update(d); n += len(d)
print(n, h.hexdigest())
' "$ADDR" $port > "$WORK/inflight.out" 2>&1 &
	rs=$!
	wait_listen $port
	"${pre_c[@]}" timeout 60 python3 -c '
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
s.sendall(open(sys.argv[3], "rb").read())
s.detach()  # python would close it at exit: the fd stays open
sys.exit(0)  # no close, no shutdown: the exit ends the connection
' "$ADDR" $port "$WORK/inflight" || fail "exit with data in flight ($how): writer"
	wait $rs || { cat "$WORK/inflight.out"; fail "exit with data in flight ($how): reader"; }
	[ "$(cat "$WORK/inflight.out")" = "3000000 $want" ] ||
		fail "exit with data in flight ($how): the reader got $(cat "$WORK/inflight.out")"
	pass "exit with data in flight ($how): 3000000 bytes and the end, sha-256 as sent"
done
