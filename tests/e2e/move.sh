#!/usr/bin/env bash
# Connections that start on TCP move to RDMA (issue 11; docs/design.md,
# "Connections that start on TCP"): an echo of messages from 1 byte to 20 KB
# (move_check), each checked byte by byte, runs first over kernel TCP, then
# under the shim with SRQSHIM_START=tcp and thresholds that make the move
# happen within the first rounds; both ends must end upgraded, the device
# must have carried the bytes, and every echo must be exact. Cases: which
# side starts the move (client, server, both at once), the server's style
# (blocking, epoll, an application that does not read while the client's
# move comes), the client's (blocking, non-blocking with poll, a burst of
# writes before any read), in each mode.
. "$(dirname "$0")/lib.sh"
need_rdma

MC=$BUILD/tests/move_check
CTL=$BUILD/tools/srqshim-ctl
ROUNDS=200
port=9900
SOON="SRQSHIM_MOVE_AFTER_MS=0 SRQSHIM_MOVE_AFTER_CALLS=6"
AT_ONCE="SRQSHIM_MOVE_AFTER_MS=0 SRQSHIM_MOVE_AFTER_CALLS=1"
NEVER="SRQSHIM_MOVE_AFTER_MS=100000"

# move_case NAME SERVER_STYLE CLIENT_STYLE SERVER_MOVE CLIENT_MOVE MODE [MIN_PACKETS]
move_case() {
	local name=$1 sstyle=$2 cstyle=$3 smove=$4 cmove=$5 mode=$6 min=${7:-1000} how spid pkts
	for how in tcp shim; do
		port=$((port + 1))
		local pre_s=(env) pre_c=(env)
		if [ $how = shim ]; then
			# Info: what each side's move did, printed when the case fails.
			pre_s=(env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode SRQSHIM_LOG_LEVEL=info $smove
				CHECK_STATUS="$WORK/mv" CHECK_CTL="$CTL")
			pre_c=(env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode SRQSHIM_LOG_LEVEL=info SRQSHIM_START=tcp $cmove
				CHECK_STATUS="$WORK/mv" CHECK_CTL="$CTL")
		fi
		rm -f "$WORK"/mv.[cs]* "$WORK"/mv.stuck-* "$WORK"/mv.failed-*
		pkts=$(rdma_pkts)
		"${pre_s[@]}" timeout 30 "$MC" server "$ADDR" $port $sstyle > "$WORK/mv.srv.log" 2>&1 &
		spid=$!
		wait_listen $port
		"${pre_c[@]}" timeout 30 "$MC" client "$ADDR" $port $cstyle $ROUNDS > "$WORK/mv.cli.log" 2>&1 ||
			{ sleep 1; cat "$WORK/mv.cli.log" "$WORK/mv.srv.log" "$WORK"/mv.stuck-* 2>/dev/null; fail "$name ($how): client"; }
		wait $spid || { cat "$WORK/mv.srv.log" "$WORK/mv.cli.log" "$WORK"/mv.stuck-* 2>/dev/null; fail "$name ($how): server"; }
		[ $how = tcp ] && cp "$WORK/mv.srv.log" "$WORK/move-tcp.srv"
		diff <(grep "^server:" "$WORK/move-tcp.srv") <(grep "^server:" "$WORK/mv.srv.log") ||
			fail "$name: the server saw other than over TCP (- TCP, + shim)"
		[ $how = tcp ] && continue
		local got_s got_c
		got_s=$(outcome "$WORK/mv.server"); got_c=$(outcome "$WORK/mv.client")
		[ "$got_s $got_c" = "upgraded upgraded" ] ||
			{ cat "$WORK/mv.srv.log" "$WORK/mv.cli.log"; fail "$name: server $got_s, client $got_c, want both upgraded"; }
		# The echo's bytes (over 1.9 MB each way) went over the device: far more than 1 KB packets.
		[ $(($(rdma_pkts) - pkts)) -gt $min ] || fail "$name: $(($(rdma_pkts) - pkts)) RDMA packets"
		pass "$mode: $name: $(grep "^server:" "$WORK/mv.srv.log" | tail -1), as over TCP; both moved ($(($(rdma_pkts) - pkts)) packets)"
	done
}

for mode in srq rq; do
	move_case "the client moves, blocking both" block block "$NEVER" "$SOON" $mode
	move_case "the server moves, epoll server, poll client" epoll poll "$SOON" "$NEVER" $mode
	move_case "both at once" block block "$SOON" "$SOON" $mode
	# The client's burst makes it ripe while the server's application sleeps: its
	# progress thread answers the mark; what came before it is read first after the move.
	move_case "the server's application does not read during the move" lazy burst "$NEVER" "$SOON" $mode
	# The server's application sleeps in epoll for the end alone: the whole move, and
	# its process's first QP, happen on its progress thread under that wait, which
	# must still wake for the end that comes over RDMA.
	move_case "the server's application asleep in epoll throughout" rdhup shut "$NEVER" "$AT_ONCE" $mode 3
done
