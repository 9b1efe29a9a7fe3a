/* Table-driven tests of the options table: parsing, defaults, bad values. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "shim/config.h"

struct env_pair {
	const char *name, *value;
};

static const char *lookup_pairs(const char *name, void *arg)
{
	for (const struct env_pair *p = arg; p->name; p++)
		if (strcmp(p->name, name) == 0)
			return p->value;
	return NULL;
}

static int n_reports;
static char reports[1024]; /* every report, one per line */

static void count_reports(const char *msg, void *arg)
{
	(void)arg;
	n_reports++;
	size_t used = strlen(reports);
	snprintf(reports + used, sizeof(reports) - used, "%s\n", msg);
}

static const struct ss_option *find_option(const char *name)
{
	for (size_t i = 0; i < ss_n_options; i++)
		if (strcmp(ss_options[i].name, name) == 0)
			return &ss_options[i];
	fail_msg("no option %s", name);
	return NULL;
}

struct parse_case {
	const char *option, *value;
	int want_ret;
	const char *want_text; /* ss_option_format() after a successful parse */
};

static const struct parse_case parse_cases[] = {
	{"PORT", "1", 0, "1"},
	{"PORT", "0x2", 0, "2"},
	{"PORT", "255", 0, "255"},
	{"PORT", "256", -ERANGE, NULL},
	{"PORT", "-1", -ERANGE, NULL},
	{"PORT", "", -EINVAL, NULL},
	{"PORT", "1x", -EINVAL, NULL},
	{"PORT", "99999999999999999999999", -EINVAL, NULL},
	{"GID_INDEX", "-1", 0, "-1"},
	{"GID_INDEX", "3", 0, "3"},
	{"GID_INDEX", "-2", -ERANGE, NULL},
	{"GID_INDEX", "65536", -ERANGE, NULL},
	{"DEVICE", "rxe0", 0, "rxe0"},
	{"DEVICE", "", 0, ""},
	{"DEVICE", "a-name-that-is-far-too-long-for-any-rdma-device-name-in-the-kernel-x", -ERANGE,
	 NULL},
	{"LOG_LEVEL", "debug", 0, "debug"},
	{"LOG_LEVEL", "none", 0, "none"},
	{"LOG_LEVEL", "DEBUG", -EINVAL, NULL},
	{"LOG_LEVEL", "3", -EINVAL, NULL},
	{"PEERS", "", 0, ""},
	{"PEERS", "192.0.2.0/24:6379,[::1]", 0, "192.0.2.0/24:6379,[::1]"},
	{"PEERS", "192.0.2.0/24,nonsense", -EINVAL, NULL},
	{"TEST_DELAYS", "", 0, ""},
	{"TEST_DELAYS", "down-return=2000,handover=3000", 0, "down-return=2000,handover=3000"},
	{"TEST_DELAYS", "handover=60001", -EINVAL, NULL},
	{"TEST_DELAYS", "hand-over=5", -EINVAL, NULL},
};

static void test_parse_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(parse_cases) / sizeof(parse_cases[0]); i++) {
		const struct parse_case *c = &parse_cases[i];
		const struct ss_option *opt = find_option(c->option);
		struct ss_config cfg, before;
		char err[256] = "", text[128];
		int ret;

		assert_int_equal(
			ss_config_load(&cfg, lookup_pairs, (struct env_pair[]){{0}}, NULL, NULL),
			0);
		before = cfg;
		ret = ss_option_parse(opt, c->value, &cfg, err, sizeof(err));
		print_message("SRQSHIM_%s='%s' -> %d %s\n", c->option, c->value, ret, err);
		assert_int_equal(ret, c->want_ret);
		if (ret) {
			assert_memory_equal(&cfg, &before, sizeof(cfg));
			assert_non_null(
				strstr(err, c->option)); /* the message names the variable */
			continue;
		}
		ss_option_format(opt, &cfg, text, sizeof(text));
		assert_string_equal(text, c->want_text);
	}
}

static void test_defaults_parse_and_format_back(void **state)
{
	struct ss_config cfg;
	char text[128];

	(void)state;
	assert_int_equal(ss_config_load(&cfg, lookup_pairs, (struct env_pair[]){{0}}, NULL, NULL),
			 0);
	for (size_t i = 0; i < ss_n_options; i++) {
		assert_non_null(ss_options[i].doc);
		ss_option_format(&ss_options[i], &cfg, text, sizeof(text));
		assert_string_equal(text, ss_options[i].defval);
	}
	assert_int_equal(cfg.port, 0);
	assert_int_equal(cfg.gid_index, -1);
	assert_string_equal(cfg.device, "");
}

static void test_load_keeps_default_on_bad_value(void **state)
{
	struct env_pair env[] = {
		{"SRQSHIM_PORT", "seven"},
		{"SRQSHIM_DEVICE", "rxe0"},
		{"SRQSHIM_LOG_LEVEL", "loud"},
		{"PORT", "3"}, /* no prefix: not ours */
		{NULL, NULL},
	};
	struct ss_config cfg;

	(void)state;
	n_reports = 0;
	reports[0] = '\0';
	assert_int_equal(ss_config_load(&cfg, lookup_pairs, env, count_reports, NULL), 2);
	assert_int_equal(n_reports, 2);
	assert_int_equal(cfg.port, 0);
	assert_string_equal(cfg.device, "rxe0");
	assert_int_equal(cfg.log_level, 1); /* "error" */
	assert_non_null(strstr(reports, "SRQSHIM_LOG_LEVEL='loud' is not one of: none error"));
	assert_non_null(strstr(reports, "using the default 'error'\n"));
	assert_non_null(
		strstr(reports, "SRQSHIM_PORT='seven' is not a number; using the default '0'\n"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_table),
		cmocka_unit_test(test_defaults_parse_and_format_back),
		cmocka_unit_test(test_load_keeps_default_on_bad_value),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
