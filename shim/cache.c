/*
 * What probes found out about destinations, shared by one user's shimmed
 * processes in one network namespace: a small file of fixed records under
 * /dev/shm, owned by the user and writable by nobody else, checked on every
 * open, locked with flock for each read-modify-write. Any doubt about the
 * file means no cache, never a wrong answer: the connection then probes.
 *
 * A destination this process saw shimmed is answered from memory (the memo)
 * until the file's record of it expires: the file cannot say otherwise
 * meanwhile, as a shimmed record is never demoted before it expires; the
 * record is written again (its life renewed) once half of it has passed.
 * So a connection to a known shimmed destination costs no system call here
 * (the file costs about twenty: open, stat, lock, read, write, close, at
 * the connect and at each of the server's two answers).
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "handshake/clock.h"
#include "shim/real.h"
#include "shim/shim.h"
#include "transport/log.h"

#define CACHE_MAGIC   0x53524351434831ull /* "SRQCH1" */
#define CACHE_RECORDS 256

enum { REC_FREE, REC_PLAIN, REC_SHIMMED, REC_PROBING };

struct cache_rec {
	uint8_t addr[16]; /* IPv4 as IPv4-mapped */
	uint16_t port;
	uint8_t state;
	uint8_t pad;
	int32_t prober;     /* pid, while probing */
	int64_t expires_ms; /* CLOCK_REALTIME */
};

struct cache_file {
	uint64_t magic;
	uint32_t n_records;
	uint32_t rec_size;
	struct cache_rec rec[CACHE_RECORDS];
};

static void dest_key(const struct sockaddr *a, uint8_t addr[16], uint16_t *port)
{
	memset(addr, 0, 16);
	if (a->sa_family == AF_INET) {
		const struct sockaddr_in *sin = (const struct sockaddr_in *)a;
		addr[10] = addr[11] = 0xff;
		memcpy(addr + 12, &sin->sin_addr, 4);
		*port = sin->sin_port;
	} else {
		const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)a;
		memcpy(addr, &sin6->sin6_addr, 16);
		*port = sin6->sin6_port;
	}
}

/* Opens the cache file locked; returns its fd or -1 (no cache). */
static int cache_open(void)
{
	char path[128];
	struct stat st, ns;
	int fd;

	if (stat("/proc/self/ns/net", &ns) != 0)
		ns.st_ino = 0;
	snprintf(path, sizeof(path), "/dev/shm/srqshim-%u-%lu.cache", (unsigned)getuid(),
		 (unsigned long)ns.st_ino);
	fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	/* Ours alone, or not used at all. */
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid() ||
	    (st.st_mode & 0022) || flock(fd, LOCK_EX) != 0) {
		ss_log_warn("%s is not a private regular file: no destination cache", path);
		ss_real.close(fd);
		return -1;
	}
	return fd;
}

static bool cache_read(int fd, struct cache_file *f)
{
	ssize_t n = pread(fd, f, sizeof(*f), 0);

	if (n == (ssize_t)sizeof(*f) && f->magic == CACHE_MAGIC && f->n_records == CACHE_RECORDS &&
	    f->rec_size == sizeof(struct cache_rec))
		return true;
	/* Empty, short, foreign or of another version: start afresh. */
	memset(f, 0, sizeof(*f));
	f->magic = CACHE_MAGIC;
	f->n_records = CACHE_RECORDS;
	f->rec_size = sizeof(struct cache_rec);
	return false;
}

static void cache_write(int fd, const struct cache_file *f)
{
	if (pwrite(fd, f, sizeof(*f), 0) != (ssize_t)sizeof(*f))
		ss_log_warn("cannot write the destination cache");
}

static struct cache_rec *find(struct cache_file *f, const uint8_t addr[16], uint16_t port,
			      bool make)
{
	struct cache_rec *free_rec = NULL, *oldest = &f->rec[0];
	int64_t now = ss_wall_coarse_ms();

	for (int i = 0; i < CACHE_RECORDS; i++) {
		struct cache_rec *r = &f->rec[i];

		if (r->state != REC_FREE && r->expires_ms <= now)
			r->state = REC_FREE;
		if (r->state == REC_FREE) {
			if (!free_rec)
				free_rec = r;
			continue;
		}
		if (r->port == port && memcmp(r->addr, addr, 16) == 0)
			return r;
		if (r->expires_ms < oldest->expires_ms)
			oldest = r;
	}
	if (!make)
		return NULL;
	struct cache_rec *r = free_rec ? free_rec : oldest;
	memset(r, 0, sizeof(*r));
	memcpy(r->addr, addr, 16);
	r->port = port;
	return r;
}

static bool prober_alive(const struct cache_rec *r)
{
	return r->prober > 0 && (kill(r->prober, 0) == 0 || errno == EPERM);
}

/* Guards cache_buf and the memo: threads of this process; other processes are kept out by flock. */
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cache_file cache_buf; /* big: not on the application's stack */

#define MEMO_SLOTS 16
static struct cache_memo {
	uint8_t addr[16];
	uint16_t port;
	int64_t expires_ms; /* of the file's shimmed record, CLOCK_REALTIME; 0: free */
} cache_memo[MEMO_SLOTS];
static unsigned cache_memo_next; /* the slot a new destination takes (round robin) */

/* How long the file's record says addr:port stays shimmed (ms; 0: not known here); cache_lock
 * held. */
static int64_t memo_left(const uint8_t addr[16], uint16_t port)
{
	int64_t now = ss_wall_coarse_ms();

	for (int i = 0; i < MEMO_SLOTS; i++)
		if (cache_memo[i].expires_ms > now && cache_memo[i].port == port &&
		    memcmp(cache_memo[i].addr, addr, 16) == 0)
			return cache_memo[i].expires_ms - now;
	return 0;
}

/* Remembers the file's shimmed record r of addr:port; cache_lock held. */
static void memo_note(const uint8_t addr[16], uint16_t port, const struct cache_rec *r)
{
	struct cache_memo *m = NULL;

	for (int i = 0; i < MEMO_SLOTS && !m; i++)
		if (cache_memo[i].port == port && memcmp(cache_memo[i].addr, addr, 16) == 0)
			m = &cache_memo[i];
	if (!m)
		m = &cache_memo[cache_memo_next++ % MEMO_SLOTS];
	memcpy(m->addr, addr, 16);
	m->port = port;
	m->expires_ms = r->expires_ms;
}

void ss_cache_after_fork(void)
{
	pthread_mutex_init(&cache_lock, NULL);
}

/* How long the memo knows addr:port as shimmed (ms; 0: ask the file). */
static int64_t cache_memo_left(const uint8_t addr[16], uint16_t port)
{
	int64_t left;

	pthread_mutex_lock(&cache_lock);
	left = memo_left(addr, port);
	pthread_mutex_unlock(&cache_lock);
	return left;
}

/* What the file says of addr:port; takes the probe when unknown and prober_p is given. */
static enum ss_dest_state cache_lookup(const uint8_t addr[16], uint16_t port, bool *prober_p)
{
	struct cache_file *f = &cache_buf;
	enum ss_dest_state st = SS_DEST_UNKNOWN;
	int fd = cache_open();

	if (fd < 0)
		return SS_DEST_UNKNOWN;
	pthread_mutex_lock(&cache_lock);
	cache_read(fd, f);
	struct cache_rec *r = find(f, addr, port, prober_p != NULL);
	if (!r) {
		/* Not there (and not to be made). */
	} else if (r->state == REC_PLAIN) {
		st = SS_DEST_PLAIN;
	} else if (r->state == REC_SHIMMED) {
		st = SS_DEST_SHIMMED;
		memo_note(addr, port, r);
	} else if (prober_p && !(r->state == REC_PROBING && prober_alive(r))) {
		/* Unknown (or its prober died): we probe. */
		r->state = REC_PROBING;
		r->prober = getpid();
		r->expires_ms = ss_wall_coarse_ms() + ss_cfg.acked_timeout_ms + 1000;
		cache_write(fd, f);
		*prober_p = true;
	}
	pthread_mutex_unlock(&cache_lock);
	ss_real.close(fd); /* releases the flock */
	return st;
}

/* What is known of dst: the memo, then the file (taking the probe if prober_p is given and nobody
 * has it). */
static enum ss_dest_state cache_query(const struct sockaddr *dst, bool *prober_p)
{
	uint8_t addr[16];
	uint16_t port;

	dest_key(dst, addr, &port);
	if (cache_memo_left(addr, port) > 0)
		return SS_DEST_SHIMMED;
	return cache_lookup(addr, port, prober_p);
}

enum ss_dest_state ss_cache_begin(const struct sockaddr *dst, bool *prober_p)
{
	*prober_p = false;
	/* Another probe under way: we probe too, at once (never wait here, see ss_cache_peek). */
	return cache_query(dst, prober_p);
}

enum ss_dest_state ss_cache_peek(const struct sockaddr *dst)
{
	return cache_query(dst, NULL);
}

void ss_cache_record(const struct sockaddr *dst, enum ss_dest_state st, bool prober)
{
	struct cache_file *f = &cache_buf;
	uint8_t addr[16];
	uint16_t port;
	int fd;

	dest_key(dst, addr, &port);
	/*
	 * Known, with more than half its life ahead: not written again (a
	 * prober always writes: its "probing" mark must go).
	 */
	if (st == SS_DEST_SHIMMED && !prober &&
	    cache_memo_left(addr, port) > (int64_t)ss_cfg.cache_ttl_s * 500)
		return;
	fd = cache_open();
	if (fd < 0)
		return;
	pthread_mutex_lock(&cache_lock);
	cache_read(fd, f);
	struct cache_rec *r = find(f, addr, port, st != SS_DEST_UNKNOWN);
	if (r) {
		if (st == SS_DEST_UNKNOWN) {
			if (r->state == REC_PROBING && r->prober == getpid())
				r->state = REC_FREE;
		} else if (!(st == SS_DEST_PLAIN && r->state == REC_SHIMMED)) {
			/* A destination once seen shimmed is never demoted by silence. */
			r->state = st == SS_DEST_PLAIN ? REC_PLAIN : REC_SHIMMED;
			r->prober = 0;
			r->expires_ms = ss_wall_coarse_ms() + (int64_t)ss_cfg.cache_ttl_s * 1000;
		}
		if (r->state == REC_SHIMMED)
			memo_note(addr, port, r);
		cache_write(fd, f);
	}
	pthread_mutex_unlock(&cache_lock);
	ss_real.close(fd);
}
