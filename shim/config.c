#include "shim/config.h"

#include "handshake/policy.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SS_ENV_PREFIX "SRQSHIM_"

static const char *const log_levels[] = {"none", "error", "warn", "info", "debug", NULL};
static const char *const modes[] = {
	[SS_MODE_TCP] = "tcp", [SS_MODE_RQ] = "rq", [SS_MODE_SRQ] = "srq", NULL};
static const char *const starts[] = {[SS_START_RDMA] = "rdma", [SS_START_TCP] = "tcp", NULL};

static int check_peers(const char *value, char *err, size_t errlen)
{
	struct ss_policy p;
	char why[160];

	if (ss_policy_parse(value, &p, why, sizeof(why)) == 0)
		return 0;
	snprintf(err, errlen, "SRQSHIM_PEERS: %s", why);
	return -EINVAL;
}

/* clang-format off */
static const char *const test_points[SS_TP__COUNT] = {
	[SS_TP_CLIENT_HELLO] = "client-hello",
	[SS_TP_CLIENT_READY] = "client-ready",
	[SS_TP_SERVER_ACK] = "server-ack",
	[SS_TP_SERVER_ACCEPT] = "server-accept",
	[SS_TP_FIRST_READ] = "first-read",
	[SS_TP_SERVER_PAIR] = "server-pair",
	[SS_TP_LOAD] = "load",
	[SS_TP_DOWN_RETURN] = "down-return",
	[SS_TP_HANDOVER] = "handover",
	[SS_TP_CLIENT_LOOK] = "client-look",
	[SS_TP_SHUT_CONNECT] = "shut-connect",
};
/* clang-format on */

int ss_test_delays_parse(const char *value, int ms[SS_TP__COUNT], char *err, size_t errlen)
{
	const char *p = value;

	for (int i = 0; i < SS_TP__COUNT; i++)
		ms[i] = 0;
	while (*p) {
		size_t n = strcspn(p, "=,");
		int i;
		char *end;
		long v;

		for (i = 0; i < SS_TP__COUNT; i++)
			if (strlen(test_points[i]) == n && strncmp(p, test_points[i], n) == 0)
				break;
		if (i == SS_TP__COUNT || p[n] != '=') {
			int len = snprintf(
				err, errlen,
				"SRQSHIM_TEST_DELAYS: '%.*s' is not POINT=MS (points:", (int)n, p);

			for (int k = 0; k < SS_TP__COUNT && len > 0 && (size_t)len < errlen; k++)
				len += snprintf(err + len, errlen - (size_t)len, " %s",
						test_points[k]);
			if (len > 0 && (size_t)len < errlen)
				snprintf(err + len, errlen - (size_t)len, ")");
			return -EINVAL;
		}
		errno = 0;
		v = strtol(p + n + 1, &end, 10);
		if (end == p + n + 1 || (*end && *end != ',') || v < 0 || v > 60000 || errno) {
			snprintf(err, errlen,
				 "SRQSHIM_TEST_DELAYS: bad delay for %s (0 to 60000 ms)",
				 test_points[i]);
			return -EINVAL;
		}
		ms[i] = (int)v;
		p = *end ? end + 1 : end;
	}
	return 0;
}

static int check_test_delays(const char *value, char *err, size_t errlen)
{
	int ms[SS_TP__COUNT];

	return ss_test_delays_parse(value, ms, err, errlen);
}

#define INT_OPTION(NAME, field, def, lo, hi, text)                                                 \
	{                                                                                          \
		.name = NAME, .defval = def, .doc = text,                                          \
		.offset = offsetof(struct ss_config, field), .type = SS_OPT_INT, .min = lo,        \
		.max = hi,                                                                         \
	}

#define ENUM_OPTION(NAME, field, def, names, text)                                                 \
	{                                                                                          \
		.name = NAME, .defval = def, .doc = text,                                          \
		.offset = offsetof(struct ss_config, field), .type = SS_OPT_ENUM,                  \
		.choices = names,                                                                  \
	}

const struct ss_option ss_options[] = {
	ENUM_OPTION("MODE", mode, "srq", modes,
		    "how connections are carried: srq (RDMA, receives from one shared receive "
		    "queue and pool per process), rq (RDMA, a private receive queue and buffers "
		    "per connection) or tcp (never upgrade)"),
	ENUM_OPTION("START", start, "tcp", starts,
		    "client: where a connection starts: tcp (the server answers LATER, and the "
		    "connection moves to RDMA once SRQSHIM_MOVE_AFTER_* say it is worth it) or "
		    "rdma (upgraded at connect when the server agrees)"),
	ENUM_OPTION(
		"LOG_LEVEL", log_level, "error", log_levels,
		"messages written to stderr (never when stderr is a socket): none, error, warn, "
		"info or debug"),
	{
		.name = "DEVICE",
		.defval = "",
		.doc = "RDMA device to use (e.g. rxe0); empty: the device whose GID table holds "
		       "the "
		       "connection's local address. Needed for loopback connections",
		.offset = offsetof(struct ss_config, device),
		.type = SS_OPT_STRING,
		.max = sizeof(((struct ss_config *)0)->device) - 1,
	},
	{
		.name = "PEERS",
		.defval = "",
		.doc = "destinations a client offers an upgrade to, as a comma-separated list of "
		       "ADDR[/PREFIX][:PORT] or [IPV6][/PREFIX][:PORT]; empty: all. Others stay on "
		       "TCP without a probe (reason: policy)",
		.offset = offsetof(struct ss_config, peers),
		.type = SS_OPT_STRING,
		.max = sizeof(((struct ss_config *)0)->peers) - 1,
		.check = check_peers,
	},
	INT_OPTION("PORT", port, "0", 0, 255, "device port to use; 0: any active port"),
	INT_OPTION("GID_INDEX", gid_index, "-1", -1, 65535,
		   "GID table index to use; -1: the GID of the local address (RoCE v2 first)"),
	INT_OPTION("SQ_DEPTH", sq_depth, "15", 4, 4096,
		   "send queue depth per connection (2 entries are kept for control messages); "
		   "it sets most of an idle connection's memory (rxe rounds depth + 1 up to a "
		   "power of two: 15, 31, 63 waste nothing)"),
	INT_OPTION("RQ_DEPTH", rq_depth, "64", 1, 4096,
		   "receive buffers posted per connection in rq mode: the peer's send window"),
	INT_OPTION("SRQ_WINDOW", srq_window, "16", 1, 4096,
		   "srq mode: messages a peer may send before its first grant (not backed by "
		   "reserved buffers: RNR retry absorbs a burst of many connections)"),
	INT_OPTION("SRQ_POOL", srq_pool, "128", 4, 32768,
		   "srq mode: receive buffers posted on the shared receive queue at first, and "
		   "the step by which the pool grows when the queue runs low"),
	INT_OPTION("SRQ_POOL_MAX", srq_pool_max, "4096", 4, 32768,
		   "srq mode: most receive buffers in the pool (also capped by the device's CQ "
		   "size)"),
	INT_OPTION("SRQ_HOLD", srq_hold, "8", 0, 4096,
		   "srq mode: received buffers a connection keeps unread in the pool; beyond "
		   "this, unread data is copied out so a slow reader cannot starve the others"),
	INT_OPTION("QP_POOL", qp_pool, "4", 0, 16,
		   "QPs per device made ahead of need by the progress thread, so a new connection "
		   "only connects one; rq mode also keeps closed connections' receive buffers "
		   "registered for new ones (0: each connection makes its own)"),
	INT_OPTION("TX_POOL_MAX", tx_pool_max, "8192", 16, 1048576,
		   "most send buffers per device, shared by all connections (taken while data "
		   "is in flight)"),
	INT_OPTION("BUF_SIZE", buf_size, "8192", 256, 1048576,
		   "bytes per receive buffer, and so the largest single RDMA SEND"),
	INT_OPTION("MAX_INLINE", max_inline, "64", 0, 256, "SENDs up to this size go inline"),
	INT_OPTION("MOVE_AFTER_MS", move_after_ms, "50", -1, 86400000,
		   "a connection that started on TCP moves to RDMA once it is this old and has "
		   "carried SRQSHIM_MOVE_AFTER_BYTES or made SRQSHIM_MOVE_AFTER_CALLS reads and "
		   "writes; -1: it never moves (either side may start the move)"),
	INT_OPTION("MOVE_AFTER_BYTES", move_after_bytes, "65536", 0, 2147483647,
		   "bytes both ways after which a connection that started on TCP moves (with "
		   "SRQSHIM_MOVE_AFTER_MS)"),
	INT_OPTION("MOVE_AFTER_CALLS", move_after_calls, "16", 0, 2147483647,
		   "reads and writes that moved bytes, after which a connection that started on "
		   "TCP moves (with SRQSHIM_MOVE_AFTER_MS)"),
	INT_OPTION("HELLO_TIMEOUT_MS", hello_timeout_ms, "2000", 10, 600000,
		   "client: how long to wait for any answer to a HELLO before taking the server "
		   "for plain TCP"),
	INT_OPTION("ACKED_TIMEOUT_MS", acked_timeout_ms, "15000", 10, 600000,
		   "client: how long to wait for the decision once the server acknowledged"),
	INT_OPTION("SERVER_WAIT_MS", server_wait_ms, "200", 0, 60000,
		   "server: how long a first write waits for a client HELLO before the "
		   "connection is taken for plain TCP (raised by 4 x the TCP round trip)"),
	INT_OPTION("LINGER_MS", linger_ms, "5000", 0, 600000,
		   "close and exit: how long to wait for accepted bytes to be delivered"),
	INT_OPTION("CACHE_TTL_S", cache_ttl_s, "60", 1, 86400,
		   "how long a destination is remembered as plain or shimmed"),
	{
		.name = "TEST_DELAYS",
		.defval = "",
		.doc = "for tests only: sleep at points of the negotiation, as "
		       "POINT=MS[,POINT=MS...] with points client-hello, client-ready, server-ack, "
		       "server-accept, first-read, server-pair, load, down-return, handover, "
		       "client-look, shut-connect; empty: never",
		.offset = offsetof(struct ss_config, test_delays),
		.type = SS_OPT_STRING,
		.max = sizeof(((struct ss_config *)0)->test_delays) - 1,
		.check = check_test_delays,
	},
	INT_OPTION("POLL_US", poll_us, "2000", 0, 10000000,
		   "a blocking read or write on an upgraded connection polls the completion queue "
		   "itself this long before it sleeps (0: sleep at once; large: busy polling)"),
};

const size_t ss_n_options = sizeof(ss_options) / sizeof(ss_options[0]);

int ss_option_parse(const struct ss_option *opt, const char *value, struct ss_config *cfg,
		    char *err, size_t errlen)
{
	char *field = (char *)cfg + opt->offset;

	switch (opt->type) {
	case SS_OPT_INT: {
		char *end;
		long v;

		errno = 0;
		v = strtol(value, &end, 0);
		if (end == value || *end != '\0' || errno == ERANGE) {
			snprintf(err, errlen, "SRQSHIM_%s='%s' is not a number", opt->name, value);
			return -EINVAL;
		}
		if (v < opt->min || v > opt->max) {
			snprintf(err, errlen, "SRQSHIM_%s=%ld is out of range [%ld, %ld]",
				 opt->name, v, opt->min, opt->max);
			return -ERANGE;
		}
		*(int *)field = (int)v;
		return 0;
	}
	case SS_OPT_STRING:
		if (strlen(value) > (size_t)opt->max) {
			snprintf(err, errlen, "SRQSHIM_%s is longer than %ld characters", opt->name,
				 opt->max);
			return -ERANGE;
		}
		if (opt->check && opt->check(value, err, errlen) < 0)
			return -EINVAL;
		strcpy(field, value);
		return 0;
	case SS_OPT_ENUM:
		for (int i = 0; opt->choices[i]; i++) {
			if (strcmp(value, opt->choices[i]) == 0) {
				*(int *)field = i;
				return 0;
			}
		}
		int n = snprintf(err, errlen, "SRQSHIM_%s='%s' is not one of:", opt->name, value);
		for (int i = 0; opt->choices[i] && n > 0 && (size_t)n < errlen; i++)
			n += snprintf(err + n, errlen - (size_t)n, " %s", opt->choices[i]);
		return -EINVAL;
	}
	snprintf(err, errlen, "SRQSHIM_%s: unknown option type", opt->name);
	return -EINVAL;
}

void ss_option_format(const struct ss_option *opt, const struct ss_config *cfg, char *buf,
		      size_t len)
{
	const char *field = (const char *)cfg + opt->offset;

	switch (opt->type) {
	case SS_OPT_INT: snprintf(buf, len, "%d", *(const int *)field); break;
	case SS_OPT_STRING: snprintf(buf, len, "%s", field); break;
	case SS_OPT_ENUM: snprintf(buf, len, "%s", opt->choices[*(const int *)field]); break;
	}
}

int ss_config_load(struct ss_config *cfg, ss_config_lookup_fn lookup, void *lookup_arg,
		   ss_config_report_fn report, void *report_arg)
{
	char err[256], var[64];
	int bad = 0;

	memset(cfg, 0, sizeof(*cfg));
	for (size_t i = 0; i < ss_n_options; i++) {
		/* The defaults are parsed too, so the table is their one source. */
		if (ss_option_parse(&ss_options[i], ss_options[i].defval, cfg, err, sizeof(err)))
			abort(); /* a bad default is a build defect; tests catch it */
	}
	for (size_t i = 0; i < ss_n_options; i++) {
		const char *value;

		snprintf(var, sizeof(var), SS_ENV_PREFIX "%s", ss_options[i].name);
		value = lookup(var, lookup_arg);
		if (!value)
			continue;
		if (ss_option_parse(&ss_options[i], value, cfg, err, sizeof(err)) < 0) {
			bad++;
			if (report) {
				size_t n = strlen(err);
				snprintf(err + n, sizeof(err) - n, "; using the default '%s'",
					 ss_options[i].defval);
				report(err, report_arg);
			}
		}
	}
	return bad;
}

const char *ss_config_getenv(const char *name, void *arg)
{
	(void)arg;
	return secure_getenv(name);
}
