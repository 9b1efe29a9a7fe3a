/*
 * The operator channel's address (ctlchan.c), shared with srqshim-ctl: a
 * datagram socket in the abstract namespace named "srqshim.PID".
 */
#pragma once

#include <stddef.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>

/* Fills *a with process pid's channel address; returns its length. */
static inline socklen_t ss_ctlchan_addr(int pid, struct sockaddr_un *a)
{
	int len;

	*a = (struct sockaddr_un){.sun_family = AF_UNIX};
	len = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "srqshim.%d", pid);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len);
}
