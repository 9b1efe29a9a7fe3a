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

/* Milliseconds since the epoch (CLOCK_REALTIME): moments shown to an operator. */
static inline uint64_t ss_wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

#endif
