/*
 * The one clock of every layer: CLOCK_MONOTONIC, in milliseconds or
 * microseconds. It lives in the bottom layer because every other links it.
 * The wall clock is for what an operator reads (srqshim-ctl), never for
 * deadlines.
 */
#ifndef SS_HANDSHAKE_CLOCK_H
#define SS_HANDSHAKE_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t ss_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static inline uint64_t ss_now_ms(void)
{
	return ss_now_us() / 1000;
}

/*
 * The same clock, coarse (CLOCK_MONOTONIC_COARSE): the time of the last
 * tick, which the vDSO gives without a system call even where the precise
 * reading is one (a guest's HPET). Behind by up to ss_coarse_slack_ms().
 */
static inline uint64_t ss_now_coarse_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* How far behind a coarse reading may be: the tick, in whole milliseconds. */
static inline uint64_t ss_coarse_slack_ms(void)
{
	struct timespec res = {0, 10000000};

	clock_getres(CLOCK_MONOTONIC_COARSE, &res);
	return (uint64_t)res.tv_sec * 1000 + ((uint64_t)res.tv_nsec + 999999) / 1000000;
}

/*
 * Whether deadline_ms (on the precise clock) is still ahead: the coarse
 * reading answers while it is a tick or more away, so that only the last
 * tick before a deadline costs a precise reading.
 */
static inline int ss_before_ms(uint64_t deadline_ms)
{
	return ss_now_coarse_ms() + ss_coarse_slack_ms() < deadline_ms || ss_now_ms() < deadline_ms;
}

/* Milliseconds since the epoch (CLOCK_REALTIME): moments shown to an operator. */
static inline uint64_t ss_wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/*
 * The wall clock, coarse (CLOCK_REALTIME_COARSE, no system call): for
 * expiries of records that outlive a process, where a tick does not matter.
 */
static inline int64_t ss_wall_coarse_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME_COARSE, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#endif
