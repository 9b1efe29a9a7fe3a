/*
 * The statistics a shimmed process publishes for srqshim-ctl: one file per
 * process, SS_STATS_DIR/PID.stats (the directory is per user, mode 0700),
 * made at the process's first TCP connection and removed at its exit. A
 * header, then n_slots connection slots. Host byte order: the file never
 * leaves the host. The writer updates counters with plain stores (no lock,
 * no system call); a reader may see a counter from just before or after an
 * update, never a torn 64-bit one. A slot's identity (state, addresses)
 * changes under its seq counter: odd while it is being rewritten.
 *
 * Compatibility: readers check magic, version and the sizes in the header;
 * a version change means an incompatible layout. Slots beyond
 * slots_hwm were never used.
 */
#ifndef SS_SHIM_STATS_H
#define SS_SHIM_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "transport/conn.h"

#define SS_STATS_MAGIC   "SRQSTATS"
#define SS_STATS_VERSION 3
#define SS_STATS_DIR_FMT "/dev/shm/srqshim-%u" /* the user id */
#define SS_STATS_SLOTS   65536                 /* a sparse file: untouched slots cost nothing */

enum ss_stats_state {
	SS_ST_FREE = 0,
	SS_ST_UPGRADED, /* on RDMA */
	SS_ST_TCP,      /* on TCP; reason says why */
	SS_ST__COUNT,
};

/* Returns a short, stable name ("free", "upgraded", "tcp"). */
const char *ss_stats_state_str(unsigned st);

struct ss_stats_addr {
	uint8_t family; /* AF_INET or AF_INET6; 0: unknown */
	uint8_t pad;
	uint16_t port; /* host order */
	uint8_t addr[16];
};

struct ss_stats_conn {
	uint32_t seq;      /* odd while state and addresses are rewritten */
	uint32_t state;    /* enum ss_stats_state */
	int32_t fd;        /* the application's fd number */
	uint16_t reason;   /* enum ss_reason, for SS_ST_TCP */
	uint8_t mode;      /* our enum ss_recv_mode when upgraded */
	uint8_t peer_mode; /* the peer's */
	struct ss_stats_addr local, peer;
	uint32_t tx_window; /* messages we may send before a grant (the peer's window) */
	uint32_t rx_window; /* the window we gave the peer */
	uint64_t moved_at;  /* ms since the epoch: when an upgraded connection moved to TCP, or 0 */
	struct ss_conn_stats st;
};

struct ss_stats_head {
	char magic[8];
	uint32_t version;
	uint32_t head_size; /* sizeof(struct ss_stats_head) */
	uint32_t conn_size; /* sizeof(struct ss_stats_conn) */
	uint32_t n_slots;
	uint32_t slots_hwm; /* one past the highest slot ever used */
	uint32_t pid;
	uint64_t start_time; /* field 22 of /proc/PID/stat: a reused pid is told apart */
	uint32_t mode;       /* enum ss_mode of the process */
	uint32_t pad;
	char command[256]; /* the command line, arguments separated by spaces */
	struct ss_worker_stats worker;
};

/* A stats file opened for reading. */
struct ss_stats_view {
	const struct ss_stats_head *head;
	const struct ss_stats_conn *slots;
	void *map;
	size_t len;
};

/*
 * Checks that the len bytes at buf are a stats file this build can read.
 * Returns 0, or -EINVAL with a message in err (foreign or truncated file,
 * unknown version or layout). Pure.
 */
int ss_stats_check(const void *buf, size_t len, char *err, size_t errlen);

/* Maps path read-only and checks it. Returns 0, or -errno with a message in err. */
int ss_stats_open(const char *path, struct ss_stats_view *v, char *err, size_t errlen);

/* Unmaps a view; accepts one that failed to open. */
void ss_stats_close(struct ss_stats_view *v);

/* The start time of process pid (field 22 of /proc/PID/stat), or 0 if it is gone. */
uint64_t ss_stats_start_time(pid_t pid);

/* ---- the writer, in libsrqshim.so (shim/publish.c) ---- */

/*
 * A slot for a connection that was just decided, filled in with its
 * addresses (from tcp_fd; the peer is peer when given: the address a
 * client connected to, or what accept gave), state and reason; NULL when nothing can be published
 * (the file cannot be made). Makes the process's file on first use.
 */
struct ss_stats_conn *ss_stats_conn_open(int app_fd, int tcp_fd, const struct sockaddr *peer,
					 enum ss_stats_state st, unsigned reason);

/*
 * The connection of slot shows as st (reason: for SS_ST_TCP) from now on;
 * moved: it went back to TCP from RDMA now (moved_at).
 */
void ss_stats_conn_set(struct ss_stats_conn *slot, enum ss_stats_state st, unsigned reason,
		       bool moved);

/* Frees a slot (NULL accepted). */
void ss_stats_conn_close(struct ss_stats_conn *slot);

/* Slot number i <-> slot, for the fd table's plain entries. */
uint32_t ss_stats_conn_index(const struct ss_stats_conn *slot);
struct ss_stats_conn *ss_stats_conn_at(uint32_t i);

/* The transport's worker exists: it publishes its statistics too. */
void ss_stats_worker_ready(void);

/* In a forked child: the parent's file is the parent's; the child makes its own on need. */
void ss_stats_after_fork(void);

/* At exit: the file goes. */
void ss_stats_fini(void);

#endif
