/* Table-driven tests of SRQSHIM_PEERS: parsing and matching. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <arpa/inet.h>
#include <cmocka.h>
#include <netinet/in.h>

#include "handshake/policy.h"

struct match_case {
	const char *spec;
	const char *dst; /* IPv4 or IPv6 literal */
	uint16_t port;
	bool want;
};

static const struct match_case match_cases[] = {
	{"", "192.0.2.1", 80, true},
	{"", "2001:db8::1", 80, true},
	{"192.0.2.1", "192.0.2.1", 6379, true},
	{"192.0.2.1", "192.0.2.2", 6379, false},
	{"192.0.2.0/24", "192.0.2.200", 1, true},
	{"192.0.2.0/24", "192.0.3.1", 1, false},
	{"192.0.2.0/23", "192.0.3.1", 1, true},
	{"0.0.0.0/0", "198.51.100.7", 9, true},
	{"0.0.0.0/0", "2001:db8::1", 9, false},
	{"192.0.2.1:6379", "192.0.2.1", 6379, true},
	{"192.0.2.1:6379", "192.0.2.1", 6380, false},
	{"10.0.0.0/8:80,192.0.2.0/24", "192.0.2.9", 22, true},
	{"10.0.0.0/8:80,192.0.2.0/24", "10.9.9.9", 80, true},
	{"10.0.0.0/8:80,192.0.2.0/24", "10.9.9.9", 81, false},
	{"[2001:db8::]/32", "2001:db8:ffff::1", 5, true},
	{"[2001:db8::]/32", "2001:db9::1", 5, false},
	{"[::1]:11111", "::1", 11111, true},
	{"[::1]:11111", "::1", 11112, false},
	{"[2001:db8::]/33:443", "2001:db8:7fff::1", 443, true},
	{"[2001:db8::]/33:443", "2001:db8:8000::1", 443, false},
	{"192.0.2.1", "::ffff:192.0.2.1", 1, true}, /* a v4-mapped IPv6 destination */
	{"192.0.2.7/31", "192.0.2.6", 1, true},
	{"192.0.2.7/31", "192.0.2.8", 1, false},
};

static void test_match_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(match_cases) / sizeof(match_cases[0]); i++) {
		const struct match_case *c = &match_cases[i];
		struct sockaddr_storage ss = {0};
		struct ss_policy p;
		char err[160];

		if (strchr(c->dst, ':')) {
			struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
			s6->sin6_family = AF_INET6;
			s6->sin6_port = htons(c->port);
			assert_int_equal(inet_pton(AF_INET6, c->dst, &s6->sin6_addr), 1);
		} else {
			struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
			s4->sin_family = AF_INET;
			s4->sin_port = htons(c->port);
			assert_int_equal(inet_pton(AF_INET, c->dst, &s4->sin_addr), 1);
		}
		print_message("'%s' vs %s:%u\n", c->spec, c->dst, c->port);
		assert_int_equal(ss_policy_parse(c->spec, &p, err, sizeof(err)), 0);
		assert_int_equal(ss_policy_allows(&p, (struct sockaddr *)&ss), c->want);
	}
}

static void test_parse_errors(void **state)
{
	/* clang-format off */
	static const char *const bad[] = {
		"192.0.2",       "192.0.2.1/33",  "192.0.2.1:0",      "192.0.2.1:65536",
		"192.0.2.1:x",   "[2001:db8::",   "[2001:db8::]/129", "host.example",
		"192.0.2.1,,",   ",192.0.2.1",    "192.0.2.1/",       "[::1]:",
		"1.1.1.1,1.1.1.2,1.1.1.3,1.1.1.4,1.1.1.5,1.1.1.6,1.1.1.7,1.1.1.8,1.1.1.9,1.1.1.10,"
		"1.1.1.11,1.1.1.12,1.1.1.13,1.1.1.14,1.1.1.15,1.1.1.16,1.1.1.17",
	};
	/* clang-format on */
	struct ss_policy p, untouched;
	char err[160];

	(void)state;
	memset(&p, 0x5a, sizeof(p));
	untouched = p;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		assert_int_equal(ss_policy_parse(bad[i], &p, err, sizeof(err)), -EINVAL);
		print_message("'%s': %s\n", bad[i], err);
		assert_true(err[0] != '\0');
		assert_memory_equal(&p, &untouched, sizeof(p));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_match_table),
		cmocka_unit_test(test_parse_errors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
