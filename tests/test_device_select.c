/* Table-driven tests of the pure device/port/GID chooser. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <arpa/inet.h>
#include <cmocka.h>
#include <netinet/in.h>
#include <sys/un.h>

#include "handshake/gid.h"
#include "transport/device.h"

/* GIDs as rxe shows them: link-local first, then the IPv4-mapped address. */
/* clang-format off */
#define LL  {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55}
#define V4A {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1}
#define V4B {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 12}
#define V4C {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 51, 100, 9}
#define V6G {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x07}

static const struct ss_gid_desc gids_a[] = {
	{LL, 0, SS_GID_ROCE_V1}, {LL, 1, SS_GID_ROCE_V2},
	{V4A, 2, SS_GID_ROCE_V1}, {V4A, 3, SS_GID_ROCE_V2},
	{V6G, 4, SS_GID_ROCE_V2},
};
static const struct ss_gid_desc gids_b[] = {
	{LL, 0, SS_GID_ROCE_V2},
	{V4B, 1, SS_GID_ROCE_V2},
};
static const struct ss_gid_desc gids_down_port[] = {
	{V4C, 0, SS_GID_ROCE_V2},
};

static const struct ss_port_desc ports_a[] = {{1, true, gids_a, 5}};
static const struct ss_port_desc ports_b[] = {{1, false, gids_down_port, 1}, {2, true, gids_b, 2}};
static const struct ss_port_desc ports_down[] = {{1, false, gids_a, 5}};

static const struct ss_dev_desc two_devs[] = {{"rxe0", ports_a, 1}, {"mlx5_0", ports_b, 2}};
static const struct ss_dev_desc down_dev[] = {{"rxe0", ports_down, 1}};

struct select_case {
	const char *what;
	const struct ss_dev_desc *devs;
	size_t n_devs;
	int family; /* AF_INET, AF_INET6, or AF_UNIX */
	const char *addr;
	struct ss_dev_override ovr;
	enum ss_sel_status want;
	size_t want_dev;
	uint8_t want_port;
	uint16_t want_index;
	enum ss_gid_type want_type;
};

#define NO_OVR {NULL, 0, -1}

static const struct select_case cases[] = {
	{"no device", NULL, 0, AF_INET, "192.0.2.1", NO_OVR, SS_SEL_NO_DEVICE},
	{"IPv4 picks RoCE v2 of the mapped GID", two_devs, 2, AF_INET, "192.0.2.1", NO_OVR,
	 SS_SEL_OK, 0, 1, 3, SS_GID_ROCE_V2},
	{"IPv4 on second device, second port", two_devs, 2, AF_INET, "192.0.2.12", NO_OVR,
	 SS_SEL_OK, 1, 2, 1, SS_GID_ROCE_V2},
	{"v4-mapped IPv6 socket address", two_devs, 2, AF_INET6, "::ffff:192.0.2.1", NO_OVR,
	 SS_SEL_OK, 0, 1, 3, SS_GID_ROCE_V2},
	{"IPv6 global address", two_devs, 2, AF_INET6, "2001:db8::7", NO_OVR, SS_SEL_OK, 0, 1, 4,
	 SS_GID_ROCE_V2},
	{"IPv4 without GID", two_devs, 2, AF_INET, "198.51.100.9", NO_OVR, SS_SEL_NO_GID},
	{"IPv6 without GID", two_devs, 2, AF_INET6, "2001:db8::8", NO_OVR, SS_SEL_NO_GID},
	{"GID only on an inactive port", two_devs + 1, 1, AF_INET, "198.51.100.9", NO_OVR,
	 SS_SEL_NO_GID},
	{"all ports down", down_dev, 1, AF_INET, "192.0.2.1", NO_OVR, SS_SEL_NO_PORT},
	{"IPv4 loopback, no device configured", two_devs, 2, AF_INET, "127.0.0.1", NO_OVR,
	 SS_SEL_LOOPBACK},
	{"IPv4 loopback elsewhere in 127/8", two_devs, 2, AF_INET, "127.1.2.3", NO_OVR,
	 SS_SEL_LOOPBACK},
	{"IPv6 loopback, no device configured", two_devs, 2, AF_INET6, "::1", NO_OVR,
	 SS_SEL_LOOPBACK},
	{"IPv4 loopback with device: its IPv4 GID", two_devs, 2, AF_INET, "127.0.0.1",
	 {"rxe0", 0, -1}, SS_SEL_OK, 0, 1, 3, SS_GID_ROCE_V2},
	{"IPv6 loopback with device: an IPv6 GID", two_devs, 2, AF_INET6, "::1", {"rxe0", 0, -1},
	 SS_SEL_OK, 0, 1, 1, SS_GID_ROCE_V2},
	{"loopback with unknown device", two_devs, 2, AF_INET, "127.0.0.1", {"nope0", 0, -1},
	 SS_SEL_UNKNOWN_DEVICE},
	{"device override restricts the search", two_devs, 2, AF_INET, "192.0.2.12",
	 {"rxe0", 0, -1}, SS_SEL_NO_GID},
	{"device override that matches", two_devs, 2, AF_INET, "192.0.2.12", {"mlx5_0", 0, -1},
	 SS_SEL_OK, 1, 2, 1, SS_GID_ROCE_V2},
	{"port override to an inactive port", two_devs, 2, AF_INET, "192.0.2.12",
	 {"mlx5_0", 1, -1}, SS_SEL_NO_PORT},
	{"port override to a missing port", two_devs, 2, AF_INET, "192.0.2.1", {"rxe0", 7, -1},
	 SS_SEL_NO_PORT},
	{"GID index override wins over the address", two_devs, 2, AF_INET, "198.51.100.9",
	 {"rxe0", 0, 2}, SS_SEL_OK, 0, 1, 2, SS_GID_ROCE_V1},
	{"GID index override not in the table", two_devs, 2, AF_INET, "192.0.2.1", {"rxe0", 0, 9},
	 SS_SEL_BAD_GID_INDEX},
	{"not an IP address", two_devs, 2, AF_UNIX, "/tmp/x", NO_OVR, SS_SEL_BAD_ADDRESS},
};
/* clang-format on */

static void make_addr(const struct select_case *c, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	ss->ss_family = (sa_family_t)c->family;
	if (c->family == AF_INET)
		assert_int_equal(inet_pton(AF_INET, c->addr, &((struct sockaddr_in *)ss)->sin_addr),
				 1);
	else if (c->family == AF_INET6)
		assert_int_equal(
			inet_pton(AF_INET6, c->addr, &((struct sockaddr_in6 *)ss)->sin6_addr), 1);
}

static void test_select_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct select_case *c = &cases[i];
		struct ss_dev_choice choice, untouched;
		struct sockaddr_storage ss;
		enum ss_sel_status got;

		make_addr(c, &ss);
		memset(&choice, 0xa5, sizeof(choice));
		memcpy(&untouched, &choice, sizeof(choice));
		got = ss_dev_select(c->devs, c->n_devs, (struct sockaddr *)&ss, &c->ovr, &choice);
		print_message("case '%s': %s\n", c->what, ss_sel_status_str(got));
		assert_int_equal(got, c->want);
		if (c->want != SS_SEL_OK) {
			/* Output parameters are set only on success. */
			assert_memory_equal(&choice, &untouched, sizeof(choice));
			continue;
		}
		assert_int_equal(choice.dev, c->want_dev);
		assert_int_equal(choice.port, c->want_port);
		assert_int_equal(choice.gid_index, c->want_index);
		assert_int_equal(choice.type, c->want_type);
		/* The GID returned is the table's entry at that index. */
		const struct ss_port_desc *port = NULL;
		for (size_t p = 0; p < c->devs[choice.dev].n_ports; p++)
			if (c->devs[choice.dev].ports[p].num == choice.port)
				port = &c->devs[choice.dev].ports[p];
		assert_non_null(port);
		int found = 0;
		for (size_t g = 0; g < port->n_gids; g++)
			if (port->gids[g].index == choice.gid_index)
				found = !memcmp(port->gids[g].raw, choice.gid, 16);
		assert_true(found);
	}
}

static void test_null_override_means_auto(void **state)
{
	struct sockaddr_in sin = {.sin_family = AF_INET};
	struct ss_dev_choice choice;

	(void)state;
	inet_pton(AF_INET, "192.0.2.1", &sin.sin_addr);
	assert_int_equal(ss_dev_select(two_devs, 2, (struct sockaddr *)&sin, NULL, &choice),
			 SS_SEL_OK);
	assert_int_equal(choice.gid_index, 3);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(ss_dev_select(two_devs, 2, (struct sockaddr *)&sin, NULL, &choice),
			 SS_SEL_LOOPBACK);
}

static void test_addr_helpers(void **state)
{
	struct sockaddr_in sin = {.sin_family = AF_INET};
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	static const uint8_t want[16] = V4A;
	uint8_t gid[16];

	(void)state;
	inet_pton(AF_INET, "192.0.2.1", &sin.sin_addr);
	assert_int_equal(ss_addr_to_gid((struct sockaddr *)&sin, gid), 0);
	assert_memory_equal(gid, want, 16);
	assert_false(ss_addr_is_loopback((struct sockaddr *)&sin));
	assert_int_equal(ss_addr_to_gid((struct sockaddr *)&sun, gid), -EAFNOSUPPORT);
	assert_false(ss_addr_is_loopback((struct sockaddr *)&sun));
}

static void test_status_names(void **state)
{
	(void)state;
	for (int s = 0; s < SS_SEL__COUNT; s++) {
		assert_non_null(ss_sel_status_str((enum ss_sel_status)s));
		assert_string_not_equal(ss_sel_status_str((enum ss_sel_status)s), "unknown");
	}
	assert_string_equal(ss_sel_status_str(SS_SEL__COUNT), "unknown");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_select_table),
		cmocka_unit_test(test_null_override_means_auto),
		cmocka_unit_test(test_addr_helpers),
		cmocka_unit_test(test_status_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
