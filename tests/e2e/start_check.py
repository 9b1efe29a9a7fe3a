#!/usr/bin/env python3
"""start_check: what a TCP program sees of a connection that starts on TCP
(tests/e2e/start.sh), in cases where the shim must step in for a program
that makes no call it could use. One line per observation, the same over
kernel TCP and under the shim; timings only as bounds far above TCP's.

  start_check.py server ADDR PORT MODE    a plain server: each connection's
      bytes to stdout at its end ("conn N: REPR"); MODE reply: answers
      b"PONG\\n" to b"PING\\n"; greet: writes b"HI\\n" first, then as
      reply; silent: never writes; reset: small buffers, writes b"HI\\n",
      reads nothing, closes after 1 s (a reset: bytes unread); shutrd:
      shuts its reading at once, reads at once, then every 50 ms until
      b"PING\n" came (bounded), answers b"PONG\n"; shutwr: shuts its
      writing at once, then reads to the end; greet-shut: writes b"HI\n",
      then waits in a blocking read; 0.3 s later another thread writes
      b"MORE\n" and shuts (SHUT_RDWR), which ends the read
      first: one blocking read, then writes b"OK\n", then as silent;
      answer-close: reads to b"PING\n", answers b"PONG\n" and closes at once;
      halves: reads to b"PING\n", writes 1,000 b"a", then 0.5 s later 1,000
      b"b", and closes; halves-exec: the same, the second half written by an
      exec'd program; zc: SO_ZEROCOPY on the listener; reads to b"PING\n",
      answers b"PONG\n" with MSG_ZEROCOPY, then reads its error queue (the
      completion) and prints what it found
  start_check.py CASE ADDR PORT           a client case:
      close: writes, closes at once (close must not wait for the server)
      poll:  non-blocking, writes, waits in poll for the reply
      fork:  connects, forks; the child writes, then an exec'd program
      et:    200 KiB from an edge-triggered epoll writer, then the end
      shutrd: shuts its reading at once; reads, at once and later; writes
      shutrd-poll: shuts its reading at once; polls for POLLIN (shown at
      once?), reads, writes
      reset: 1 MiB written without waiting to a server that resets; reads
      reset-write: as reset, one more write at 0.5 s, then a write, reads
      fionread: FIONREAD 0.2 s after connect, before the server writes
      nbread: a non-blocking read 0.2 s after connect (the greeting is in)
      shutrd-late: shuts its reading 0.2 s after connect (the greeting is
      in), then two reads of a blocking socket
      ping: writes b"PING\n" 0.2 s after connect, reads the reply
      ping-late: the same, reading the reply 0.5 s after its write
      endfirst: reads (the server's end), then writes b"PING\n"
      readall: reads to the end (at most 5 s)
      nul: reads the greeting, writes b"\\0" (the first byte of a handshake
      message), then b"x\n" 1.5 s later
      nulwait: writes b"\\0" and waits for the reply (5 s at most)
      errqueue: 0.2 s after connect, sets SO_ZEROCOPY, sends b"PING\n" with
      MSG_ZEROCOPY, then reads the error queue (its completion), then the
      reply; errqueue-first: the same, SO_ZEROCOPY set before the connect;
      errqueue-now: SO_ZEROCOPY set right after the connect; errqueue-nb:
      a non-blocking connect, SO_ZEROCOPY set at once (EINPROGRESS), then
      a wait for POLLOUT
      lowat: SO_RCVLOWAT 10, then a blocking read of 3 bytes 0.2 s after
      connect (the 3-byte greeting is in): TCP's read returns them (its
      target is the smaller of the mark and the length); a wait for the
      mark would hang (5 s alarm)
      waitall: writes b"PING\n", then one blocking read of 2,000 bytes with
      MSG_WAITALL (all of them, as TCP's), then reads to the end
"""
import fcntl
import os
import select
import signal
import socket
import struct
import sys
import termios
import threading
import time


def server(addr, port, mode):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if mode == "reset":
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    if mode == "zc":
        ls.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    ls.bind((addr, port))
    ls.listen(16)
    print("listening", flush=True)
    n = 0

    def handle(c, k):
        got = b""
        if mode == "shutrd":
            t0 = time.time()
            c.shutdown(socket.SHUT_RD)
            first = c.recv(100)
            while not got.endswith(b"PING\n") and time.time() - t0 < 5:
                time.sleep(0.05)
                got += c.recv(100)
            c.sendall(b"PONG\n")
            print("conn %d: read at once %r, then %r" % (k, first, got), flush=True)
            c.close()
            return
        if mode == "shutwr":
            c.shutdown(socket.SHUT_WR)
        if mode == "first":
            got = c.recv(100)
            c.sendall(b"OK\n")
        if mode == "answer-close":
            while not got.endswith(b"PING\n") and (d := c.recv(100)):
                got += d
            c.sendall(b"PONG\n")
            print("conn %d: %r" % (k, got), flush=True)
            c.close()
            return
        if mode in ("halves", "halves-exec"):
            while not got.endswith(b"PING\n") and (d := c.recv(100)):
                got += d
            c.sendall(b"a" * 1000)
            time.sleep(0.5)
            print("conn %d: %r" % (k, got), flush=True)
            if mode == "halves":
                c.sendall(b"b" * 1000)
                c.close()
                return
            os.set_inheritable(c.fileno(), True)
            code = ("import socket; t = socket.socket(fileno=%d); t.sendall(b'b' * 1000)"
                    % c.fileno())
            os.execvp(sys.executable, [sys.executable, "-c", code])
        if mode == "zc":
            while not got.endswith(b"PING\n") and (d := c.recv(100)):
                got += d
            c.send(b"PONG\n", MSG_ZEROCOPY)
            time.sleep(0.2)
            print("conn %d: %r, error queue: %s" % (k, got, error_queue(c)), flush=True)
            c.close()
            return
        if mode == "greet-shut":
            c.sendall(b"HI\n")
            took = []

            def other():
                t1 = time.time()
                c.sendall(b"MORE\n")
                took.append(time.time() - t1)
                c.shutdown(socket.SHUT_RDWR)
            threading.Timer(0.3, other).start()
            t0 = time.time()
            d = c.recv(100)
            print("conn %d: the blocked read gave %r, within 2 s: %s; the other thread's "
                  "write took under 0.5 s: %s" % (k, d, time.time() - t0 < 2,
                                                  bool(took) and took[0] < 0.5), flush=True)
            c.close()
            return
        if mode in ("greet", "reset"):
            c.sendall(b"HI\n")
        if mode == "reset":
            time.sleep(1.0)
            print("conn %d: closed unread" % k, flush=True)
            c.close()
            return
        while True:
            try:
                d = c.recv(65536)
            except OSError as e:
                got += b"<%s>" % e.__class__.__name__.encode()
                break
            if not d:
                break
            got += d
            if mode in ("reply", "greet") and got.endswith(b"PING\n"):
                c.sendall(b"PONG\n")
        # Only the bytes of the stream: a probe that carried a HELLO shows as its reset.
        print("conn %d: %r" % (k, got if not got.startswith(b"\0SRQSHM") else b"<probe>"), flush=True)
        c.close()

    while True:
        c, _ = ls.accept()
        n += 1
        threading.Thread(target=handle, args=(c, n), daemon=True).start()


SO_ZEROCOPY, MSG_ZEROCOPY = 60, 0x4000000


def error_queue(s):
    """What s's error queue holds (a MSG_ZEROCOPY completion), or the error."""
    try:
        data, anc, _, _ = s.recvmsg(100, 1024, socket.MSG_ERRQUEUE)
        return "%d bytes, %d messages" % (len(data), len(anc))
    except OSError as e:
        return e.__class__.__name__


def said(label, what):
    """Prints label and what() gives, or the name of the error it raised."""
    try:
        print(label, what(), flush=True)
    except OSError as e:
        print(label, e.__class__.__name__, flush=True)


def recv_or_timeout(s):
    """Up to 100 bytes of s, or b"<timeout>" when its timeout ran out first."""
    try:
        return s.recv(100)
    except socket.timeout:
        return b"<timeout>"


def case(which, addr, port):
    t0 = time.time()
    if which == "close":
        s = socket.create_connection((addr, port))
        s.sendall(b"DATA\n")
        s.close()
        print("close took under 0.5 s:", time.time() - t0 < 0.5, flush=True)
    elif which == "poll":
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect((addr, port))
        except BlockingIOError:
            pass
        p = select.poll()
        p.register(s, select.POLLOUT)
        print("connected:", p.poll(5000) != [], flush=True)
        s.send(b"PING\n")
        p.modify(s, select.POLLIN)
        got = b""
        while not got.endswith(b"PONG\n") and time.time() - t0 < 20:
            p.poll(20000)
            try:
                got += s.recv(100)
            except BlockingIOError:
                pass
        print("reply %r within 5 s: %s" % (got, time.time() - t0 < 5), flush=True)
    elif which == "fork":
        s = socket.create_connection((addr, port))
        pid = os.fork()
        if pid == 0:
            print("child sent", s.send(b"PING\n"), flush=True)
            os.set_inheritable(s.fileno(), True)
            code = ("import socket; t = socket.socket(fileno=%d); "
                    "print('exec sent', t.send(b'PING2\\n'), flush=True)" % s.fileno())
            os.execvp(sys.executable, [sys.executable, "-c", code])
        os.waitpid(pid, 0)
    elif which == "et":
        s = socket.create_connection((addr, port))
        s.setblocking(False)
        ep = select.epoll()
        ep.register(s.fileno(), select.EPOLLOUT | select.EPOLLET)
        data, off = b"x" * (200 * 1024), 0
        while off < len(data) and time.time() - t0 < 20:
            try:
                off += s.send(data[off:])
            except BlockingIOError:
                ep.poll(5)
        s.shutdown(socket.SHUT_WR)
        print("sent %d within 3 s: %s" % (off, time.time() - t0 < 3), flush=True)
    elif which == "shutrd":
        s = socket.create_connection((addr, port))
        s.shutdown(socket.SHUT_RD)
        s.settimeout(3)
        for when, pause in (("at once", 0), ("after 0.3 s", 0.3), ("after 1 s", 0.7)):
            time.sleep(pause)
            try:
                print("read %s: %r" % (when, s.recv(100)), flush=True)
            except socket.timeout:
                print("read %s: timeout" % when, flush=True)
        s.sendall(b"DATA\n")
        s.close()
    elif which == "shutrd-poll":
        s = socket.create_connection((addr, port))
        s.shutdown(socket.SHUT_RD)
        p = select.poll()
        p.register(s, select.POLLIN)
        t1 = time.time()
        ev = p.poll(3000)
        print("POLLIN shown within 0.2 s: %s" % (bool(ev and ev[0][1] & select.POLLIN)
                                                 and time.time() - t1 < 0.2), flush=True)
        print("read:", s.recv(100), flush=True)
        s.sendall(b"DATA\n")
        s.close()
    elif which in ("reset", "reset-write"):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        s.connect((addr, port))
        s.setblocking(False)
        off = 0
        while off < 1 << 20:
            try:
                off += s.send(b"x" * 65536)
            except BlockingIOError:
                break
        calls = ["read", "read again", "read once more"]
        if which == "reset-write":
            time.sleep(0.5)
            try:
                s.send(b"y" * 100)  # more or EAGAIN, as the buffers go: not printed
            except BlockingIOError:
                pass
            calls.insert(0, "write")
        time.sleep(2.0 if which == "reset" else 1.5)
        s.settimeout(3)
        for what in calls:
            try:
                got = s.send(b"z") if what == "write" else s.recv(100)
                print("%s: %r" % (what, got), flush=True)
            except OSError as e:
                print("%s: %s" % (what, e.__class__.__name__), flush=True)
    elif which == "fionread":
        s = socket.create_connection((addr, port))
        time.sleep(0.2)
        n = struct.unpack("i", fcntl.ioctl(s.fileno(), termios.FIONREAD, b"\0" * 4))[0]
        print("FIONREAD before the server writes:", n, flush=True)
        s.sendall(b"PING\n")
        print("reply:", s.recv(100), flush=True)
        s.close()
    elif which == "nbread":
        s = socket.create_connection((addr, port))
        time.sleep(0.2)
        s.setblocking(False)
        try:
            print("read:", s.recv(100), flush=True)
        except BlockingIOError:
            print("read: EAGAIN", flush=True)
        s.setblocking(True)
        s.sendall(b"PING\n")
        print("reply:", s.recv(100), flush=True)
        s.close()
    elif which == "shutrd-late":
        s = socket.create_connection((addr, port))
        time.sleep(0.2)
        s.shutdown(socket.SHUT_RD)
        signal.alarm(5)  # a blocking socket (no timeout): Python's would poll first
        print("read after SHUT_RD:", s.recv(100), flush=True)
        print("read again:", s.recv(100), flush=True)
        s.close()
    elif which in ("ping", "ping-late"):
        s = socket.create_connection((addr, port))
        time.sleep(0.2)
        s.sendall(b"PING\n")
        if which == "ping-late":
            time.sleep(0.5)
        s.settimeout(10 if which == "ping" else 5)
        said("reply:", lambda: s.recv(100))
        s.close()
    elif which == "readall":
        s = socket.create_connection((addr, port))
        s.settimeout(5)
        got = b""
        while (d := recv_or_timeout(s)) and d != b"<timeout>":
            got += d
        print("read all:", got + d, flush=True)
        s.close()
    elif which == "nul":
        s = socket.create_connection((addr, port))
        s.settimeout(5)
        print("greeting:", s.recv(100), flush=True)
        s.sendall(b"\0")
        time.sleep(1.5)
        s.sendall(b"x\n")
        s.close()
    elif which in ("errqueue", "errqueue-first", "errqueue-now", "errqueue-nb"):
        s = socket.socket()
        if which == "errqueue-first":
            s.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
        if which == "errqueue-nb":
            s.setblocking(False)
            s.connect_ex((addr, port))  # EINPROGRESS (or 0), as the kernel has it
            s.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
            select.select([], [s], [], 5)
            s.setblocking(True)
        else:
            s.connect((addr, port))
        if which in ("errqueue", "errqueue-first"):
            time.sleep(0.2)
        s.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
        s.send(b"PING\n", MSG_ZEROCOPY)
        time.sleep(0.2)
        print("error queue:", error_queue(s), flush=True)
        s.settimeout(5)
        print("reply:", s.recv(100), flush=True)
        s.close()
    elif which == "nulwait":
        s = socket.create_connection((addr, port))
        s.settimeout(5)
        s.sendall(b"\0")
        print("reply:", recv_or_timeout(s), flush=True)
        s.close()
    elif which == "lowat":
        def on_alarm(signum, frame):
            raise TimeoutError

        s = socket.create_connection((addr, port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 10)
        time.sleep(0.2)
        signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(5)
        try:
            got = s.recv(3)
        except TimeoutError:
            got = b"<hung>"
        signal.alarm(0)
        print("read:", got, flush=True)
        s.close()
    elif which == "waitall":
        s = socket.create_connection((addr, port))
        s.sendall(b"PING\n")
        signal.alarm(10)  # a blocking socket (no timeout): Python's would poll first
        got = s.recv(2000, socket.MSG_WAITALL)
        print("one read with MSG_WAITALL: %d bytes, as written: %s"
              % (len(got), got == b"a" * 1000 + b"b" * 1000), flush=True)
        rest = b""
        while d := s.recv(4096):
            rest += d
        print("then %d bytes and the end" % len(rest), flush=True)
        s.close()
    elif which == "endfirst":
        s = socket.create_connection((addr, port))
        s.settimeout(10)
        print("read:", s.recv(100), flush=True)
        s.sendall(b"PING\n")
        s.close()


if sys.argv[1] == "server":
    server(sys.argv[2], int(sys.argv[3]), sys.argv[4])
else:
    case(sys.argv[1], sys.argv[2], int(sys.argv[3]))
