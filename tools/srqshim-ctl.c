/*
 * srqshim-ctl: what the shim is doing (status), its options (config), and
 * a launcher (run). Status reads the files shimmed processes publish
 * (shim/stats.h) and never talks to the processes themselves.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "handshake/hello.h"
#include "handshake/reason.h"
#include "shim/config.h"
#include "shim/ctlchan.h"
#include "shim/stats.h"

enum { EXIT_NOT_FOUND = 1, EXIT_USAGE = 2, EXIT_RUN_FAILED = 127 };

static const char usage_main[] =
	"NAME\n"
	"    srqshim-ctl - status, options and launcher of the srqshim RDMA shim\n"
	"\n"
	"SYNOPSIS\n"
	"    srqshim-ctl status [--pid PID] [--json] [--watch SECONDS]\n"
	"    srqshim-ctl config [--json]\n"
	"    srqshim-ctl downgrade --pid PID [--fd FD]\n"
	"    srqshim-ctl run [--mode srq|rq|tcp] [--lib PATH] -- COMMAND [ARGS...]\n"
	"    srqshim-ctl --help | COMMAND --help\n"
	"\n"
	"DESCRIPTION\n"
	"    status  lists the shimmed processes of this user (all users for root) with\n"
	"            their mode, device, registered memory, SRQ pool use and RNR count,\n"
	"            and each of their connections: addresses, state, receive mode of\n"
	"            both sides or the reason it stayed on TCP, bytes and messages each\n"
	"            way, send credits and window, grants and credit requests. Processes\n"
	"            publish this in shared memory (" SS_STATS_DIR_FMT "/PID.stats, with\n"
	"            the user id); reading it never disturbs them. Files of processes\n"
	"            that died without cleaning up are recognised and removed.\n"
	"    config  lists every option of the shim with its value in this environment,\n"
	"            its default, range and meaning.\n"
	"    downgrade  moves upgraded connections of process PID (all, or the one\n"
	"            on its fd FD) back onto their TCP connections, every byte kept\n"
	"            (docs/protocol.md, section 4): for an operator who must take a\n"
	"            device down. Run it in the process's network namespace.\n"
	"    run     runs COMMAND with libsrqshim.so preloaded (added to LD_PRELOAD) and\n"
	"            SRQSHIM_MODE set when --mode is given; other SRQSHIM_* variables\n"
	"            pass through.\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success; 1 --pid named no live shimmed process; 2 usage error or a bad\n"
	"    option value; 127 the command of run could not be started.\n";

static const char usage_status[] =
	"srqshim-ctl status [--pid PID] [--json] [--watch SECONDS]\n"
	"    --pid PID        only this process (exit status 1 if it is not live)\n"
	"    --json           one JSON document (schema: docs/status-json.md)\n"
	"    --watch SECONDS  print again every SECONDS until interrupted\n";

static const char usage_config[] =
	"srqshim-ctl config [--json]\n"
	"    lists every SRQSHIM_* option: value here, default, range, meaning\n";

static const char usage_downgrade[] =
	"srqshim-ctl downgrade --pid PID [--fd FD]\n"
	"    --pid PID  the process (exit status 1 if it has no operator channel)\n"
	"    --fd FD    only the connection on this fd of the process (default: all)\n"
	"    prints how many connections start their move back to TCP\n";

static const char usage_run[] =
	"srqshim-ctl run [--mode srq|rq|tcp] [--lib PATH] -- COMMAND [ARGS...]\n"
	"    --mode MODE  sets SRQSHIM_MODE for COMMAND\n"
	"    --lib PATH   the libsrqshim.so to preload (default: next to this tool's\n"
	"                 build, ../shim/libsrqshim.so, or SRQSHIM_LIB)\n";

/* ---- output helpers ---- */

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

static void addr_str(const struct ss_stats_addr *a, char *buf, size_t len)
{
	char ip[INET6_ADDRSTRLEN];

	if (a->family != AF_INET && a->family != AF_INET6) {
		snprintf(buf, len, "?");
		return;
	}
	inet_ntop(a->family, a->addr, ip, sizeof(ip));
	snprintf(buf, len, a->family == AF_INET6 ? "[%s]:%u" : "%s:%u", ip, a->port);
}

static const char *recv_mode_str(unsigned m)
{
	return m == SS_RECV_SRQ ? "srq" : m == SS_RECV_RQ ? "rq" : "?";
}

/* Why a connection is on TCP, and when it moved there after an upgrade (local time). */
static void reason_str(const struct ss_stats_conn *c, char *buf, size_t len)
{
	time_t t = (time_t)(c->moved_at / 1000);
	struct tm tm;

	if (c->moved_at && localtime_r(&t, &tm))
		snprintf(buf, len, "%s@%02d:%02d:%02d", ss_reason_str(c->reason), tm.tm_hour,
			 tm.tm_min, tm.tm_sec);
	else
		snprintf(buf, len, "%s", ss_reason_str(c->reason));
}

static const char *proc_mode_str(unsigned m)
{
	return m == SS_MODE_SRQ ? "srq" : m == SS_MODE_RQ ? "rq" : m == SS_MODE_TCP ? "tcp" : "?";
}

/* RNR NAKs received on the device (all processes): rxe and most drivers count them. */
static long long device_rnr(const char *dev)
{
	char path[PATH_MAX];
	long long v = -1;
	FILE *f;

	if (!dev[0])
		return -1;
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/hw_counters/rcvd_rnr_err",
		 dev);
	f = fopen(path, "r");
	if (f) {
		if (fscanf(f, "%lld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

/* A consistent copy of a slot's identity (state, addresses): retried while it is rewritten. */
static bool read_slot(const struct ss_stats_conn *src, struct ss_stats_conn *c)
{
	for (int tries = 0; tries < 100; tries++) {
		uint32_t seq = __atomic_load_n(&src->seq, __ATOMIC_ACQUIRE);

		if (seq & 1)
			continue;
		memcpy(c, src, sizeof(*c));
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (__atomic_load_n(&src->seq, __ATOMIC_ACQUIRE) == seq)
			return c->state != SS_ST_FREE;
	}
	return false;
}

/* ---- status ---- */

struct proc {
	char path[PATH_MAX];
	struct ss_stats_view v;
};

/* Opens every live process's file under dir; removes the files of dead ones. */
static int collect_dir(const char *dir, struct proc **procs, int *n, int *cap, int only_pid)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	if (!d)
		return 0;
	while ((e = readdir(d))) {
		char path[PATH_MAX], err[128];
		struct ss_stats_view v;
		int pid;

		if (sscanf(e->d_name, "%d.stats", &pid) != 1 || (only_pid && pid != only_pid))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (ss_stats_open(path, &v, err, sizeof(err)) != 0) {
			fprintf(stderr, "srqshim-ctl: %s: %s (ignored)\n", path, err);
			continue;
		}
		if ((int)v.head->pid != pid || ss_stats_start_time(pid) == 0 ||
		    ss_stats_start_time(pid) != v.head->start_time) {
			/* A process killed before it could remove its file: stale. */
			ss_stats_close(&v);
			unlink(path);
			continue;
		}
		if (*n == *cap) {
			*cap = *cap ? *cap * 2 : 16;
			*procs = realloc(*procs, (size_t)*cap * sizeof(**procs));
			if (!*procs) {
				perror("srqshim-ctl");
				exit(EXIT_USAGE);
			}
		}
		snprintf((*procs)[*n].path, sizeof((*procs)[*n].path), "%s", path);
		(*procs)[(*n)++].v = v;
	}
	closedir(d);
	return 0;
}

static int cmp_proc(const void *a, const void *b)
{
	const struct proc *x = a, *y = b;

	return (int)x->v.head->pid - (int)y->v.head->pid;
}

static void print_text(FILE *f, const struct proc *procs, int n)
{
	fprintf(f, "%-7s %-5s %-8s %10s %15s %8s  %s\n", "PID", "MODE", "DEVICE", "REG KiB",
		"SRQ USED/POOL/MAX", "RNR", "COMMAND");
	for (int i = 0; i < n; i++) {
		const struct ss_stats_head *h = procs[i].v.head;
		const struct ss_worker_stats *w = &h->worker;
		char pool[32];

		if (w->srq_max)
			snprintf(pool, sizeof(pool), "%u/%u/%u", w->srq_blocks - w->srq_posted,
				 w->srq_blocks, w->srq_max);
		else
			snprintf(pool, sizeof(pool), "-");
		char cmd[61], rnr[24];
		long long r = device_rnr(w->device);

		/* One line per process: control characters of the command line become spaces. */
		snprintf(cmd, sizeof(cmd), "%.60s", h->command);
		for (char *p = cmd; *p; p++)
			if ((unsigned char)*p < 0x20)
				*p = ' ';
		if (r >= 0)
			snprintf(rnr, sizeof(rnr), "%lld", r);
		else
			snprintf(rnr, sizeof(rnr), "-");
		fprintf(f, "%-7u %-5s %-8s %10llu %15s %8s  %s\n", h->pid, proc_mode_str(h->mode),
			w->device[0] ? w->device : "-", (unsigned long long)(w->reg_bytes >> 10),
			pool, rnr, cmd);
	}
	fprintf(f, "\n%-7s %-5s %-22s %-22s %-9s %-9s %12s %12s %9s %9s %6s %9s %9s\n", "PID", "FD",
		"LOCAL", "PEER", "STATE", "MODE", "TX BYTES", "RX BYTES", "TX MSGS", "RX MSGS",
		"CRED", "GRANTS", "REQS");
	for (int i = 0; i < n; i++) {
		const struct ss_stats_head *h = procs[i].v.head;

		for (uint32_t k = 0; k < h->slots_hwm; k++) {
			struct ss_stats_conn c;
			char la[64], pa[64], mode[40];

			if (!read_slot(&procs[i].v.slots[k], &c))
				continue;
			addr_str(&c.local, la, sizeof(la));
			addr_str(&c.peer, pa, sizeof(pa));
			if (c.state == SS_ST_UPGRADED)
				snprintf(mode, sizeof(mode), "%s/%s", recv_mode_str(c.mode),
					 recv_mode_str(c.peer_mode));
			else
				reason_str(&c, mode, sizeof(mode));
			fprintf(f,
				"%-7u %-5d %-22s %-22s %-9s %-9s %12llu %12llu %9llu %9llu "
				"%2u/%-3u "
				"%4llu/%-4llu %4llu/%-4llu\n",
				h->pid, c.fd, la, pa, ss_stats_state_str(c.state), mode,
				(unsigned long long)c.st.tx_bytes,
				(unsigned long long)c.st.rx_bytes, (unsigned long long)c.st.tx_msgs,
				(unsigned long long)c.st.rx_msgs, c.st.tx_credits, c.tx_window,
				(unsigned long long)c.st.grants_sent,
				(unsigned long long)c.st.grants_received,
				(unsigned long long)c.st.requests_sent,
				(unsigned long long)c.st.requests_received);
		}
	}
}

static void print_json(FILE *f, const struct proc *procs, int n)
{
	fprintf(f, "{\"schema\": 1, \"processes\": [");
	for (int i = 0; i < n; i++) {
		const struct ss_stats_head *h = procs[i].v.head;
		const struct ss_worker_stats *w = &h->worker;
		bool first = true;

		fprintf(f, "%s\n {\"pid\": %u, \"command\": ", i ? "," : "", h->pid);
		json_str(f, h->command);
		fprintf(f, ", \"mode\": \"%s\", \"device\": ", proc_mode_str(h->mode));
		json_str(f, w->device);
		fprintf(f,
			", \"registered_bytes\": %llu, \"send_pool_blocks\": %u, "
			"\"srq_pool\": {\"blocks\": %u, \"max\": %u, \"posted\": %u, \"in_use\": "
			"%u, "
			"\"peak_in_use\": %u, \"limit_events\": %llu}, \"device_rnr_naks\": %lld, "
			"\"qp_pool\": {\"ready\": %u, \"taken\": %llu, \"own\": %llu}, "
			"\"rq_pools_kept\": %u, \"connections\": [",
			(unsigned long long)w->reg_bytes, w->tx_blocks, w->srq_blocks, w->srq_max,
			w->srq_posted, w->srq_blocks - w->srq_posted, w->srq_peak_held,
			(unsigned long long)w->srq_limit_events, device_rnr(w->device), w->qp_ready,
			(unsigned long long)w->qp_taken, (unsigned long long)w->qp_own, w->rq_kept);
		for (uint32_t k = 0; k < h->slots_hwm; k++) {
			struct ss_stats_conn c;
			char la[64], pa[64];

			if (!read_slot(&procs[i].v.slots[k], &c))
				continue;
			addr_str(&c.local, la, sizeof(la));
			addr_str(&c.peer, pa, sizeof(pa));
			fprintf(f,
				"%s\n  {\"fd\": %d, \"local\": \"%s\", \"peer\": \"%s\", "
				"\"state\": \"%s\"",
				first ? "" : ",", c.fd, la, pa, ss_stats_state_str(c.state));
			first = false;
			if (c.state == SS_ST_UPGRADED)
				fprintf(f,
					", \"mode\": \"%s\", \"peer_mode\": \"%s\", \"reason\": "
					"null",
					recv_mode_str(c.mode), recv_mode_str(c.peer_mode));
			else
				fprintf(f,
					", \"mode\": \"tcp\", \"peer_mode\": null, \"reason\": "
					"\"%s\"",
					ss_reason_str(c.reason));
			if (c.moved_at)
				fprintf(f, ", \"moved_at\": %llu.%03llu",
					(unsigned long long)(c.moved_at / 1000),
					(unsigned long long)(c.moved_at % 1000));
			else
				fprintf(f, ", \"moved_at\": null");
			fprintf(f,
				", \"tx_bytes\": %llu, \"rx_bytes\": %llu, \"tx_msgs\": %llu, "
				"\"rx_msgs\": %llu, \"tx_credits\": %u, \"tx_window\": %u, "
				"\"rx_window\": %u, \"credits_owed\": %u, \"sq_free\": %u, "
				"\"grants_sent\": %llu, \"grants_received\": %llu, "
				"\"requests_sent\": %llu, \"requests_received\": %llu, "
				"\"copied_out\": %llu}",
				(unsigned long long)c.st.tx_bytes,
				(unsigned long long)c.st.rx_bytes, (unsigned long long)c.st.tx_msgs,
				(unsigned long long)c.st.rx_msgs, c.st.tx_credits, c.tx_window,
				c.rx_window, c.st.to_return, c.st.sq_free,
				(unsigned long long)c.st.grants_sent,
				(unsigned long long)c.st.grants_received,
				(unsigned long long)c.st.requests_sent,
				(unsigned long long)c.st.requests_received,
				(unsigned long long)c.st.copied_out);
		}
		fprintf(f, "]}");
	}
	fprintf(f, "\n]}\n");
}

static int status_once(int only_pid, bool json)
{
	struct proc *procs = NULL;
	int n = 0, cap = 0;
	char dir[PATH_MAX];

	if (geteuid() == 0) {
		/* root sees every user's processes */
		DIR *d = opendir("/dev/shm");
		struct dirent *e;
		unsigned uid;

		while (d && (e = readdir(d)))
			if (sscanf(e->d_name, "srqshim-%u", &uid) == 1 &&
			    strchr(e->d_name, '.') == NULL) {
				snprintf(dir, sizeof(dir), SS_STATS_DIR_FMT, uid);
				collect_dir(dir, &procs, &n, &cap, only_pid);
			}
		if (d)
			closedir(d);
	} else {
		snprintf(dir, sizeof(dir), SS_STATS_DIR_FMT, (unsigned)getuid());
		collect_dir(dir, &procs, &n, &cap, only_pid);
	}
	qsort(procs, (size_t)n, sizeof(*procs), cmp_proc);
	if (json)
		print_json(stdout, procs, n);
	else
		print_text(stdout, procs, n);
	fflush(stdout);
	for (int i = 0; i < n; i++)
		ss_stats_close(&procs[i].v);
	free(procs);
	return only_pid && n == 0 ? EXIT_NOT_FOUND : 0;
}

/* A positive number from the command line, or -1 after a message. */
static int positive(const char *arg, const char *what)
{
	char *end;
	long v = strtol(arg, &end, 10);

	if (end == arg || *end || v <= 0 || v > INT_MAX) {
		fprintf(stderr, "srqshim-ctl: bad %s %s\n", what, arg);
		return -1;
	}
	return (int)v;
}

static int cmd_status(int argc, char **argv)
{
	static const struct option opts[] = {
		{"pid", required_argument, NULL, 'p'},
		{"json", no_argument, NULL, 'j'},
		{"watch", required_argument, NULL, 'w'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	int only_pid = 0, watch = 0, c, ret;
	bool json = false;

	while ((c = getopt_long(argc, argv, "p:jw:h", opts, NULL)) != -1) {
		switch (c) {
		case 'p':
			if ((only_pid = positive(optarg, "pid")) < 0)
				return EXIT_USAGE;
			break;
		case 'j': json = true; break;
		case 'w':
			if ((watch = positive(optarg, "interval")) < 0)
				return EXIT_USAGE;
			break;
		case 'h': fputs(usage_status, stdout); return 0;
		default: fputs(usage_status, stderr); return EXIT_USAGE;
		}
	}
	for (;;) {
		if (watch && !json)
			fputs("\033[H\033[2J", stdout); /* a refreshing view */
		ret = status_once(only_pid, json);
		if (!watch)
			return ret;
		sleep((unsigned)watch);
	}
}

/* ---- downgrade: a request on the process's channel (shim/ctlchan.c) ---- */

static int cmd_downgrade(int argc, char **argv)
{
	static const struct option opts[] = {
		{"pid", required_argument, NULL, 'p'},
		{"fd", required_argument, NULL, 'f'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	struct sockaddr_un to, me = {.sun_family = AF_UNIX};
	struct timeval tv = {.tv_sec = 2};
	int pid = 0, fd = -1, c, s;
	char req[64], answer[64];
	ssize_t n;

	while ((c = getopt_long(argc, argv, "p:f:h", opts, NULL)) != -1) {
		switch (c) {
		case 'p':
			if ((pid = positive(optarg, "pid")) < 0)
				return EXIT_USAGE;
			break;
		case 'f':
			if (strcmp(optarg, "0") == 0)
				fd = 0;
			else if ((fd = positive(optarg, "fd")) < 0)
				return EXIT_USAGE;
			break;
		case 'h': fputs(usage_downgrade, stdout); return 0;
		default: fputs(usage_downgrade, stderr); return EXIT_USAGE;
		}
	}
	if (!pid) {
		fputs(usage_downgrade, stderr);
		return EXIT_USAGE;
	}
	s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	/* An address of our own (autobind) for the answer. */
	if (s < 0 || bind(s, (struct sockaddr *)&me, sizeof(sa_family_t)) != 0 ||
	    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) {
		perror("srqshim-ctl: socket");
		return EXIT_NOT_FOUND;
	}
	snprintf(req, sizeof(req), "downgrade %d\n", fd);
	if (sendto(s, req, strlen(req), 0, (struct sockaddr *)&to, ss_ctlchan_addr(pid, &to)) < 0) {
		fprintf(stderr, "srqshim-ctl: process %d has no operator channel: %s\n", pid,
			strerror(errno));
		close(s);
		return EXIT_NOT_FOUND;
	}
	n = recv(s, answer, sizeof(answer) - 1, 0);
	close(s);
	if (n <= 0) {
		fprintf(stderr, "srqshim-ctl: process %d did not answer\n", pid);
		return EXIT_NOT_FOUND;
	}
	answer[n] = 0;
	if (strncmp(answer, "ok ", 3) != 0) {
		fprintf(stderr, "srqshim-ctl: process %d: %s\n", pid, answer);
		return EXIT_USAGE;
	}
	printf("%s connection(s) of process %d moving back to TCP\n", answer + 3, pid);
	return 0;
}

/* ---- config ---- */

static int cmd_config(int argc, char **argv)
{
	struct ss_config cfg;
	bool json = argc > 1 && strcmp(argv[1], "--json") == 0;
	int bad;

	if (argc > 1 && strcmp(argv[1], "--help") == 0) {
		fputs(usage_config, stdout);
		return 0;
	}
	if (argc > 1 && !json) {
		fputs(usage_config, stderr);
		return EXIT_USAGE;
	}
	bad = ss_config_load(&cfg, ss_config_getenv, NULL, NULL, NULL);
	if (json)
		printf("{\"options\": [");
	for (size_t i = 0; i < ss_n_options; i++) {
		const struct ss_option *o = &ss_options[i];
		char value[300], range[64] = "", err[160];
		const char *env;
		char name[64];

		ss_option_format(o, &cfg, value, sizeof(value));
		snprintf(name, sizeof(name), "SRQSHIM_%s", o->name);
		env = getenv(name);
		if (o->type == SS_OPT_INT)
			snprintf(range, sizeof(range), "%ld..%ld", o->min, o->max);
		else if (o->type == SS_OPT_ENUM)
			for (int k = 0; o->choices[k]; k++)
				snprintf(range + strlen(range), sizeof(range) - strlen(range),
					 "%s%s", k ? "|" : "", o->choices[k]);
		else
			snprintf(range, sizeof(range), "text, at most %ld bytes", o->max);
		err[0] = '\0';
		if (env) {
			struct ss_config tmp = cfg;
			ss_option_parse(o, env, &tmp, err, sizeof(err));
		}
		if (json) {
			printf("%s\n {\"name\": ", i ? "," : "");
			json_str(stdout, name);
			printf(", \"value\": ");
			json_str(stdout, value);
			printf(", \"default\": ");
			json_str(stdout, o->defval);
			printf(", \"range\": ");
			json_str(stdout, range);
			printf(", \"set\": %s, \"error\": ", env ? "true" : "false");
			if (err[0])
				json_str(stdout, err);
			else
				printf("null");
			printf(", \"doc\": ");
			json_str(stdout, o->doc);
			printf("}");
		} else {
			printf("%s=%s%s\n    default %s; %s\n    %s\n", name, value,
			       env ? "" : " (default)", o->defval[0] ? o->defval : "(empty)", range,
			       o->doc);
			if (err[0])
				printf("    BAD VALUE %s: %s\n", env, err);
		}
	}
	if (json)
		printf("\n]}\n");
	return bad ? EXIT_USAGE : 0;
}

/* ---- run ---- */

static int find_lib(char *buf, size_t len)
{
	const char *env = getenv("SRQSHIM_LIB");
	char self[PATH_MAX];
	ssize_t n;

	if (env && env[0]) {
		snprintf(buf, len, "%s", env);
		return access(buf, R_OK);
	}
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return -1;
	self[n] = '\0';
	*strrchr(self, '/') = '\0';
	/* the build tree (tools/ beside shim/), then an installed layout (bin/ beside lib/) */
	if ((size_t)snprintf(buf, len, "%s/../shim/libsrqshim.so", self) < len &&
	    access(buf, R_OK) == 0)
		return 0;
	if ((size_t)snprintf(buf, len, "%s/../lib/libsrqshim.so", self) >= len)
		return -1;
	return access(buf, R_OK);
}

static int cmd_run(int argc, char **argv)
{
	static const struct option opts[] = {
		{"mode", required_argument, NULL, 'm'},
		{"lib", required_argument, NULL, 'l'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	char lib[PATH_MAX] = "", preload[PATH_MAX * 2];
	const char *mode = NULL, *old;
	int c;

	while ((c = getopt_long(argc, argv, "+m:l:h", opts, NULL)) != -1) {
		switch (c) {
		case 'm':
			mode = optarg;
			if (strcmp(mode, "srq") && strcmp(mode, "rq") && strcmp(mode, "tcp")) {
				fprintf(stderr, "srqshim-ctl: --mode must be srq, rq or tcp\n");
				return EXIT_USAGE;
			}
			break;
		case 'l': snprintf(lib, sizeof(lib), "%s", optarg); break;
		case 'h': fputs(usage_run, stdout); return 0;
		default: fputs(usage_run, stderr); return EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		fputs(usage_run, stderr);
		return EXIT_USAGE;
	}
	if (!lib[0] && find_lib(lib, sizeof(lib)) != 0) {
		fprintf(stderr,
			"srqshim-ctl: libsrqshim.so not found (set SRQSHIM_LIB or --lib)\n");
		return EXIT_USAGE;
	}
	if (lib[0] != '/') {
		char abs[PATH_MAX];
		if (realpath(lib, abs))
			snprintf(lib, sizeof(lib), "%s", abs);
	}
	old = getenv("LD_PRELOAD");
	snprintf(preload, sizeof(preload), "%s%s%s", lib, old && old[0] ? ":" : "", old ? old : "");
	setenv("LD_PRELOAD", preload, 1);
	if (mode)
		setenv("SRQSHIM_MODE", mode, 1);
	execvp(argv[optind], &argv[optind]);
	fprintf(stderr, "srqshim-ctl: %s: %s\n", argv[optind], strerror(errno));
	return EXIT_RUN_FAILED;
}

int main(int argc, char **argv)
{
	if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
	    strcmp(argv[1], "help") == 0) {
		fputs(usage_main, argc < 2 ? stderr : stdout);
		return argc < 2 ? EXIT_USAGE : 0;
	}
	if (strcmp(argv[1], "status") == 0)
		return cmd_status(argc - 1, argv + 1);
	if (strcmp(argv[1], "config") == 0)
		return cmd_config(argc - 1, argv + 1);
	if (strcmp(argv[1], "downgrade") == 0)
		return cmd_downgrade(argc - 1, argv + 1);
	if (strcmp(argv[1], "run") == 0)
		return cmd_run(argc - 1, argv + 1);
	fprintf(stderr, "srqshim-ctl: unknown command %s\n\n", argv[1]);
	fputs(usage_main, stderr);
	return EXIT_USAGE;
}
