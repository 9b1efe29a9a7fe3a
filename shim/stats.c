/* Reading the statistics files (shim/stats.h): used by srqshim-ctl and the tests. */
#include "shim/stats.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(sizeof(struct ss_stats_addr) == 20, "stats address layout");
_Static_assert(sizeof(struct ss_stats_conn) % 8 == 0, "stats slots stay 8-byte aligned");
_Static_assert(sizeof(struct ss_stats_head) % 8 == 0, "stats header keeps slots aligned");

const char *ss_stats_state_str(unsigned st)
{
	static const char *const names[SS_ST__COUNT] = {
		[SS_ST_FREE] = "free",
		[SS_ST_UPGRADED] = "upgraded",
		[SS_ST_TCP] = "tcp",
	};

	return st < SS_ST__COUNT && names[st] ? names[st] : "unknown";
}

int ss_stats_check(const void *buf, size_t len, char *err, size_t errlen)
{
	const struct ss_stats_head *h = buf;

	if (len < sizeof(h->magic) || memcmp(h->magic, SS_STATS_MAGIC, sizeof(h->magic)) != 0) {
		snprintf(err, errlen, "not a srqshim statistics file");
		return -EINVAL;
	}
	if (len < offsetof(struct ss_stats_head, conn_size) + sizeof(h->conn_size)) {
		snprintf(err, errlen, "truncated: %zu bytes", len);
		return -EINVAL;
	}
	if (h->version != SS_STATS_VERSION) {
		snprintf(err, errlen, "layout version %u, this tool reads %u", h->version,
			 SS_STATS_VERSION);
		return -EINVAL;
	}
	if (h->head_size != sizeof(*h) || h->conn_size != sizeof(struct ss_stats_conn)) {
		snprintf(err, errlen, "layout sizes %u/%u, expected %zu/%zu", h->head_size,
			 h->conn_size, sizeof(*h), sizeof(struct ss_stats_conn));
		return -EINVAL;
	}
	if (len < sizeof(*h) || (len - sizeof(*h)) / sizeof(struct ss_stats_conn) < h->n_slots ||
	    h->slots_hwm > h->n_slots) {
		snprintf(err, errlen, "truncated: %zu bytes for %u slots", len, h->n_slots);
		return -EINVAL;
	}
	return 0;
}

int ss_stats_open(const char *path, struct ss_stats_view *v, char *err, size_t errlen)
{
	struct stat st;
	int fd, ret;

	memset(v, 0, sizeof(*v));
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		ret = -errno;
		snprintf(err, errlen, "%s", strerror(errno));
		return ret;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
		close(fd);
		snprintf(err, errlen, "empty or not a regular file");
		return -EINVAL;
	}
	v->len = (size_t)st.st_size;
	v->map = mmap(NULL, v->len, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (v->map == MAP_FAILED) {
		ret = -errno;
		snprintf(err, errlen, "mmap: %s", strerror(errno));
		v->map = NULL;
		return ret;
	}
	ret = ss_stats_check(v->map, v->len, err, errlen);
	if (ret) {
		ss_stats_close(v);
		return ret;
	}
	v->head = v->map;
	v->slots = (const struct ss_stats_conn *)(v->head + 1);
	return 0;
}

void ss_stats_close(struct ss_stats_view *v)
{
	if (v->map)
		munmap(v->map, v->len);
	memset(v, 0, sizeof(*v));
}

uint64_t ss_stats_start_time(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long t = 0;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* The command may hold spaces and parentheses: fields start after the last ')'. */
	p = strrchr(buf, ')');
	if (!p)
		return 0;
	/* Field 3 (state) follows; the start time is field 22. */
	for (int field = 2; field < 22 && p; field++)
		p = strchr(p + 1, ' ');
	if (!p || sscanf(p + 1, "%llu", &t) != 1)
		return 0;
	return t;
}
