/* SRQSHIM_TEST_DELAYS: sleeps at points of the negotiation, so tests can force each race. */
#include <time.h>

#include "shim/shim.h"

static int test_delay_ms[SS_TP__COUNT];

void ss_test_delays_load(void)
{
	char err[160];

	/* The options table checked the value: a bad one is the default (empty). */
	if (ss_test_delays_parse(ss_cfg.test_delays, test_delay_ms, err, sizeof(err)) != 0)
		for (int i = 0; i < SS_TP__COUNT; i++)
			test_delay_ms[i] = 0;
}

void ss_test_delay(enum ss_test_point p)
{
	int ms = test_delay_ms[p];
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};

	if (ms)
		while (nanosleep(&ts, &ts) != 0)
			;
}
