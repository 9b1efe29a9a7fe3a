/*
 * What the test and benchmark programs (the checks of tests/, tools/idle_echo.c)
 * share: failing loudly and parsing an IPv4 address.
 */
#pragma once

#include <netinet/in.h>

/* Prints "PROGRAM: what: strerror(errno)" and exits with status 2. */
_Noreturn void prog_die(const char *what);

/* addr:port as a sockaddr_in; a bad address exits with status 2. */
struct sockaddr_in prog_address(const char *addr, int port);
