/* Loopback TCP for unit tests (tcp_loop.h). */
#include "tests/tcp_loop.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <arpa/inet.h>
#include <cmocka.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

static int tcp_loop_ioctl(int fd, unsigned long req, int *arg)
{
	return ioctl(fd, req, arg);
}

const struct ss_hs_io tcp_loop_io = {send, recv, poll, tcp_loop_ioctl};

void tcp_loop_pair(int *a, int *b)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(l >= 0);
	assert_int_equal(bind(l, (struct sockaddr *)&sa, sl), 0);
	assert_int_equal(listen(l, 1), 0);
	assert_int_equal(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
	*a = socket(AF_INET, SOCK_STREAM, 0);
	assert_int_equal(connect(*a, (struct sockaddr *)&sa, sl), 0);
	*b = accept(l, NULL, NULL);
	assert_true(*b >= 0);
	close(l);
	setsockopt(*a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(*b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}
