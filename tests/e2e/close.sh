#!/usr/bin/env bash
# close() as TCP's (docs/design.md, "Process model"): it returns at once
# while the peer is not reading, and every byte still arrives, then the end
# of stream; SO_LINGER with a time makes close wait up to that long (and no
# longer), and every byte still arrives; SO_LINGER with a zero time resets
# the peer; a process that calls _exit or execs right after close still
# delivers everything. The server writes without blocking until its buffers
# are full (at most 16 MiB), closes and exits; the client reads only after
# a stall.
# Each case over kernel TCP first, then under the shim in each mode (both
# ends preloaded).
. "$(dirname "$0")/lib.sh"
need_rdma

port=9900
server() { # ADDR PORT LINGER(off|seconds) [END]: prints bytes, sha-256, close time in ms;
	# END: exit (default), _exit (no destructors) or exec (/bin/true) right after close
	python3 -c '
import hashlib, os, socket, struct, sys, time
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((sys.argv[1], int(sys.argv[2]))); l.listen(1)
c, _ = l.accept()
if sys.argv[3] != "off":
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, int(sys.argv[3])))
c.setblocking(False)
chunk = os.urandom(65536); h = hashlib.sha256(); n = 0
while n < (16 << 20):
    try:
        k = c.send(chunk)
    except BlockingIOError:
        break
    h.update(chunk[:k]); n += k
t = time.monotonic(); c.close(); ms = (time.monotonic() - t) * 1000
print(n, h.hexdigest(), int(ms), flush=True)
end = sys.argv[4] if len(sys.argv) > 4 else "exit"
if end == "_exit":
    os._exit(0)
if end == "exec":
    os.execv("/bin/true", ["true"])
' "$@"
}
client() { # ADDR PORT STALL_S: prints bytes, sha-256, eof|reset
	python3 -c '
import hashlib, socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
time.sleep(float(sys.argv[3]))
h = hashlib.sha256(); n = 0; end = "eof"
try:
    while True:
        d = s.recv(65536)
        if not d: break
        h.update(d); n += len(d)
except ConnectionResetError:
    end = "reset"
print(n, h.hexdigest(), end, flush=True)
' "$@"
}

# case LINGER STALL HOW [END]: runs one case; sets s_n s_sha s_ms c_n c_sha c_end.
run_case() {
	local linger=$1 stall=$2 how=$3 end=${4:-exit} pre=(env) before
	port=$((port + 1))
	[ "$how" != tcp ] && pre=(env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE="$how")
	"${pre[@]}" timeout 60 bash -c "$(declare -f server); server $ADDR $port $linger $end" \
		> "$WORK/s.out" 2> "$WORK/s.err" &
	local sp=$!
	wait_listen $port
	before=$(rdma_pkts)
	"${pre[@]}" timeout 60 bash -c "$(declare -f client); client $ADDR $port $stall" \
		> "$WORK/c.out" 2> "$WORK/c.err" ||
		{ cat "$WORK/c.out" "$WORK/c.err"; fail "$how, linger $linger: the client failed"; }
	wait $sp || { cat "$WORK/s.out" "$WORK/s.err"; fail "$how, linger $linger: the server failed"; }
	read -r s_n s_sha s_ms < "$WORK/s.out" || fail "$how: no server output"
	read -r c_n c_sha c_end < "$WORK/c.out" || fail "$how: no client output"
	pkts=$(( $(rdma_pkts) - before ))
	echo "  $how, linger $linger, $end after close, reader stalled $stall s: wrote $s_n, close took $s_ms ms; read $c_n, then $c_end ($pkts RDMA packets)"
	# (An abortive close may come before anything went out: no packets then, as none are owed.)
	if [ "$how" != tcp ] && [ "$linger" != 0 ] && [ $pkts -lt 20 ]; then
		cat "$WORK/s.err" "$WORK/c.err"
		fail "$how, linger $linger: only $pkts RDMA packets"
	fi
}

for how in tcp srq rq; do
	# No linger: close returns at once; everything arrives, then the end.
	run_case off 1.5 $how
	[ "$s_ms" -lt 300 ] || fail "$how: close took $s_ms ms while the peer did not read"
	[ "$c_end" = eof ] && [ "$c_n" = "$s_n" ] && [ "$c_sha" = "$s_sha" ] ||
		fail "$how: the reader got $c_n bytes then $c_end, the writer wrote $s_n"
	# SO_LINGER 1 s, the reader stalled 3 s: close waits at most 1 s; everything arrives.
	run_case 1 3 $how
	[ "$s_ms" -lt 1400 ] || fail "$how: close with SO_LINGER 1 s took $s_ms ms"
	# A private receive queue never copies out: when the writer got more in
	# than the reader's receives hold (64 x 8 KiB by default; less when it
	# closed before the client's READY, with only its ring written), its
	# close waits for the reader, as TCP's.
	if [ $how != srq ] && [ "$s_n" -gt $((64 * 8192)) ]; then
		[ "$s_ms" -ge 800 ] || fail "$how: close with SO_LINGER 1 s did not wait ($s_ms ms)"
	fi
	[ "$c_end" = eof ] && [ "$c_n" = "$s_n" ] && [ "$c_sha" = "$s_sha" ] ||
		fail "$how, SO_LINGER 1 s: the reader got $c_n bytes then $c_end, the writer wrote $s_n"
	# SO_LINGER 0: abortive; the reader sees a reset, at once for the writer.
	run_case 0 1 $how
	[ "$s_ms" -lt 300 ] || fail "$how: an abortive close took $s_ms ms"
	[ "$c_end" = reset ] || fail "$how, SO_LINGER 0: the reader saw $c_end, not a reset"
	# _exit or exec right after close: the kernel delivers TCP's bytes; the
	# shim delivers what it accepted before the image ends (bounded).
	for end in _exit exec; do
		run_case off 1.5 $how $end
		[ "$c_end" = eof ] && [ "$c_n" = "$s_n" ] && [ "$c_sha" = "$s_sha" ] ||
			fail "$how, $end after close: the reader got $c_n bytes then $c_end, the writer wrote $s_n"
	done
	pass "$how: close at once, SO_LINGER with a time and with zero, _exit and exec after close, as over kernel TCP"
done

# The application's closefrom() and close_range() (a daemon's "close every
# fd I did not open") leave the shim's own fds and the device's open: each
# end puts a pipe on fd 200, then the server calls closefrom(its connection
# + 1) and the client close_range(its connection + 1, ~0U, 0). The pipe is
# closed, and the connection goes on: 1 MiB echoed, checked by SHA-256.
# Over kernel TCP, then under the shim in each mode (still over RDMA), the
# same lines.
crange() { # ROLE ADDR PORT: prints what it saw
	python3 -c '
import ctypes, hashlib, os, socket, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.close_range.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_int]
role, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if role == "server":
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, port)); l.listen(1)
    c, _ = l.accept()
else:
    c = socket.create_connection((addr, port))
r, w = os.pipe(); os.dup2(r, 200)
if role == "server":
    libc.closefrom(c.fileno() + 1); how = "closefrom"
else:
    how = "close_range %d" % libc.close_range(c.fileno() + 1, 0xffffffff, 0)
try:
    os.fstat(200); high = "open"
except OSError:
    high = "closed"
n = 0
if role == "server":
    while True:
        d = c.recv(65536)
        if not d: break
        c.sendall(d); n += len(d)
    print("server: %s, fd 200 %s, echoed %d bytes" % (how, high, n), flush=True)
else:
    data = os.urandom(1 << 20); back = bytearray()
    def send():
        c.sendall(data); c.shutdown(socket.SHUT_WR)
    t = threading.Thread(target=send); t.start()
    while True:
        d = c.recv(65536)
        if not d: break
        back += d
    t.join()
    print("client: %s, fd 200 %s, %d bytes back, as sent: %s" % (how, high, len(back),
          hashlib.sha256(back).digest() == hashlib.sha256(data).digest()), flush=True)
' "$@"
}
for how in tcp srq rq; do
	port=$((port + 1))
	pre=(env)
	[ "$how" != tcp ] && pre=(env LD_PRELOAD="$PRELOAD" SRQSHIM_MODE="$how")
	"${pre[@]}" timeout 60 bash -c "$(declare -f crange); crange server $ADDR $port" > "$WORK/cr.$how" 2>&1 &
	sp=$!
	wait_listen $port
	before=$(rdma_pkts)
	"${pre[@]}" timeout 60 bash -c "$(declare -f crange); crange client $ADDR $port" > "$WORK/cr.$how.c" 2>&1 ||
		{ cat "$WORK/cr.$how.c" "$WORK/cr.$how"; fail "closefrom/close_range ($how): the client failed"; }
	wait $sp || { cat "$WORK/cr.$how"; fail "closefrom/close_range ($how): the server failed"; }
	pkts=$(( $(rdma_pkts) - before ))
	cat "$WORK/cr.$how.c" >> "$WORK/cr.$how"
	if [ $how != tcp ]; then
		diff -u "$WORK/cr.tcp" "$WORK/cr.$how" || fail "closefrom/close_range ($how): other than over TCP (- TCP, + shim)"
		[ $pkts -ge 1024 ] || fail "closefrom/close_range ($how): only $pkts RDMA packets for 1 MiB each way"
	fi
	pass "closefrom/close_range ($how): $(tr '\n' ' ' < "$WORK/cr.$how")($pkts RDMA packets)"
done
