/*
 * The statistics file layout (shim/stats.h) as srqshim-ctl reads it: a
 * valid file passes; foreign, truncated and other-version files are refused
 * with a clear message, whether in memory or on disk; start times of live
 * and dead processes.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "shim/stats.h"

#define SLOTS 4

static size_t file_len(uint32_t slots)
{
	return sizeof(struct ss_stats_head) + slots * sizeof(struct ss_stats_conn);
}

static void *valid_file(void)
{
	struct ss_stats_head *h = calloc(1, file_len(SLOTS) + 256);

	assert_non_null(h);
	memcpy(h->magic, SS_STATS_MAGIC, 8);
	h->version = SS_STATS_VERSION;
	h->head_size = sizeof(*h);
	h->conn_size = sizeof(struct ss_stats_conn);
	h->n_slots = SLOTS;
	h->slots_hwm = 2;
	return h;
}

enum corruption { NONE, MAGIC, VERSION, HEAD_SIZE, CONN_SIZE, HWM, SLOTS_BIG };

/* clang-format off */
static const struct {
	const char *what;
	enum corruption how;
	size_t len; /* 0: the whole file */
	int want;
	const char *msg; /* a word the message must hold */
} cases[] = {
	{"valid", NONE, 0, 0, NULL},
	{"valid, longer than needed", NONE, sizeof(struct ss_stats_head) + SLOTS * sizeof(struct ss_stats_conn) + 256, 0, NULL},
	{"empty", NONE, 1, -EINVAL, "not a srqshim"},
	{"foreign bytes", MAGIC, 0, -EINVAL, "not a srqshim"},
	{"header cut short", NONE, 12, -EINVAL, "truncated"},
	{"header without its slots", NONE, sizeof(struct ss_stats_head), -EINVAL, "truncated"},
	{"one slot missing", NONE, sizeof(struct ss_stats_head) + 3 * sizeof(struct ss_stats_conn),
	 -EINVAL, "truncated"},
	{"a later layout version", VERSION, 0, -EINVAL, "version"},
	{"a different header size", HEAD_SIZE, 0, -EINVAL, "sizes"},
	{"a different slot size", CONN_SIZE, 0, -EINVAL, "sizes"},
	{"slots in use beyond the slots", HWM, 0, -EINVAL, "truncated"},
	{"more slots than the file holds", SLOTS_BIG, 0, -EINVAL, "truncated"},
};
/* clang-format on */

static void corrupt(struct ss_stats_head *h, enum corruption how)
{
	switch (how) {
	case MAGIC: memcpy(h->magic, "GIF89a\0\0", 8); break;
	case VERSION: h->version = SS_STATS_VERSION + 1; break;
	case HEAD_SIZE: h->head_size += 8; break;
	case CONN_SIZE: h->conn_size -= 8; break;
	case HWM: h->slots_hwm = SLOTS + 1; break;
	case SLOTS_BIG: h->n_slots = 1u << 30; break;
	case NONE: break;
	}
}

static void test_check_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct ss_stats_head *h = valid_file();
		size_t len = cases[i].len ? cases[i].len : file_len(SLOTS);
		char err[160] = "";
		int ret;

		corrupt(h, cases[i].how);
		ret = ss_stats_check(h, len, err, sizeof(err));
		print_message("%s: %d %s\n", cases[i].what, ret, err);
		assert_int_equal(ret, cases[i].want);
		if (cases[i].msg)
			assert_non_null(strstr(err, cases[i].msg));
		free(h);
	}
}

/* The same through files: what the tool really opens. */
static void test_open_files(void **state)
{
	char dir[] = "/tmp/ss-stats-XXXXXX", path[64], err[160];
	struct ss_stats_view v;

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/1.stats", dir);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct ss_stats_head *h = valid_file();
		size_t len = cases[i].len ? cases[i].len : file_len(SLOTS);
		FILE *f = fopen(path, "w");

		corrupt(h, cases[i].how);
		assert_non_null(f);
		assert_int_equal(fwrite(h, 1, len, f), len);
		fclose(f);
		int ret = ss_stats_open(path, &v, err, sizeof(err));
		assert_int_equal(ret, cases[i].want);
		if (ret == 0) {
			assert_int_equal(v.head->n_slots, SLOTS);
			assert_ptr_equal((const void *)v.slots, (const void *)(v.head + 1));
		}
		ss_stats_close(&v);
		free(h);
	}
	/* A file that is not there, and an empty one. */
	unlink(path);
	assert_int_equal(ss_stats_open(path, &v, err, sizeof(err)), -ENOENT);
	fclose(fopen(path, "w"));
	assert_int_equal(ss_stats_open(path, &v, err, sizeof(err)), -EINVAL);
	unlink(path);
	rmdir(dir);
}

static void test_start_time(void **state)
{
	pid_t child;

	(void)state;
	assert_true(ss_stats_start_time(getpid()) > 0);
	assert_true(ss_stats_start_time(getpid()) == ss_stats_start_time(getpid()));
	child = fork();
	if (child == 0)
		_exit(0);
	waitpid(child, NULL, 0);
	assert_int_equal(ss_stats_start_time(child), 0); /* gone */
}

static void test_state_names(void **state)
{
	(void)state;
	assert_string_equal(ss_stats_state_str(SS_ST_UPGRADED), "upgraded");
	assert_string_equal(ss_stats_state_str(SS_ST_TCP), "tcp");
	assert_string_equal(ss_stats_state_str(99), "unknown");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_check_table),
		cmocka_unit_test(test_open_files),
		cmocka_unit_test(test_start_time),
		cmocka_unit_test(test_state_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
