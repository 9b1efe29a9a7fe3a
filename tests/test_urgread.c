/*
 * handshake/urgread.c on loopback TCP, no device: a read never takes a byte
 * from behind the peer's urgent mark and never loses the mark, whatever
 * comes when (the rules of docs/design.md, "Planned: connections that
 * start on TCP"). Each row: what the peer sends, then the reads and what
 * each must find; a row may have the peer send more between a read's
 * peek and its take.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <arpa/inet.h>
#include <cmocka.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "handshake/urgread.h"
#include "tests/tcp_loop.h"

enum act_kind { ACT_END, ACT_DATA, ACT_URG, ACT_SHUT };
struct act {
	enum act_kind kind;
	const char *data;
};

enum step_kind { STEP_END, STEP_READ, STEP_RAW };
struct step {
	enum step_kind kind;
	int flags;
	enum ss_urg_look look;
	size_t len; /* 0: 64 */
	int ret;    /* an ss_urg_result or -EAGAIN; for STEP_RAW the recv's count, -1 for EAGAIN */
	const char *bytes;
};

struct row {
	const char *name;
	struct act before[4]; /* sent before the first read */
	struct act
		between[4]; /* sent inside the first read's window, between its peek and its take */
	struct step steps[6];
};

/* clang-format off */
#define D(s) {ACT_DATA, s}
#define U {ACT_URG, NULL}
#define SHUT {ACT_SHUT, NULL}
#define QUIET(r, b) {STEP_READ, 0, SS_URG_LOOK_EMPTY, 0, r, b}
#define SWITCHING(r, b) {STEP_READ, 0, SS_URG_LOOK_EACH, 0, r, b}
#define BLIND(r, b) {STEP_READ, 0, SS_URG_LOOK_END, 0, r, b}
#define RAW(n, b) {STEP_RAW, 0, SS_URG_LOOK_EMPTY, 0, n, b}
#define SHOWN(r, b) {STEP_READ, 0, SS_URG_LOOK_SHOWN, 0, r, b}
/* clang-format on */

static const struct row rows[] = {
	{"bytes", {D("hello")}, {}, {QUIET(SS_URG_BYTES, "hello"), QUIET(-EAGAIN, NULL)}},
	{"a lone mark is found and stays until a plain read passes it",
	 {U},
	 {},
	 {QUIET(SS_URG_AT_MARK, NULL), QUIET(SS_URG_AT_MARK, NULL), RAW(-1, NULL),
	  QUIET(-EAGAIN, NULL)}},
	{"bytes, then a lone mark",
	 {D("AAAA"), U},
	 {},
	 {QUIET(SS_URG_BYTES, "AAAA"), QUIET(SS_URG_AT_MARK, NULL)}},
	{"looking only at the end: a lone mark says EAGAIN and stays for a look",
	 {D("AAAA"), U},
	 {},
	 {BLIND(SS_URG_BYTES, "AAAA"), BLIND(-EAGAIN, NULL), BLIND(-EAGAIN, NULL),
	  QUIET(SS_URG_AT_MARK, NULL)}},
	{"looking only at the end: the end is still looked at",
	 {D("x"), SHUT},
	 {},
	 {BLIND(SS_URG_BYTES, "x"), BLIND(SS_URG_BYTES, "")}},
	{"a small buffer reads up to the mark, not past it",
	 {D("abcdef"), U},
	 {},
	 {{STEP_READ, 0, false, 4, SS_URG_BYTES, "abcd"},
	  QUIET(SS_URG_BYTES, "ef"),
	  QUIET(SS_URG_AT_MARK, NULL)}},
	{"switching: bytes, the mark, a handshake behind it",
	 {D("AAAA"), U, D("HS")},
	 {},
	 {SWITCHING(SS_URG_BYTES, "AAAA"), SWITCHING(SS_URG_AT_MARK, NULL), RAW(2, "HS")}},
	{"switching: the mark and a handshake at the head",
	 {U, D("HS")},
	 {},
	 {SWITCHING(SS_URG_AT_MARK, NULL), RAW(2, "HS")}},
	{"MSG_PEEK takes nothing",
	 {D("abc")},
	 {},
	 {{STEP_READ, MSG_PEEK, false, 0, SS_URG_BYTES, "abc"},
	  QUIET(SS_URG_BYTES, "abc"),
	  QUIET(-EAGAIN, NULL)}},
	{"end of stream", {D("x"), SHUT}, {}, {QUIET(SS_URG_BYTES, "x"), QUIET(SS_URG_BYTES, "")}},
	{"a lone mark, then end of stream: the mark first",
	 {U, SHUT},
	 {},
	 {QUIET(SS_URG_AT_MARK, NULL)}},
	{"a mark that comes between the peek and the take",
	 {D("AAAA")},
	 {U},
	 {QUIET(SS_URG_BYTES, "AAAA"), QUIET(SS_URG_AT_MARK, NULL)}},
	{"switching: a mark and a handshake between the peek and the take",
	 {D("AAAA")},
	 {U, D("HS")},
	 {SWITCHING(SS_URG_BYTES, "AAAA"), SWITCHING(SS_URG_AT_MARK, NULL), RAW(2, "HS")}},
	{"shown (bytes, no mark): one recv reads up to a mark behind them; the mark stays",
	 {D("AAAA"), U},
	 {},
	 {SHOWN(SS_URG_BYTES, "AAAA"), QUIET(SS_URG_AT_MARK, NULL), QUIET(SS_URG_AT_MARK, NULL)}},
	{"shown, a small buffer: up to the mark in two reads",
	 {D("abcdef"), U},
	 {},
	 {{STEP_READ, 0, SS_URG_LOOK_SHOWN, 4, SS_URG_BYTES, "abcd"},
	  SHOWN(SS_URG_BYTES, "ef"),
	  QUIET(SS_URG_AT_MARK, NULL)}},
	{"shown, the end: read as the end",
	 {D("x"), SHUT},
	 {},
	 {SHOWN(SS_URG_BYTES, "x"), SHOWN(SS_URG_BYTES, "")}},
	{"why a mark at the head voids a showing: a recv there passes it, and it is lost",
	 {U, SHUT},
	 {},
	 {SHOWN(SS_URG_BYTES, ""), QUIET(SS_URG_BYTES, "")}},
	{"bytes that come between the peek and the take wait for the next read",
	 {D("AAAA")},
	 {D("BBBB")},
	 {QUIET(SS_URG_BYTES, "AAAA"), QUIET(SS_URG_BYTES, "BBBB")}},
};

static int peer_fd = -1;
static const struct act *pending_between;

static void run_acts(int fd, const struct act *a)
{
	for (; a->kind != ACT_END; a++) {
		switch (a->kind) {
		case ACT_DATA:
			assert_int_equal(send(fd, a->data, strlen(a->data), 0),
					 (ssize_t)strlen(a->data));
			break;
		case ACT_URG: assert_int_equal(send(fd, "U", 1, MSG_OOB), 1); break;
		case ACT_SHUT: assert_int_equal(shutdown(fd, SHUT_WR), 0); break;
		default: break;
		}
	}
	/* Loopback delivers inside send; the pause only makes that not matter. */
	usleep(20000);
}

static void between_hook(int fd)
{
	(void)fd;
	if (pending_between) {
		run_acts(peer_fd, pending_between);
		pending_between = NULL;
	}
}

static void run_step(const struct row *r, int i, int fd)
{
	const struct step *st = &r->steps[i];
	char buf[64];
	size_t got = 0;

	if (st->kind == STEP_RAW) {
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (n != st->ret || (n > 0 && memcmp(buf, st->bytes, (size_t)n) != 0))
			fail_msg("%s, step %d: a plain recv gave %zd '%.*s', not %d '%s'", r->name,
				 i, n, (int)(n > 0 ? n : 0), buf, st->ret,
				 st->bytes ? st->bytes : "");
		return;
	}
	int ret = ss_urg_recv(&tcp_loop_io, fd, buf, st->len ? st->len : sizeof(buf), st->flags,
			      st->look, &got);

	if (ret != st->ret)
		fail_msg("%s, step %d: ss_urg_recv gave %d (%.*s), not %d", r->name, i, ret,
			 (int)(ret == SS_URG_BYTES ? got : 0), buf, st->ret);
	if (ret == SS_URG_BYTES && (got != strlen(st->bytes) || memcmp(buf, st->bytes, got) != 0))
		fail_msg("%s, step %d: read '%.*s', not '%s'", r->name, i, (int)got, buf,
			 st->bytes);
}

static void test_rows(void **state)
{
	(void)state;
	ss_urg_between_hook = between_hook;
	for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
		int me;

		tcp_loop_pair(&peer_fd, &me);
		run_acts(peer_fd, rows[r].before);
		pending_between = rows[r].between[0].kind != ACT_END ? rows[r].between : NULL;
		for (int i = 0; rows[r].steps[i].kind != STEP_END; i++)
			run_step(&rows[r], i, me);
		if (pending_between)
			fail_msg("%s: no read had a window for what comes between", rows[r].name);
		close(me);
		close(peer_fd);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_rows)};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
