/*
 * The timer heap: scripted sequences by table (arm, re-arm earlier and
 * later: never postponed, cancel armed and unarmed timers, pop what is
 * due), then many
 * timers in random order checked against a plain list as the model.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "transport/timer.h"

enum op { END, ARM, CANCEL, POP };

struct step {
	enum op op;
	int id;      /* ARM, CANCEL: the timer; POP: the one expected, -1 for none */
	uint64_t at; /* ARM: deadline; POP: now */
};

struct script {
	const char *what;
	struct step steps[16];
};

/* clang-format off */
static const struct script scripts[] = {
	{"earliest first, nothing before its time",
	 {{ARM, 0, 30}, {ARM, 1, 10}, {ARM, 2, 20}, {POP, -1, 9}, {POP, 1, 10}, {POP, -1, 15},
	  {POP, 2, 25}, {POP, 0, 100}, {POP, -1, 1000}}},
	{"a cancelled timer never fires, the others still do",
	 {{ARM, 0, 10}, {ARM, 1, 20}, {ARM, 2, 30}, {CANCEL, 0, 0}, {POP, 1, 100}, {POP, 2, 100},
	  {POP, -1, 100}}},
	{"cancelling the last one and an unarmed one",
	 {{ARM, 0, 10}, {ARM, 1, 20}, {CANCEL, 1, 0}, {CANCEL, 1, 0}, {CANCEL, 3, 0}, {POP, 0, 50},
	  {POP, -1, 50}}},
	{"re-armed earlier moves, later keeps the earlier deadline, never duplicates",
	 {{ARM, 0, 50}, {ARM, 1, 40}, {ARM, 2, 30}, {ARM, 0, 5}, {ARM, 2, 60}, {POP, 0, 5},
	  {POP, 2, 30}, {POP, -1, 39}, {POP, 1, 45}, {POP, -1, 60}}},
	{"a retry soon is not lost to a later deadline asked after it",
	 {{ARM, 0, 1001}, {ARM, 0, 3000}, {POP, -1, 1000}, {POP, 0, 1001}, {POP, -1, 3000}}},
	{"a popped timer is armed afresh, later than before",
	 {{ARM, 0, 5}, {POP, 0, 5}, {ARM, 0, 50}, {POP, -1, 49}, {POP, 0, 50}}},
	{"a popped timer may be armed again",
	 {{ARM, 0, 10}, {POP, 0, 10}, {ARM, 0, 20}, {POP, -1, 19}, {POP, 0, 20}}},
	{"cancel in the middle of a deep heap",
	 {{ARM, 0, 1}, {ARM, 1, 2}, {ARM, 2, 3}, {ARM, 3, 4}, {ARM, 4, 5}, {ARM, 5, 6}, {ARM, 6, 7},
	  {CANCEL, 1, 0}, {CANCEL, 4, 0}, {POP, 0, 99}, {POP, 2, 99}, {POP, 3, 99}, {POP, 5, 99},
	  {POP, 6, 99}, {POP, -1, 99}}},
};
/* clang-format on */

static void test_scripts(void **state)
{
	(void)state;
	for (size_t s = 0; s < sizeof(scripts) / sizeof(scripts[0]); s++) {
		struct ss_timers h = {0};
		struct ss_timer t[8];

		memset(t, 0, sizeof(t));
		for (const struct step *st = scripts[s].steps; st->op != END; st++) {
			struct ss_timer *got;

			switch (st->op) {
			case ARM:
				assert_int_equal(ss_timers_arm(&h, &t[st->id], st->at), 0);
				assert_true(ss_timer_armed(&t[st->id]));
				break;
			case CANCEL:
				ss_timers_cancel(&h, &t[st->id]);
				assert_false(ss_timer_armed(&t[st->id]));
				break;
			case POP:
				got = ss_timers_pop_due(&h, st->at);
				if (st->id < 0) {
					if (got)
						fail_msg("%s: timer %d fired at %llu",
							 scripts[s].what, (int)(got - t),
							 (unsigned long long)st->at);
				} else {
					if (got != &t[st->id])
						fail_msg("%s: expected timer %d at %llu",
							 scripts[s].what, st->id,
							 (unsigned long long)st->at);
					assert_false(ss_timer_armed(got));
				}
				break;
			case END: break;
			}
		}
		ss_timers_fini(&h);
	}
}

/* Many timers armed, re-armed and cancelled at random; pops must match a sorted model. */
static void test_random_against_model(void **state)
{
	enum { N = 500, OPS = 20000 };
	static struct ss_timer t[N];
	static uint64_t model[N]; /* deadline, or 0 when not armed */
	struct ss_timers h = {0};
	uint64_t now = 0;

	(void)state;
	memset(t, 0, sizeof(t));
	srand(7);
	for (int op = 0; op < OPS; op++) {
		int id = rand() % N, what = rand() % 10;

		if (what < 5) {
			uint64_t at = now + 1 + (uint64_t)(rand() % 1000);
			assert_int_equal(ss_timers_arm(&h, &t[id], at), 0);
			if (!model[id] || at < model[id])
				model[id] = at; /* never postponed */
		} else if (what < 7) {
			ss_timers_cancel(&h, &t[id]);
			model[id] = 0;
		} else {
			struct ss_timer *got;

			now += (uint64_t)(rand() % 50);
			while ((got = ss_timers_pop_due(&h, now))) {
				int gi = (int)(got - t);
				/* Due, armed in the model, and no armed timer is earlier. */
				assert_true(model[gi] != 0 && model[gi] <= now);
				for (int k = 0; k < N; k++)
					assert_false(model[k] && model[k] < model[gi]);
				model[gi] = 0;
			}
			for (int k = 0; k < N; k++)
				assert_false(model[k] && model[k] <= now);
		}
		uint64_t next = UINT64_MAX;
		for (int k = 0; k < N; k++) {
			assert_int_equal(ss_timer_armed(&t[k]), model[k] != 0);
			if (model[k] && model[k] < next)
				next = model[k];
		}
		assert_true(ss_timers_next(&h) == next);
	}
	ss_timers_fini(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_scripts),
		cmocka_unit_test(test_random_against_model),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
