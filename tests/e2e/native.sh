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

# closefrom() and close_range() (plain and with CLOSE_RANGE_UNSHARE) above
# an epoll instance leave the shim's own duplicate of it open: the wait
# still answers, as over the kernel alone (docs/design.md, "Process model").
epoll_closefrom() {
	python3 -c '
import ctypes, os, select
libc = ctypes.CDLL(None, use_errno=True)
libc.close_range.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_int]
for how in ("closefrom", "close_range", "close_range UNSHARE"):
    r, w = os.pipe()
    ep = select.epoll()
    ep.register(r, select.EPOLLIN)
    spare = os.open("/dev/null", os.O_RDONLY)
    if how == "closefrom":
        libc.closefrom(spare)
    else:
        print(how, "returned", libc.close_range(spare, 0xffffffff, 2 if "UNSHARE" in how else 0))
    try:
        os.fstat(spare); above = "open"
    except OSError:
        above = "closed"
    os.write(w, b"x")
    try:
        got = [(f == r, e) for f, e in ep.poll(1)]
    except OSError as e:
        got = e.strerror
    print("%s: the fd above %s, epoll: %s" % (how, above, got), flush=True)
    ep.close(); os.close(r); os.close(w)
'
}
epoll_closefrom > "$WORK/cf.tcp" 2>&1
env LD_PRELOAD="$PRELOAD" bash -c "$(declare -f epoll_closefrom); epoll_closefrom" > "$WORK/cf.shim" 2>&1
diff -u "$WORK/cf.tcp" "$WORK/cf.shim" || fail "closefrom/close_range over an epoll instance: other than without the shim (- kernel, + shim)"
pass "closefrom/close_range over an epoll instance: as without the shim: $(tr '\n' ' ' < "$WORK/cf.shim")"

# Python lines that make a loopback connection c (accepted as a) and list
# in dups the other numbers of c's socket (the shim's private duplicate);
# exported for the cases below, which run in a preloaded bash.
export NATIVE_PY_DUPS='
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen()
c = socket.create_connection(ls.getsockname()); a, _ = ls.accept()
c.sendall(b"x"); a.recv(1)
ino = os.fstat(c.fileno()).st_ino
dups = [int(f) for f in os.listdir("/proc/self/fd") if int(f) != c.fileno()
        and os.path.exists("/proc/self/fd/" + f) and os.stat("/proc/self/fd/" + f).st_ino == ino]
'
# A number the shim keeps (a connection's private duplicate) that the
# application closes itself and puts its own file on is the application's:
# closefrom() closes it, as without the shim (the shim forgets the number in
# the application's close; docs/design.md, "Process model").
private_taken() {
	local how
	for how in "close, then F_DUPFD onto it" "dup2 onto it"; do
		python3 -c "import ctypes, fcntl, os, socket, sys
$NATIVE_PY_DUPS"'
how = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
# Under the shim the connection must have its private duplicate; over the
# kernel alone a duplicate of our own stands for it.
assert dups or not os.environ.get("LD_PRELOAD"), "no private duplicate of the connection"
n = max(dups) if dups else os.dup(c.fileno())
f = os.open("/dev/null", os.O_RDONLY)
if how.startswith("close"):
    os.close(n)
    assert fcntl.fcntl(f, fcntl.F_DUPFD, n) == n
else:
    os.dup2(f, n)
os.close(f)
libc.closefrom(n)
try:
    os.fstat(n); state = "open"
except OSError:
    state = "closed"
print("%s: the application'"'"'s file there after closefrom: %s" % (how, state), flush=True)
os._exit(0)
' "$how"
	done
}
private_taken > "$WORK/pt.tcp" 2>&1
env LD_PRELOAD="$PRELOAD" SRQSHIM_START=tcp bash -c "$(declare -f private_taken); private_taken" > "$WORK/pt.shim" 2>&1
diff -u "$WORK/pt.tcp" "$WORK/pt.shim" || fail "a private number the application took over: other than without the shim (- kernel, + shim)"
pass "a private number the application took over: as without the shim: $(tr '\n' ' ' < "$WORK/pt.shim")"

# With a high soft limit of open files, the shim's private fds start at
# 1024 and the kernel's fd table stays at 2,048 numbers (FDSize), where
# half the limit grew it to a million (docs/design.md, "Process model").
fd_table() {
	python3 -c '
import os, resource, socket
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = hard if hard != resource.RLIM_INFINITY and hard < (1 << 20) else (1 << 20)
resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
'"$NATIVE_PY_DUPS"'
size = int([l.split()[1] for l in open("/proc/self/status") if l.startswith("FDSize:")][0])
print(want, size, min(dups) if dups else -1)
'
}
read -r lim size priv < <(env LD_PRELOAD="$PRELOAD" SRQSHIM_START=tcp bash -c "$(declare -f fd_table); fd_table")
[ "$lim" -ge 4096 ] || fail "fd table: the hard limit of open files here ($lim) is too low to show it"
[ "$size" -le 2048 ] && [ "$priv" -ge 1024 ] ||
	fail "fd table with a soft limit of $lim: $size numbers, the connection's private fd at $priv (want at most 2048, and at 1024 or above)"
pass "fd table with a soft limit of $lim: $size numbers, the connection's private fd at $priv"
