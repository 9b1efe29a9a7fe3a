#include "tools/prog.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void prog_die(const char *what)
{
	fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what, strerror(errno));
	exit(2);
}

struct sockaddr_in prog_address(const char *addr, int port)
{
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};

	if (inet_pton(AF_INET, addr, &sin.sin_addr) != 1) {
		fprintf(stderr, "%s: bad address %s\n", program_invocation_short_name, addr);
		exit(2);
	}
	return sin;
}

void prog_write_all(int fd, const void *p, size_t len)
{
	const unsigned char *b = p;

	while (len) {
		ssize_t n = write(fd, b, len);

		if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			struct pollfd pf = {.fd = fd, .events = POLLOUT};

			if (errno == EAGAIN && poll(&pf, 1, 60000) != 1)
				prog_die("poll");
			continue;
		}
		if (n <= 0)
			prog_die("write");
		b += n;
		len -= (size_t)n;
	}
}
