/*
 * The QP number map: scripted cases by table (collisions that wrap around
 * the table, deleting the head, the middle and the tail of a probe run,
 * absent keys, replacement), then random puts and deletes checked against
 * a plain array as the model, across growth.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "transport/qpmap.h"

/* Keys with the same home slot in a table of 64: (k * 2654435761) & 63 equal. */
static uint32_t same_home(uint32_t home, int nth)
{
	uint32_t found = 0;
	int n = 0;

	for (uint32_t k = 1;; k++)
		if (((k * 2654435761u) & 63) == home && n++ == nth) {
			found = k;
			break;
		}
	return found;
}

static void check_all(const struct ss_qpmap *m, const uint32_t *keys, const uintptr_t *vals, int n)
{
	for (int i = 0; i < n; i++)
		assert_ptr_equal(ss_qpmap_find(m, keys[i]), (void *)vals[i]);
}

static void test_scripts(void **state)
{
	/* For each home slot near the end (wrap-around) and in the middle: a run of 5
	 * collisions. */
	static const uint32_t homes[] = {0, 31, 62, 63};
	static const int del_order[][5] = {{0, 1, 2, 3, 4}, {4, 3, 2, 1, 0}, {2, 0, 4, 1, 3}};

	(void)state;
	for (size_t h = 0; h < sizeof(homes) / sizeof(homes[0]); h++)
		for (size_t d = 0; d < sizeof(del_order) / sizeof(del_order[0]); d++) {
			struct ss_qpmap m = {0};
			uint32_t keys[6];
			uintptr_t vals[6];

			for (int i = 0; i < 5; i++) {
				keys[i] = same_home(homes[h], i);
				vals[i] = 100 + (uintptr_t)i;
				assert_int_equal(ss_qpmap_put(&m, keys[i], (void *)vals[i]), 0);
			}
			/* A key of the next home slot sits behind the run. */
			keys[5] = same_home((homes[h] + 1) & 63, 0);
			vals[5] = 200;
			assert_int_equal(ss_qpmap_put(&m, keys[5], (void *)vals[5]), 0);
			assert_int_equal(m.cap, 64);
			check_all(&m, keys, vals, 6);
			for (int k = 0; k < 5; k++) {
				int victim = del_order[d][k];

				ss_qpmap_del(&m, keys[victim]);
				assert_null(ss_qpmap_find(&m, keys[victim]));
				vals[victim] = 0;
				check_all(&m, keys, vals, 6);
			}
			assert_int_equal(m.n, 1);
			ss_qpmap_fini(&m);
		}
}

static void test_edges(void **state)
{
	struct ss_qpmap m = {0};

	(void)state;
	assert_null(ss_qpmap_find(&m, 5));
	ss_qpmap_del(&m, 5); /* empty: nothing */
	assert_int_equal(ss_qpmap_put(&m, 0, &m), -EINVAL);
	assert_int_equal(ss_qpmap_put(&m, 7, (void *)1), 0);
	assert_int_equal(ss_qpmap_put(&m, 7, (void *)2), 0); /* replaced, not doubled */
	assert_int_equal(m.n, 1);
	assert_ptr_equal(ss_qpmap_find(&m, 7), (void *)2);
	ss_qpmap_del(&m, 8); /* absent */
	assert_int_equal(m.n, 1);
	ss_qpmap_fini(&m);
}

/* Random operations against a model, with keys from a small range so that runs collide. */
static void test_random_against_model(void **state)
{
	enum { KEYS = 3000, OPS = 200000 };
	static uintptr_t model[KEYS + 1];
	struct ss_qpmap m = {0};

	(void)state;
	memset(model, 0, sizeof(model));
	srand(11);
	for (int op = 0; op < OPS; op++) {
		uint32_t k = 1 + (uint32_t)(rand() % KEYS);

		if (rand() % 3) {
			uintptr_t v = (uintptr_t)op + 1;
			assert_int_equal(ss_qpmap_put(&m, k, (void *)v), 0);
			model[k] = v;
		} else {
			ss_qpmap_del(&m, k);
			model[k] = 0;
		}
		if (op % 997 == 0) {
			uint32_t n = 0;

			for (uint32_t i = 1; i <= KEYS; i++) {
				assert_ptr_equal(ss_qpmap_find(&m, i), (void *)model[i]);
				n += model[i] != 0;
			}
			assert_int_equal(m.n, n);
			assert_true(m.n * 2 <= m.cap);
		}
	}
	ss_qpmap_fini(&m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_scripts),
		cmocka_unit_test(test_edges),
		cmocka_unit_test(test_random_against_model),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
