/* Table-driven tests of the HELLO codec and the negotiation rules. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <arpa/inet.h>
#include <cmocka.h>
#include <netinet/in.h>

#include "handshake/gid.h"
#include "handshake/hello.h"
#include "handshake/negotiate.h"

static const struct ss_params good_params = {
	.caps = SS_CAP_DATA_V1,
	.recv_mode = SS_RECV_SRQ,
	.mtu = 3,
	.sq_depth = 64,
	.qpn = 0x123456,
	.psn = 0xabcdef,
	.gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1},
	.buf_size = 8192,
	.window = 32,
};

/* A valid HELLO as the starting point of every mutation. */
static size_t make_hello(uint8_t *buf, size_t len)
{
	struct ss_msg m = {.type = SS_MSG_HELLO, .nonce = 0x01020304, .params = good_params};
	int n = ss_msg_encode(&m, buf, len);

	assert_int_equal(n, 64);
	return (size_t)n;
}

struct patch {
	size_t off;
	size_t n;
	uint8_t bytes[8];
};

struct decode_case {
	const char *what;
	struct patch patch[2]; /* applied in order; n == 0 ends */
	size_t append;         /* bytes appended (an extension record), see ext */
	uint8_t ext[12];
	long truncate; /* < 0: keep the length; else cut to this many bytes */
	enum ss_dec_result want;
	size_t want_used; /* for OK and SHORT */
};

/* Header offsets: magic 0-7, version 8, type 9, length 10-11, nonce 12-15. */
/* Params at 16: caps 16, recv_mode 20, mtu 21, sq 22, qpn 24, psn 28, gid 32, buf 48, win 52. */
/* clang-format off */
static const struct decode_case decode_cases[] = {
	{"valid", {{0}}, 0, {0}, -1, SS_DEC_OK, 64},
	{"empty buffer", {{0}}, 0, {0}, 0, SS_DEC_SHORT, 16},
	{"one byte of magic", {{0}}, 0, {0}, 1, SS_DEC_SHORT, 16},
	{"magic only", {{0}}, 0, {0}, 8, SS_DEC_SHORT, 16},
	{"header only", {{0}}, 0, {0}, 16, SS_DEC_SHORT, 64},
	{"one byte short", {{0}}, 0, {0}, 63, SS_DEC_SHORT, 64},
	{"first byte foreign", {{0, 1, {'G'}}}, 0, {0}, 1, SS_DEC_FOREIGN},
	{"HTTP request", {{0, 8, {'G', 'E', 'T', ' ', '/', ' ', 'H', 'T'}}}, 0, {0}, -1,
	 SS_DEC_FOREIGN},
	{"RESP command", {{0, 4, {'*', '1', '\r', '\n'}}}, 0, {0}, 4, SS_DEC_FOREIGN},
	{"last magic byte wrong", {{7, 1, {0xa4}}}, 0, {0}, -1, SS_DEC_FOREIGN},
	{"version 0", {{8, 1, {0}}}, 0, {0}, -1, SS_DEC_UNSUPPORTED},
	{"newer version, v1 layout", {{8, 1, {7}}}, 0, {0}, -1, SS_DEC_OK, 64},
	{"unknown type", {{9, 1, {10}}}, 0, {0}, -1, SS_DEC_MALFORMED},
	{"type 0", {{9, 1, {0}}}, 0, {0}, -1, SS_DEC_MALFORMED},
	{"length below the header", {{10, 2, {0, 8}}}, 0, {0}, -1, SS_DEC_MALFORMED},
	{"length below the body", {{10, 2, {0, 63}}}, 0, {0}, -1, SS_DEC_MALFORMED},
	{"oversized length", {{10, 2, {0x02, 0x01}}}, 0, {0}, -1, SS_DEC_MALFORMED},
	{"length 65535", {{10, 2, {0xff, 0xff}}}, 0, {0}, 16, SS_DEC_MALFORMED},
	{"unknown capability bits", {{16, 4, {0xff, 0xff, 0xff, 0xfe}}}, 0, {0}, -1, SS_DEC_OK,
	 64},
	{"receive mode 0", {{20, 1, {0}}}, 0, {0}, -1, SS_DEC_MALFORMED},
	{"receive mode 3", {{20, 1, {3}}}, 0, {0}, -1, SS_DEC_MALFORMED},
	{"MTU 0", {{21, 1, {0}}}, 0, {0}, -1, SS_DEC_MALFORMED},
	{"MTU 6", {{21, 1, {6}}}, 0, {0}, -1, SS_DEC_MALFORMED},
	{"QPN 0", {{24, 4, {0, 0, 0, 0}}}, 0, {0}, -1, SS_DEC_MALFORMED},
	{"QPN over 24 bits", {{24, 4, {1, 0, 0, 1}}}, 0, {0}, -1, SS_DEC_MALFORMED},
	{"PSN over 24 bits", {{28, 4, {0x80, 0, 0, 0}}}, 0, {0}, -1, SS_DEC_MALFORMED},
	{"reserved bytes set", {{56, 8, {1, 2, 3, 4, 5, 6, 7, 8}}}, 0, {0}, -1, SS_DEC_OK, 64},
	{"optional extension skipped", {{10, 2, {0, 72}}}, 8, {0x00, 0x42, 0, 4, 1, 2, 3, 4}, -1,
	 SS_DEC_OK, 72},
	{"critical extension refused", {{10, 2, {0, 72}}}, 8, {0x80, 0x42, 0, 4, 1, 2, 3, 4}, -1,
	 SS_DEC_UNSUPPORTED},
	{"extension value past the end", {{10, 2, {0, 72}}}, 8, {0x00, 0x42, 0, 5, 1, 2, 3, 4}, -1,
	 SS_DEC_MALFORMED},
	{"partial extension header", {{10, 2, {0, 66}}}, 2, {0x00, 0x42}, -1, SS_DEC_MALFORMED},
	{"extension not yet arrived", {{10, 2, {0, 72}}}, 8, {0x00, 0x42, 0, 4, 1, 2, 3, 4}, 70,
	 SS_DEC_SHORT, 72},
};
/* clang-format on */

static void test_decode_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(decode_cases) / sizeof(decode_cases[0]); i++) {
		const struct decode_case *c = &decode_cases[i];
		uint8_t buf[SS_HELLO_MAX_LEN + 64];
		struct ss_msg msg, untouched;
		size_t len = make_hello(buf, sizeof(buf)), used = 12345;
		enum ss_dec_result got;

		for (int p = 0; p < 2 && c->patch[p].n; p++)
			memcpy(buf + c->patch[p].off, c->patch[p].bytes, c->patch[p].n);
		memcpy(buf + len, c->ext, c->append);
		len += c->append;
		if (c->truncate >= 0)
			len = (size_t)c->truncate;
		memset(&msg, 0x5a, sizeof(msg));
		untouched = msg;
		got = ss_msg_decode(buf, len, &msg, &used);
		print_message("%-32s -> %s (%zu)\n", c->what, ss_dec_result_str(got), used);
		assert_int_equal(got, c->want);
		if (got == SS_DEC_OK || got == SS_DEC_SHORT)
			assert_int_equal(used, c->want_used);
		if (got != SS_DEC_OK) {
			assert_memory_equal(&msg, &untouched, sizeof(msg));
			continue;
		}
		assert_int_equal(msg.type, SS_MSG_HELLO);
		assert_int_equal(msg.nonce, 0x01020304);
		assert_int_equal(msg.params.qpn, good_params.qpn);
		assert_int_equal(msg.params.psn, good_params.psn);
		assert_memory_equal(msg.params.gid, good_params.gid, 16);
	}
}

static void test_round_trip_every_type(void **state)
{
	static const struct ss_msg msgs[] = {
		{.type = SS_MSG_HELLO, .nonce = 1, .params = good_params},
		{.type = SS_MSG_ACK, .nonce = 2},
		{.type = SS_MSG_ACCEPT, .nonce = 3, .params = good_params},
		{.type = SS_MSG_DECLINE, .nonce = 4, .reason = SS_REASON_RESOURCE},
		{.type = SS_MSG_READY, .nonce = 0xffffffff},
		{.type = SS_MSG_SWITCH, .nonce = 5},
		{.type = SS_MSG_RETURN, .nonce = 6, .count = SS_RETURN_MAX},
		{.type = SS_MSG_LOST, .nonce = 7},
		{.type = SS_MSG_RETURN,
		 .nonce = 8,
		 .count = 3,
		 .has_received = true,
		 .received = 0x0102030405060708ull},
		{.type = SS_MSG_LATER, .nonce = 9},
	};
	static const int lens[] = {64, 16, 64, 20, 16, 16, 24, 16, 36, 16};

	(void)state;
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		uint8_t buf[SS_HELLO_MAX_LEN];
		struct ss_msg out;
		size_t used;
		int n = ss_msg_encode(&msgs[i], buf, sizeof(buf));

		assert_int_equal(n, lens[i]);
		assert_memory_equal(buf, SS_HELLO_MAGIC, SS_HELLO_MAGIC_LEN);
		assert_int_equal(ss_msg_decode(buf, (size_t)n, &out, &used), SS_DEC_OK);
		assert_int_equal(used, (size_t)n);
		assert_int_equal(out.version, SS_HELLO_VERSION);
		assert_int_equal(out.type, msgs[i].type);
		assert_int_equal(out.nonce, msgs[i].nonce);
		assert_int_equal(out.reason, msgs[i].reason);
		assert_int_equal(out.count, msgs[i].count);
		assert_int_equal(out.has_received, msgs[i].has_received);
		assert_int_equal(out.received, msgs[i].received);
		assert_memory_equal(&out.params, &msgs[i].params, sizeof(out.params));
		/* Every shorter prefix asks for more, never more than the whole. */
		for (size_t cut = 0; cut < (size_t)n; cut++) {
			assert_int_equal(ss_msg_decode(buf, cut, &out, &used), SS_DEC_SHORT);
			assert_true(used > cut && used <= (size_t)n);
		}
		/* Bytes after the message are left alone. */
		memcpy(buf + n, "trailing", 8);
		assert_int_equal(ss_msg_decode(buf, (size_t)n + 8, &out, &used), SS_DEC_OK);
		assert_int_equal(used, (size_t)n);
	}
}

static void test_encode_refuses_bad_fields(void **state)
{
	uint8_t buf[SS_HELLO_MAX_LEN];
	struct ss_msg m = {.type = SS_MSG_HELLO, .params = good_params};

	(void)state;
	assert_int_equal(ss_msg_encode(&m, buf, 63), -ENOSPC);
	m.params.mtu = 6;
	assert_int_equal(ss_msg_encode(&m, buf, sizeof(buf)), -EINVAL);
	m.params = good_params;
	m.params.qpn = 1u << 24;
	assert_int_equal(ss_msg_encode(&m, buf, sizeof(buf)), -EINVAL);
	m.params = good_params;
	m.type = 77;
	assert_int_equal(ss_msg_encode(&m, buf, sizeof(buf)), -EINVAL);
	m.type = SS_MSG_RETURN;
	m.count = SS_RETURN_MAX + 1;
	assert_int_equal(ss_msg_encode(&m, buf, sizeof(buf)), -EINVAL);
}

/* A RETURN that announces more than SS_RETURN_MAX bytes is malformed, not a wait for them. */
static void test_return_bound(void **state)
{
	uint8_t buf[SS_HELLO_MAX_LEN];
	struct ss_msg m = {.type = SS_MSG_RETURN, .nonce = 9, .count = 1};
	size_t used;
	int n = ss_msg_encode(&m, buf, sizeof(buf));

	(void)state;
	assert_int_equal(n, 24);
	buf[16] = 0x7f; /* count 0x7f000001 */
	assert_int_equal(ss_msg_decode(buf, (size_t)n, &m, &used), SS_DEC_MALFORMED);
}

/*
 * RETURN's `received` is an optional extension: a decoder that knows it
 * reads it, checks its length, and a RETURN without it still decodes.
 */
static void test_return_received(void **state)
{
	uint8_t buf[SS_HELLO_MAX_LEN];
	struct ss_msg m = {.type = SS_MSG_RETURN, .nonce = 9, .has_received = true, .received = 5};
	size_t used;
	int n = ss_msg_encode(&m, buf, sizeof(buf));

	(void)state;
	assert_int_equal(n, 36);
	assert_int_equal(buf[27], 8); /* extension length */
	assert_int_equal(buf[35], 5); /* big endian */
	assert_int_equal(ss_msg_decode(buf, (size_t)n, &m, &used), SS_DEC_OK);
	assert_true(m.has_received);
	assert_int_equal(m.received, 5);
	/* A received field of another length is malformed. */
	buf[27] = 4;
	buf[11] = 32; /* the message's length */
	assert_int_equal(ss_msg_decode(buf, 32, &m, &used), SS_DEC_MALFORMED);
	/* An unknown optional extension in its place is skipped. */
	buf[25] = 2;
	assert_int_equal(ss_msg_decode(buf, 32, &m, &used), SS_DEC_OK);
	assert_false(m.has_received);
	/* Without it (an older peer), nothing says what came over RDMA. */
	m = (struct ss_msg){.type = SS_MSG_RETURN, .nonce = 9};
	n = ss_msg_encode(&m, buf, sizeof(buf));
	assert_int_equal(n, 24);
	assert_int_equal(ss_msg_decode(buf, (size_t)n, &m, &used), SS_DEC_OK);
	assert_false(m.has_received);
}

struct nego_case {
	const char *what;
	uint8_t version;
	uint32_t caps;
	uint8_t mtu;
	uint32_t buf_size, window;
	uint16_t sq_depth;
	enum ss_reason want;
	uint8_t want_mtu;
};

static const struct nego_case nego_cases[] = {
	{"equal", 1, SS_CAP_DATA_V1, 3, 8192, 32, 64, SS_REASON_NONE, 3},
	{"peer MTU smaller", 1, SS_CAP_DATA_V1, 1, 8192, 32, 64, SS_REASON_NONE, 1},
	{"peer MTU larger", 1, SS_CAP_DATA_V1, 5, 8192, 32, 64, SS_REASON_NONE, 3},
	{"newer peer, extra caps", 4, 0xffffffff, 3, 8192, 32, 64, SS_REASON_NONE, 3},
	{"no common data protocol", 1, 0x2, 3, 8192, 32, 64, SS_REASON_VERSION},
	{"version 0", 0, SS_CAP_DATA_V1, 3, 8192, 32, 64, SS_REASON_VERSION},
	{"buffer too small", 1, SS_CAP_DATA_V1, 3, 255, 32, 64, SS_REASON_PARAMS},
	{"buffer at minimum", 1, SS_CAP_DATA_V1, 3, 256, 32, 64, SS_REASON_NONE, 3},
	{"buffer too large", 1, SS_CAP_DATA_V1, 3, (1u << 20) + 1, 32, 64, SS_REASON_PARAMS},
	{"zero window", 1, SS_CAP_DATA_V1, 3, 8192, 0, 64, SS_REASON_PARAMS},
	{"zero send queue", 1, SS_CAP_DATA_V1, 3, 8192, 32, 0, SS_REASON_PARAMS},
};

static void test_negotiate_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(nego_cases) / sizeof(nego_cases[0]); i++) {
		const struct nego_case *c = &nego_cases[i];
		struct ss_msg peer = {
			.version = c->version, .type = SS_MSG_HELLO, .params = good_params};
		struct ss_agreement agr = {0};

		peer.params.caps = c->caps;
		peer.params.mtu = c->mtu;
		peer.params.buf_size = c->buf_size;
		peer.params.window = c->window;
		peer.params.sq_depth = c->sq_depth;
		peer.params.recv_mode = SS_RECV_RQ;
		print_message("%s\n", c->what);
		assert_int_equal(ss_negotiate(&good_params, &peer, &agr), c->want);
		if (c->want != SS_REASON_NONE)
			continue;
		assert_int_equal(agr.mtu, c->want_mtu);
		assert_int_equal(agr.max_send, c->buf_size);
		assert_int_equal(agr.send_window, c->window);
		assert_int_equal(agr.caps, SS_CAP_DATA_V1);
		assert_int_equal(agr.peer_recv_mode, SS_RECV_RQ);
	}
}

struct gid_case {
	const char *what;
	int family;
	const char *peer_addr;
	uint8_t gid[16];
	enum ss_reason want;
};

#define G4(a, b, c, d)                                                                             \
	{                                                                                          \
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d                               \
	}
static const uint8_t local_gids[][16] = {
	{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8},
	G4(192, 0, 2, 1),
};

/* clang-format off */
static const struct gid_case gid_cases[] = {
	{"IPv4 peer, its own GID", AF_INET, "192.0.2.12", G4(192, 0, 2, 12), SS_REASON_NONE},
	{"IPv4 peer aiming elsewhere", AF_INET, "192.0.2.12", G4(192, 0, 2, 13),
	 SS_REASON_GID_MISMATCH},
	{"IPv4 peer behind NAT", AF_INET, "198.51.100.1", G4(192, 0, 2, 12),
	 SS_REASON_GID_MISMATCH},
	{"IPv6 peer, its own GID", AF_INET6, "2001:db8::7",
	 {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7}, SS_REASON_NONE},
	{"v4-mapped IPv6 peer", AF_INET6, "::ffff:192.0.2.12", G4(192, 0, 2, 12), SS_REASON_NONE},
	{"loopback peer, a local GID", AF_INET, "127.0.0.1", G4(192, 0, 2, 1), SS_REASON_NONE},
	{"loopback peer, a foreign GID", AF_INET, "127.0.0.1", G4(192, 0, 2, 12),
	 SS_REASON_GID_MISMATCH},
	{"IPv6 loopback, local link-local", AF_INET6, "::1",
	 {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}, SS_REASON_NONE},
};
/* clang-format on */

static void test_peer_gid_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(gid_cases) / sizeof(gid_cases[0]); i++) {
		const struct gid_case *c = &gid_cases[i];
		struct sockaddr_storage ss = {.ss_family = (sa_family_t)c->family};
		void *dst = c->family == AF_INET ? (void *)&((struct sockaddr_in *)&ss)->sin_addr
						 : (void *)&((struct sockaddr_in6 *)&ss)->sin6_addr;

		assert_int_equal(inet_pton(c->family, c->peer_addr, dst), 1);
		print_message("%s\n", c->what);
		assert_int_equal(ss_check_peer_gid(c->gid, (struct sockaddr *)&ss, local_gids, 2),
				 c->want);
	}
}

static void test_names(void **state)
{
	(void)state;
	for (unsigned r = 0; r < SS_REASON__COUNT; r++)
		assert_string_not_equal(ss_reason_str(r), "unknown");
	assert_string_equal(ss_reason_str(SS_REASON__COUNT), "unknown");
	for (int r = 0; r < SS_DEC__COUNT; r++)
		assert_string_not_equal(ss_dec_result_str((enum ss_dec_result)r), "unknown");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_decode_table),
		cmocka_unit_test(test_round_trip_every_type),
		cmocka_unit_test(test_encode_refuses_bad_fields),
		cmocka_unit_test(test_return_bound),
		cmocka_unit_test(test_return_received),
		cmocka_unit_test(test_negotiate_table),
		cmocka_unit_test(test_peer_gid_table),
		cmocka_unit_test(test_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
