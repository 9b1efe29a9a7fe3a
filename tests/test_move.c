/* ss_move_skip: where a stream resumes on TCP after a move, case by case. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "handshake/move.h"

struct move_case {
	const char *what;
	struct ss_move_view v;
	int64_t want;
};

static const struct move_case move_cases[] = {
	{"live, peer got all posted", {false, 1000, 300, true, 1000}, 0},
	{"live, older peer without a count", {false, 1000, 300, false, 0}, 0},
	{"live, count short of the switch", {false, 1000, 300, true, 999}, -1},
	{"live, count past the switch", {false, 1000, 300, true, 1001}, -1},
	{"lost, nothing in flight arrived", {true, 1000, 300, true, 1000}, 0},
	{"lost, part arrived", {true, 1000, 300, true, 1120}, 120},
	{"lost, all arrived", {true, 1000, 300, true, 1300}, 300},
	{"lost, nothing held, nothing more", {true, 1000, 0, true, 1000}, 0},
	{"lost, count beyond what was sent", {true, 1000, 300, true, 1301}, -1},
	{"lost, count below what was acknowledged", {true, 1000, 300, true, 999}, -1},
	{"lost without a count", {true, 1000, 300, false, 0}, -1},
	{"lost, offsets past 4 GiB", {true, 5ull << 32, 8192, true, (5ull << 32) + 8192}, 8192},
};

static void test_move_skip_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(move_cases) / sizeof(move_cases[0]); i++) {
		const struct move_case *c = &move_cases[i];
		int64_t got = ss_move_skip(&c->v);

		if (got != c->want)
			fail_msg("%s: %lld, want %lld", c->what, (long long)got,
				 (long long)c->want);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_move_skip_table),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
