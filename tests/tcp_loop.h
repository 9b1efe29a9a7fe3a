/* Loopback TCP for unit tests of the stream logic (no device, no shim). */
#ifndef SS_TESTS_TCP_LOOP_H
#define SS_TESTS_TCP_LOOP_H

#include "handshake/session.h"

/* The handshake layer's I/O through libc. */
extern const struct ss_hs_io tcp_loop_io;

/* Connects *a to *b over 127.0.0.1 (TCP_NODELAY on both); fails the test if it cannot. */
void tcp_loop_pair(int *a, int *b);

#endif
