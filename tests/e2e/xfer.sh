#!/usr/bin/env bash
# sendfile, splice, sendmmsg and recvmmsg (issue 13, docs/design.md "The
# socket surface"): xfer_check sends a file with sendfile (blocking, at an
# explicit offset, non-blocking with EAGAIN), three messages with sendmmsg
# and bytes through a pipe with splice, and tries what TCP refuses; its
# client reads with recvmmsg and splice. Before that, a 100-byte head: the
# queue ioctls (FIONREAD, SIOCOUTQ, SIOCOUTQNSD, SIOCATMARK) and MSG_TRUNC
# with and without MSG_PEEK into a NULL buffer, an empty MSG_ERRQUEUE read,
# zero-length reads (blocking and not), and what each end's fd says it is
# (SO_TYPE, SO_DOMAIN, SO_PROTOCOL,
# SO_ACCEPTCONN, the address families, fstat's mode, fcntl's flags). Over
# kernel TCP first, then under the shim in each mode (both ends): every call
# must return what it returned over TCP, the client must receive exactly the
# stream the server meant (SHA-256), and the bytes must have gone over RDMA.
. "$(dirname "$0")/lib.sh"
need_rdma

XC=$BUILD/tests/xfer_check
port=9800

run() { # NAME PRELOAD-ENV...: server and client output in $WORK/NAME.{server,client}
	local name=$1 spid
	shift
	port=$((port + 1))
	env "$@" timeout 300 "$XC" server "$ADDR" $port "$WORK/file.$name" > "$WORK/$name.server" &
	spid=$!
	wait_listen $port
	env "$@" timeout 300 "$XC" client "$ADDR" $port > "$WORK/$name.client" ||
		fail "$name: the client failed"
	wait $spid || { cat "$WORK/$name.server"; fail "$name: the server failed"; }
	local sent got
	sent=$(sed -n 's/^server sent \([0-9]*\) sha256=\(.*\)/\1 \2/p' "$WORK/$name.server")
	got=$(sed -n 's/^client received \([0-9]*\) sha256=\(.*\)/\1 \2/p' "$WORK/$name.client")
	[ -n "$sent" ] && [ "$sent" = "$got" ] ||
		fail "$name: the server sent [$sent], the client received [$got]"
}

run tcp LD_PRELOAD=
cat "$WORK/tcp.server"
for mode in srq rq; do
	before=$(rdma_pkts)
	run $mode LD_PRELOAD="$PRELOAD" SRQSHIM_MODE=$mode
	pkts=$(( $(rdma_pkts) - before ))
	diff -u "$WORK/tcp.server" "$WORK/$mode.server" ||
		fail "$mode: the calls returned other than over TCP (- TCP, + shim)"
	diff -u "$WORK/tcp.client" "$WORK/$mode.client" || fail "$mode: the client's stream differs"
	[ $pkts -gt 2000 ] || fail "$mode: only $pkts RDMA packets: not carried over RDMA"
	pass "$mode: sendfile, splice, sendmmsg, recvmmsg, the queue ioctls, MSG_TRUNC, MSG_ERRQUEUE and the fd's identity as over TCP, $(awk '/^client received/ {print $3}' "$WORK/$mode.client") bytes intact, $pkts RDMA packets"
done
