/*
 * What the test and benchmark programs (the checks of tests/, tools/idle_echo.c)
 * share: failing loudly, parsing an IPv4 address, writing a whole buffer.
 */
#pragma once

#include <netinet/in.h>

/* Prints "PROGRAM: what: strerror(errno)" and exits with status 2. */
_Noreturn void prog_die(const char *what);

/* addr:port as a sockaddr_in; a bad address exits with status 2. */
struct sockaddr_in prog_address(const char *addr, int port);

/*
 * Writes all of p's len bytes to fd, waiting (poll, 60 s) when a
 * non-blocking fd is full; any failure exits with status 2.
 */
void prog_write_all(int fd, const void *p, size_t len);
