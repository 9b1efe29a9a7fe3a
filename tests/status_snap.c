/* status_snap (status_snap.h): this process's status, as the status tool shows it. */
#include "tests/status_snap.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void status_snap(const char *tag)
{
	const char *out = getenv("CHECK_STATUS"), *ctl = getenv("CHECK_CTL");
	char cmd[1024];

	if (!out || !ctl)
		return;
	/*
	 * system(), not fork and exec: glibc's system starts the tool without
	 * the interposed exec, so the caller's upgraded connections stay where
	 * they are (an exec from a fork moves every connection the new program
	 * could get back to TCP).
	 */
	snprintf(cmd, sizeof(cmd), "'%s' status --json --pid %d > '%s.%s'", ctl, (int)getpid(), out,
		 tag);
	if (system(cmd) != 0) {
		fprintf(stderr, "status_snap: %s: the status tool failed\n", tag);
		exit(1);
	}
}
