/*
 * The transport's connections on a real device, without sockets: two
 * connections in one process, parameters exchanged directly as the
 * handshake would, then random data both ways at once through a receive
 * window small enough that credits run out all the time, checksums
 * compared, then end of stream both ways. Exits 77 without a device.
 */
#include <errno.h>
#include <ifaddrs.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <netinet/in.h>

#include "handshake/clock.h"
#include "shim/config.h"
#include "transport/conn.h"

static struct sockaddr_storage local_addr;

struct end {
	struct ss_conn *c;
	int evfd, wevfd; /* written by the ready hook: something changed (reader's, writer's) */
	struct ss_params mine;
	uint64_t seed;
	size_t total;
	uint64_t sent_sum, recv_sum;
	size_t recv_bytes;
	int write_calls_full; /* -EAGAIN seen on send */
};

static void on_ready(void *arg, unsigned ready)
{
	struct end *e = arg;
	uint64_t one = 1;

	(void)ready;
	if (write(e->evfd, &one, sizeof(one)) < 0 || write(e->wevfd, &one, sizeof(one)) < 0)
		abort();
}

static const struct ss_conn_hooks hooks = {.ready = on_ready};

static struct ss_worker *the_worker;

/*
 * Waits for a readiness report on fd, as the shim's blocking calls do: the
 * progress thread takes CQ events meanwhile. A lost report fails the test
 * instead of hanging it.
 */
static void wait_change(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	uint64_t v;

	ss_worker_event_users(the_worker, 1);
	assert_true(poll(&p, 1, 60000) == 1);
	ss_worker_event_users(the_worker, -1);
	assert_true(read(fd, &v, sizeof(v)) == sizeof(v));
}

static uint64_t xorshift(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* FNV-1a over the stream, so order matters. */
static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 1099511628211ull;
	return h;
}

static void *writer(void *arg)
{
	struct end *e = arg;
	static __thread uint8_t buf[70000];
	uint64_t rs = e->seed;
	size_t left = e->total;

	e->sent_sum = 1469598103934665603ull;
	while (left) {
		size_t n = 1 + xorshift(&rs) % sizeof(buf);
		if (n > left)
			n = left;
		for (size_t i = 0; i < n; i++)
			buf[i] = (uint8_t)xorshift(&rs);
		size_t off = 0;
		while (off < n) {
			struct iovec iov = {buf + off, n - off};
			ssize_t r = ss_conn_send(e->c, &iov, 1, false);
			if (r == -EAGAIN) {
				e->write_calls_full++;
				wait_change(e->wevfd);
				continue;
			}
			assert_true(r > 0);
			e->sent_sum = fnv(e->sent_sum, buf + off, (size_t)r);
			off += (size_t)r;
		}
		left -= n;
	}
	assert_int_equal(ss_conn_shutdown_wr(e->c), 0);
	return NULL;
}

static void *reader(void *arg)
{
	struct end *e = arg;
	static __thread uint8_t buf[70000];
	uint64_t rs = e->seed * 3 + 1;

	e->recv_sum = 1469598103934665603ull;
	for (;;) {
		size_t n = 1 + xorshift(&rs) % sizeof(buf);
		struct iovec iov = {buf, n};
		ssize_t r = ss_conn_recv(e->c, &iov, 1, false);
		if (r == -EAGAIN) {
			wait_change(e->evfd);
			continue;
		}
		assert_true(r >= 0);
		if (r == 0)
			break;
		e->recv_sum = fnv(e->recv_sum, buf, (size_t)r);
		e->recv_bytes += (size_t)r;
	}
	return NULL;
}

static struct ss_transport_cfg test_cfg(uint32_t window, uint32_t buf_size)
{
	return (struct ss_transport_cfg){
		.dev = {NULL, 0, -1},
		.sq_depth = 16,
		.rx_window = window,
		.buf_size = buf_size,
		.max_inline = 64,
		.ctrl_reserve = 2,
		/* a small SRQ: both sides' windows cannot all be backed, grants get held back */
		.srq_initial = 8,
		.srq_max = 16,
		.srq_hold = 2,
		.tx_pool_max = 256,
		/* Ready QPs, made meanwhile by the progress thread in the mode of the process's
		 * first connection (srq: the first test's) and taken by connections made like it.
		 */
		.qp_pool = 2,
	};
}

/* Two connections of this process connected to each other, as the handshake would. */
static void make_pair(struct ss_transport_cfg cfg, const uint8_t modes[2], struct end ends[2])
{
	struct ss_worker *w;
	enum ss_reason reason;

	assert_int_equal(ss_worker_get(&w), 0);
	the_worker = w;
	for (int i = 0; i < 2; i++) {
		ends[i].evfd = eventfd(0, EFD_CLOEXEC);
		ends[i].wevfd = eventfd(0, EFD_CLOEXEC);
		assert_true(ends[i].evfd >= 0 && ends[i].wevfd >= 0);
		cfg.recv_mode = modes[i];
		assert_int_equal(ss_conn_create(w, &cfg, (struct sockaddr *)&local_addr, &hooks,
						&ends[i], &ends[i].c, &ends[i].mine, &reason),
				 0);
	}
	for (int i = 0; i < 2; i++) {
		struct ss_msg peer = {.version = 1, .type = SS_MSG_HELLO, .params = ends[!i].mine};
		struct ss_agreement agr;

		assert_int_equal(ss_negotiate(&ends[i].mine, &peer, &agr), SS_REASON_NONE);
		assert_int_equal(ss_conn_connect(ends[i].c, &ends[!i].mine, &agr), 0);
	}
	for (int i = 0; i < 2; i++)
		ss_conn_start(ends[i].c);
}

static void destroy_pair(struct end ends[2])
{
	for (int i = 0; i < 2; i++) {
		ss_conn_destroy(ends[i].c);
		close(ends[i].evfd);
		close(ends[i].wevfd);
	}
}

/* modes: the receive model of each side (SS_RECV_RQ or SS_RECV_SRQ). */
static void stream_both_ways(const uint8_t modes[2], uint32_t window, uint32_t buf_size,
			     size_t bytes)
{
	const char *cap = getenv("SRQSHIM_TEST_BYTES");

	/* A sanitizer run caps the bytes (SRQSHIM_TEST_BYTES): the paths are the same. */
	if (cap && strtoull(cap, NULL, 0) < bytes)
		bytes = strtoull(cap, NULL, 0);
	struct end ends[2] = {{.seed = 12345}, {.seed = 999}};
	pthread_t th[4];

	ends[0].total = ends[1].total = bytes;
	make_pair(test_cfg(window, buf_size), modes, ends);
	for (int i = 0; i < 2; i++) {
		pthread_create(&th[2 * i], NULL, writer, &ends[i]);
		pthread_create(&th[2 * i + 1], NULL, reader, &ends[i]);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 2; i++) {
		struct ss_conn_stats st;

		assert_int_equal(ss_conn_drain(ends[i].c, 60000), 0);
		ss_conn_get_stats(ends[i].c, &st);
		printf("rdma_conn: %s/%s, window %u, %u-byte buffers: side %d sent %llu B in %llu "
		       "msgs, "
		       "grants %llu/%llu, requests %llu/%llu, send buffer full %d times\n",
		       modes[0] == SS_RECV_SRQ ? "srq" : "rq",
		       modes[1] == SS_RECV_SRQ ? "srq" : "rq", window, buf_size, i,
		       (unsigned long long)st.tx_bytes, (unsigned long long)st.tx_msgs,
		       (unsigned long long)st.grants_sent, (unsigned long long)st.grants_received,
		       (unsigned long long)st.requests_sent,
		       (unsigned long long)st.requests_received, ends[i].write_calls_full);
		assert_int_equal(st.tx_bytes, bytes);
		assert_true(st.grants_received > 0);
	}
	for (int i = 0; i < 2; i++) {
		assert_int_equal(ends[!i].recv_bytes, bytes);
		assert_true(ends[!i].recv_sum == ends[i].sent_sum);
	}
	destroy_pair(ends);
}

/* getrandom, as the transport sees it (linked into this test): it can be made to fail. */
static int fail_getrandom;

ssize_t getrandom(void *buf, size_t len, unsigned flags)
{
	if (fail_getrandom) {
		errno = EIO;
		return -1;
	}
	return syscall(SYS_getrandom, buf, len, flags);
}

/* Resources of kind ("mr", "qp", "cq") this process holds, as the kernel counts them. */
static int count_res(const char *kind)
{
	char cmd[128], line[512];
	int n = 0;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "rdma res show %s", kind);
	f = popen(cmd, "r");
	assert_non_null(f);
	snprintf(cmd, sizeof(cmd), " pid %d ", (int)getpid());
	while (fgets(line, sizeof(line), f))
		n += strstr(line, cmd) != NULL;
	pclose(f);
	return n;
}

/* Waits (up to 5 s) until no ready-QP refill is due: the pool is full, or was never started. */
static void pool_settle(struct ss_worker *w, uint32_t want)
{
	struct ss_worker_stats st;

	for (int i = 0; i < 500; i++) {
		ss_worker_get_stats(w, &st);
		if (st.qp_ready == want || st.qp_taken + st.qp_own == 0)
			return;
		usleep(10000);
	}
	fail_msg("the QP pool holds %u ready QPs, not %u", st.qp_ready, want);
}

/* A connection that cannot be made (no random PSN) leaves nothing behind. */
static void test_create_failure_leaks_nothing(void **state)
{
	struct ss_transport_cfg cfg = test_cfg(16, 8192);
	struct ss_params mine;
	struct ss_conn *c = NULL;
	struct ss_worker *w;
	enum ss_reason reason;
	int mrs, qps, cqs;

	(void)state;
	assert_int_equal(ss_worker_get(&w), 0);
	for (int m = 0; m < 2; m++) {
		cfg.recv_mode = m ? SS_RECV_SRQ : SS_RECV_RQ;
		pool_settle(w, cfg.qp_pool);
		mrs = count_res("mr");
		qps = count_res("qp");
		cqs = count_res("cq");
		fail_getrandom = 1;
		assert_true(ss_conn_create(w, &cfg, (struct sockaddr *)&local_addr, &hooks, NULL,
					   &c, &mine, &reason) < 0);
		fail_getrandom = 0;
		assert_int_equal(reason, SS_REASON_RESOURCE);
		assert_int_equal(count_res("mr"), mrs);
		assert_int_equal(count_res("qp"), qps);
		assert_int_equal(count_res("cq"), cqs);
	}
}

/* Reads n bytes from e within timeout_ms (reports wake the wait); returns the count read. */
static size_t read_within(struct end *e, uint8_t *buf, size_t n, int timeout_ms)
{
	uint64_t end = ss_now_ms() + (uint64_t)timeout_ms;
	size_t got = 0;

	while (got < n && ss_now_ms() < end) {
		struct iovec iov = {buf + got, n - got};
		ssize_t r = ss_conn_recv(e->c, &iov, 1, false);
		struct pollfd p = {.fd = e->evfd, .events = POLLIN};
		uint64_t v;

		if (r > 0) {
			got += (size_t)r;
			continue;
		}
		assert_int_equal(r, -EAGAIN);
		ss_worker_event_users(the_worker, 1);
		if (poll(&p, 1, 50) == 1)
			assert_true(read(e->evfd, &v, sizeof(v)) == sizeof(v));
		ss_worker_event_users(the_worker, -1);
	}
	return got;
}

/*
 * Lifecycle: a connection destroyed while its timer is armed must not take
 * other connections' timers with it. Two corked writes (MSG_MORE: held
 * until the 200 ms cork timer), then the second writer is destroyed; the
 * first one's bytes must still go out on its timer.
 */
static void test_timer_survives_destroyed_neighbour(void **state)
{
	const uint8_t modes[2] = {SS_RECV_SRQ, SS_RECV_SRQ};
	struct end a[2] = {{0}}, b[2] = {{0}};
	uint8_t msg[100], got[100];
	struct iovec iov = {msg, sizeof(msg)};

	(void)state;
	memset(msg, 0x5a, sizeof(msg));
	make_pair(test_cfg(16, 8192), modes, b);
	make_pair(test_cfg(16, 8192), modes, a);
	assert_int_equal(ss_conn_send(b[0].c, &iov, 1, true), sizeof(msg));
	assert_int_equal(ss_conn_send(a[0].c, &iov, 1, true), sizeof(msg));
	destroy_pair(a);
	assert_int_equal(read_within(&b[1], got, sizeof(got), 3000), sizeof(got));
	assert_memory_equal(msg, got, sizeof(got));
	destroy_pair(b);
}

/*
 * conn_put_front: bytes that came before the connection (a move from TCP)
 * are read before everything the peer sent, also when the peer filled its
 * whole window before they were put there; one such buffer at a time; and
 * reading them gives the peer no credit, so the stream goes on in order.
 */
static void put_front_case(const uint8_t modes[2])
{
	enum { WINDOW = 4, MSG = 100, FRONT = 50 };
	struct end e[2] = {{0}};
	uint8_t msg[MSG], got[FRONT + (WINDOW + 8) * MSG], *front = malloc(FRONT),
							   *again = malloc(1);
	size_t n = 0;

	assert_non_null(front);
	assert_non_null(again);
	memset(front, 'F', FRONT);
	make_pair(test_cfg(WINDOW, 8192), modes, e);
	for (int i = 0; i < WINDOW; i++) {
		struct iovec iov = {msg, MSG};

		memset(msg, 'a' + i, MSG);
		assert_int_equal(ss_conn_send(e[0].c, &iov, 1, false), MSG);
	}
	/* The peer's window is full here before the front bytes go in. */
	for (int i = 0; i < 300 && ss_conn_readable(e[1].c) < WINDOW * MSG; i++) {
		ss_worker_poll(the_worker); /* the completions are taken by whoever polls */
		usleep(10000);
	}
	assert_int_equal(ss_conn_readable(e[1].c), WINDOW * MSG);
	assert_int_equal(ss_conn_put_front(e[1].c, front, FRONT), 0);
	assert_int_equal(ss_conn_put_front(e[1].c, again, 1), -EBUSY);
	assert_int_equal(ss_conn_readable(e[1].c), FRONT + WINDOW * MSG);
	/* More after it: the stream goes on behind what was there. */
	for (int i = WINDOW; i < WINDOW + 8; i++) {
		size_t off = 0;

		memset(msg, 'a' + i, MSG);
		while (off < MSG) {
			struct iovec iov = {msg + off, MSG - off};
			ssize_t r = ss_conn_send(e[0].c, &iov, 1, false);

			if (r > 0)
				off += (size_t)r;
			else
				n += read_within(&e[1], got + n, 1, 100); /* credits come back */
		}
	}
	n += read_within(&e[1], got + n, sizeof(got) - n, 5000);
	assert_int_equal(n, sizeof(got));
	for (size_t i = 0; i < FRONT; i++)
		assert_int_equal(got[i], 'F');
	for (size_t i = FRONT; i < sizeof(got); i++)
		assert_int_equal(got[i], 'a' + (i - FRONT) / MSG);
	destroy_pair(e);
}

static void test_put_front_rq(void **state)
{
	const uint8_t modes[2] = {SS_RECV_RQ, SS_RECV_RQ};

	(void)state;
	put_front_case(modes);
}

static void test_put_front_srq(void **state)
{
	const uint8_t modes[2] = {SS_RECV_SRQ, SS_RECV_SRQ};

	(void)state;
	put_front_case(modes);
}

static const uint8_t rq_rq[2] = {SS_RECV_RQ, SS_RECV_RQ};
static const uint8_t srq_srq[2] = {SS_RECV_SRQ, SS_RECV_SRQ};
static const uint8_t srq_rq[2] = {SS_RECV_SRQ, SS_RECV_RQ};

static void test_stream_small_window(void **state)
{
	(void)state;
	stream_both_ways(rq_rq, 2, 1024, 8u << 20);
}

static void test_stream_default_like(void **state)
{
	(void)state;
	stream_both_ways(rq_rq, 64, 8192, 32u << 20);
}

/* Windows of 16 on both sides into a shared pool of 8 to 16 buffers. */
static void test_stream_srq_small_pool(void **state)
{
	(void)state;
	stream_both_ways(srq_srq, 16, 8192, 16u << 20);
}

static void test_stream_srq_with_rq(void **state)
{
	(void)state;
	stream_both_ways(srq_rq, 16, 4096, 8u << 20);
}

/*
 * The pool's last receives when the limit event is missed. The SRQ has 8
 * receives, its bound; a's receiver never reads and keeps every message
 * (hold 16). Its first 8 drain the SRQ; the limit event's work copies them
 * out and reposts, but waits 300 ms (test_rearm_ms) before it arms the
 * limit, while a's other 8 land: armed below the limit, rxe raises no
 * event again. b's first message must still land: the completions that
 * leave the SRQ low queue the same work (ss_srq_taken). Run in a process
 * of its own (rdma_conn srq-low): a process's SRQ has its first srq
 * connection's settings.
 */
static void test_srq_low_missed_event(void **state)
{
	struct ss_transport_cfg cfg = test_cfg(16, 8192);
	static uint8_t flood[16 * 8192];
	uint8_t msg[64], got[64];
	struct iovec iov = {flood, sizeof(flood)}, miov = {msg, sizeof(msg)};
	struct end a[2] = {{0}}, b[2] = {{0}};

	(void)state;
	cfg.srq_initial = 8;
	cfg.srq_max = 8;
	cfg.srq_hold = 16;
	cfg.sq_depth = 32; /* a's 16 messages all posted at once */
	cfg.test_rearm_ms = 300;
	make_pair(cfg, srq_srq, a);
	make_pair(cfg, srq_srq, b);
	assert_int_equal(ss_conn_send(a[0].c, &iov, 1, false), sizeof(flood));
	usleep(1000 * 1000); /* a's 16 messages land, or wait for receives */
	memset(msg, 0x3c, sizeof(msg));
	assert_int_equal(ss_conn_send(b[0].c, &miov, 1, false), sizeof(msg));
	assert_int_equal(read_within(&b[1], got, sizeof(got), 3000), sizeof(got));
	assert_memory_equal(msg, got, sizeof(got));
	destroy_pair(b);
	destroy_pair(a);
}

/* Runs test_srq_low_missed_event in a new process (this program, "srq-low"). */
static void test_srq_low_own_process(void **state)
{
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	int status;
	pid_t pid;

	(void)state;
	assert_true(n > 0);
	self[n] = '\0';
	pid = fork();
	if (pid == 0) {
		execl(self, self, "srq-low", (char *)NULL);
		_exit(127);
	}
	assert_true(pid > 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

static int find_address(void)
{
	struct ifaddrs *ifa_list;
	int ret = 77;

	if (getifaddrs(&ifa_list) != 0)
		return 1;
	for (struct ifaddrs *ifa = ifa_list; ifa; ifa = ifa->ifa_next) {
		const struct sockaddr_in *sin = (const struct sockaddr_in *)ifa->ifa_addr;
		if (!sin || sin->sin_family != AF_INET || ntohl(sin->sin_addr.s_addr) >> 24 == 127)
			continue;
		memcpy(&local_addr, sin, sizeof(*sin));
		ret = 0;
		break;
	}
	freeifaddrs(ifa_list);
	return ret;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stream_srq_small_pool),
		cmocka_unit_test(test_stream_small_window),
		cmocka_unit_test(test_stream_default_like),
		cmocka_unit_test(test_stream_srq_with_rq),
		cmocka_unit_test(test_timer_survives_destroyed_neighbour),
		cmocka_unit_test(test_put_front_rq),
		cmocka_unit_test(test_put_front_srq),
		cmocka_unit_test(test_create_failure_leaks_nothing),
		cmocka_unit_test(test_srq_low_own_process),
	};
	const struct CMUnitTest srq_low[] = {
		cmocka_unit_test(test_srq_low_missed_event),
	};

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (access("/sys/class/infiniband", F_OK) != 0) {
		printf("rdma_conn: no RDMA device on this host; skipping\n");
		return 77;
	}
	if (find_address() != 0) {
		fprintf(stderr, "rdma_conn: no non-loopback IPv4 address\n");
		return 1;
	}
	if (argc > 1 && strcmp(argv[1], "srq-low") == 0)
		return cmocka_run_group_tests(srq_low, NULL, NULL);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
