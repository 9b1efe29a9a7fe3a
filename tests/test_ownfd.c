/*
 * The registry of the shim's own fds (shim/ownfd.c), with real fds: a
 * table of scripts (remember fds at chosen numbers, forget and close them
 * as ss_private_close does, put another file or the same file again on a
 * number, then ask for the next kept fd in a range), each on the same
 * numbers: what a script before forgot must not count (its numbers hold
 * other files now).
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmocka.h>

#include "shim/ownfd.h"

enum op { END, ADD, OPEN, OPEN_ANON, FORGET, NEXT };

struct step {
	enum op op;
	int a, b; /* ADD, OPEN(_ANON), FORGET: number a; NEXT: range [a, b] */
	int want; /* NEXT: the fd found, -1 for none */
};

struct script {
	const char *what;
	struct step steps[12];
};

/* Numbers are offsets from the script's base; the chunk size is 1024. */
/* clang-format off */
static const struct script scripts[] = {
	{"none remembered: nothing kept",
	 {{OPEN, 5}, {NEXT, 0, 2000, -1}}},
	{"a remembered fd is found, only within the range",
	 {{OPEN, 5}, {ADD, 5}, {NEXT, 0, 2000, 5}, {NEXT, 5, 5, 5}, {NEXT, 6, 2000, -1},
	  {NEXT, 0, 4, -1}}},
	{"the lowest of several, across chunks",
	 {{OPEN, 1500}, {ADD, 1500}, {OPEN, 7}, {ADD, 7}, {NEXT, 0, 3000, 7},
	  {NEXT, 8, 3000, 1500}, {NEXT, 1501, 3000, -1}}},
	{"an fd the shim forgot and closed no longer counts",
	 {{OPEN, 9}, {ADD, 9}, {FORGET, 9}, {NEXT, 0, 2000, -1}}},
	{"another file on a forgotten number is the application's",
	 {{OPEN, 9}, {ADD, 9}, {FORGET, 9}, {OPEN, 9}, {NEXT, 0, 2000, -1}}},
	{"a number remembered again counts with its new file",
	 {{OPEN, 9}, {ADD, 9}, {FORGET, 9}, {OPEN, 9}, {ADD, 9}, {NEXT, 0, 2000, 9}}},
	{"an eventfd the shim closed and forgot: another eventfd on its number is the application's",
	 {{OPEN_ANON, 9}, {ADD, 9}, {FORGET, 9}, {OPEN_ANON, 9}, {NEXT, 0, 2000, -1}}},
	{"forgetting one number leaves the others",
	 {{OPEN, 3}, {ADD, 3}, {OPEN, 1030}, {ADD, 1030}, {FORGET, 3}, {NEXT, 0, 2000, 1030}}},
};
/* clang-format on */

#define BASE 100

static void run_script(void **state)
{
	const struct script *sc = *state;
	int base = BASE;
	int opened[2048] = {0}, added[2048] = {0};

	for (const struct step *st = sc->steps; st->op != END; st++) {
		unsigned fd = 0;

		switch (st->op) {
		case OPEN: {
			int p[2];

			assert_int_equal(pipe(p), 0);
			assert_int_equal(dup2(p[0], base + st->a), base + st->a);
			close(p[0]);
			close(p[1]);
			opened[st->a] = 1;
			break;
		}
		case OPEN_ANON: {
			/* Every eventfd shares one anonymous inode with every epoll fd. */
			int e = eventfd(0, 0);

			assert_true(e >= 0);
			assert_int_equal(dup2(e, base + st->a), base + st->a);
			close(e);
			opened[st->a] = 1;
			break;
		}
		case FORGET:
			ss_ownfd_forget(base + st->a);
			close(base + st->a);
			opened[st->a] = 0;
			break;
		case ADD:
			ss_ownfd_add(base + st->a);
			added[st->a] = 1;
			break;
		case NEXT: {
			bool found = ss_ownfd_next((unsigned)(base + st->a),
						   (unsigned)(base + st->b), &fd);

			if (st->want < 0) {
				if (found)
					fail_msg("%s: found %u, want none", sc->what,
						 fd - (unsigned)base);
			} else {
				if (!found || fd != (unsigned)(base + st->want))
					fail_msg("%s: found %d, want %d", sc->what,
						 found ? (int)(fd - (unsigned)base) : -1, st->want);
			}
			break;
		}
		case END: break;
		}
	}
	/* What the shim would close at the end: forgotten first, as ss_private_close does. */
	for (int i = 0; i < 2048; i++) {
		if (added[i])
			ss_ownfd_forget(base + i);
		if (opened[i])
			close(base + i);
	}
}

int main(void)
{
	struct CMUnitTest tests[sizeof(scripts) / sizeof(scripts[0])];
	struct rlimit rl;

	/* Room for the scripts' numbers. */
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_cur < BASE + 2048) {
		rl.rlim_cur = BASE + 2048;
		assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
	}
	for (size_t i = 0; i < sizeof(scripts) / sizeof(scripts[0]); i++)
		tests[i] = (struct CMUnitTest){.name = scripts[i].what,
					       .test_func = run_script,
					       .initial_state = (void *)&scripts[i]};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
