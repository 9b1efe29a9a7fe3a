#!/usr/bin/env bash
# srqshim-ctl acceptance: while redis-benchmark runs against redis-server,
# both preloaded in srq mode, "status --json" parses, lists both processes
# by pid with their connections upgraded in srq mode, and byte counters grow
# between two reads; a preloaded client of a plain server shows TCP with
# its reason; a process killed with SIGKILL is no longer listed. Also the
# launcher and the options listing.
. "$(dirname "$0")/lib.sh"
need_rdma

CTL=$BUILD/tools/srqshim-ctl
port=6410
"${SERVED[@]}" redis-server --bind "$ADDR" --port $port --save '' --appendonly no \
	--protected-mode no > "$WORK/redis.log" 2>&1 &
server=$!
wait_listen $port
"${SHIMMED[@]}" redis-benchmark -h "$ADDR" -p $port -c 10 -n 200000 -t set,get -d 64 --csv \
	> "$WORK/bench.csv" 2>&1 &
bench=$!
sleep 4
"$CTL" status --json > "$WORK/s1.json" || fail "status --json"
sleep 3
"$CTL" status --json > "$WORK/s2.json" || fail "status --json (second read)"
"$CTL" status | head -30
python3 - "$WORK/s1.json" "$WORK/s2.json" $server $bench <<'PY' || fail "status does not show the benchmark right"
import json, sys
s1, s2 = (json.load(open(f)) for f in sys.argv[1:3])
server, bench = int(sys.argv[3]), int(sys.argv[4])
def proc(doc, pid):
    p = [p for p in doc["processes"] if p["pid"] == pid]
    assert p, "pid %d not listed" % pid
    return p[0]
for pid, what in ((server, "redis-server"), (bench, "redis-benchmark")):
    a, b = proc(s1, pid), proc(s2, pid)
    assert what in a["command"], a["command"]
    assert a["mode"] == "srq" and a["device"] == "rxe0", a
    up = [c for c in b["connections"] if c["state"] == "upgraded"]
    assert len(up) >= 10, "%s: %d upgraded connections" % (what, len(up))
    assert all(c["mode"] == "srq" and c["peer_mode"] == "srq" for c in up), up
    t1 = sum(c["tx_bytes"] + c["rx_bytes"] for c in a["connections"])
    t2 = sum(c["tx_bytes"] + c["rx_bytes"] for c in b["connections"])
    assert t2 > t1 > 0, "%s: bytes %d then %d" % (what, t1, t2)
    assert b["srq_pool"]["blocks"] > 0 and b["registered_bytes"] > 0, b
    print("%s (pid %d): %d upgraded srq connections, bytes %d -> %d, SRQ pool %s" %
          (what, pid, len(up), t1, t2, b["srq_pool"]))
# Each end's peer is the other end's address (the server's from its accept, the client's from
# its connect). Between the SET and GET phases an end may still list a few of the other's last.
def ends(pid, key):
    return {c[key] for c in proc(s2, pid)["connections"] if c["state"] == "upgraded"}
sp, cl = ends(server, "peer"), ends(bench, "local")
assert len(sp & cl) >= 5, "the server's peers %s are not the client's ends %s" % (sorted(sp), sorted(cl))
assert ends(bench, "peer") == ends(server, "local"), (ends(bench, "peer"), ends(server, "local"))
print("each end's peer is the other's address")
PY
kill $bench $server 2>/dev/null; wait $bench $server 2>/dev/null
pass "status --json lists redis-server and redis-benchmark, srq connections, growing counters"

# A preloaded client of a plain server: TCP, with the reason.
port=6411
redis-server --bind "$ADDR" --port $port --save '' --appendonly no --protected-mode no \
	> "$WORK/plain.log" 2>&1 &
wait_listen $port
# It then forks, and the child connects on its own: the child publishes its own
# statistics, with its own connection only.
"${SHIMMED[@]}" python3 -c '
import os, socket, sys, time
def connect():
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
    s.sendall(b"PING\r\n"); s.recv(100)
    return s
s = connect()
pid = os.fork()
if pid == 0:
    c = connect(); print("child", os.getpid(), c.getsockname()[1], flush=True); time.sleep(120); os._exit(0)
print("connected", s.getsockname()[1], flush=True); time.sleep(120)' "$ADDR" $port > "$WORK/hold.log" &
holder=$!
for _ in $(seq 1 100); do grep -q connected "$WORK/hold.log" && grep -q child "$WORK/hold.log" && break; sleep 0.1; done
read -r _ child child_port < <(grep child "$WORK/hold.log")
read -r _ holder_port < <(grep connected "$WORK/hold.log")
"$CTL" status --pid $holder --json > "$WORK/s3.json" || fail "status --pid of a live process"
"$CTL" status --pid "$child" --json > "$WORK/s4.json" || fail "status --pid of a forked child"
python3 - "$WORK/s3.json" $holder $holder_port "$WORK/s4.json" "$child" "$child_port" <<'PY' || fail "the fallback is not shown"
import json, sys
for f, pid, port in (sys.argv[1:4], sys.argv[4:7]):
    doc = json.load(open(f))
    (p,) = doc["processes"]
    assert p["pid"] == int(pid)
    tcp = [c for c in p["connections"] if c["state"] == "tcp"]
    assert len(p["connections"]) == 1 and len(tcp) == 1, p["connections"]
    assert tcp[0]["reason"] == "peer-plain" and tcp[0]["mode"] == "tcp", tcp
    assert tcp[0]["local"].endswith(":" + port), (tcp[0]["local"], port)
    print("pid %s: fallback shown: %s -> %s %s" % (pid, tcp[0]["local"], tcp[0]["peer"], tcp[0]["reason"]))
PY
pass "a preloaded client of a plain server shows TCP (peer-plain); its forked child lists its own connection"

# SIGKILL: its file stays behind, but status no longer lists it (and cleans up).
kill -9 $holder "$child"
wait $holder 2>/dev/null || true
"$CTL" status --pid $holder > /dev/null && fail "a killed process is still listed"
"$CTL" status --json | python3 -c '
import json, sys
pids = [p["pid"] for p in json.load(sys.stdin)["processes"]]
assert int(sys.argv[1]) not in pids, pids' $holder || fail "a killed process is listed"
[ ! -e "/dev/shm/srqshim-$(id -u)/$holder.stats" ] || fail "the stale file of a killed process is still there"
pass "a process killed with SIGKILL is no longer listed; its stale file is removed"

# The launcher and the options listing.
out=$("$CTL" run --mode rq -- sh -c 'echo "$SRQSHIM_MODE $LD_PRELOAD"')
[ "${out%% *}" = rq ] && echo "$out" | grep -q "libsrqshim.so" || fail "run: $out"
"$CTL" run --mode bogus -- true 2> /dev/null && fail "run accepted a bad mode"
# (Through a file: grep -q leaves at its first match, and a listing longer
# than stdio's buffer then ends with SIGPIPE, which pipefail counts.)
"$CTL" config > "$WORK/cfg-default.txt" || fail "config: exit status $?"
grep -q "^SRQSHIM_MODE=srq (default)" "$WORK/cfg-default.txt" || fail "config: the mode is not listed"
SRQSHIM_SRQ_WINDOW=0 "$CTL" config > "$WORK/cfg.txt" && fail "config: a bad value gave exit 0"
grep -q "BAD VALUE" "$WORK/cfg.txt" || fail "config: the bad value is not shown"
"$CTL" config --json | python3 -c 'import json, sys; d = json.load(sys.stdin); assert len(d["options"]) > 10' ||
	fail "config --json"
pass "run sets the mode and preloads the shim; config lists every option and flags bad values"
