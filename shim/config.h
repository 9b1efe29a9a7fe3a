/* The one table of options, read from SRQSHIM_* environment variables. */
#ifndef SS_SHIM_CONFIG_H
#define SS_SHIM_CONFIG_H

#include <stddef.h>

enum ss_mode {
	SS_MODE_TCP,
	SS_MODE_RQ,
	SS_MODE_SRQ,
};

/* Where a client's connection starts (SRQSHIM_START). */
enum ss_start {
	SS_START_RDMA, /* upgraded at connect when the server agrees */
	SS_START_TCP,  /* on TCP: the HELLO asks for LATER (docs/protocol.md, section 5) */
};

struct ss_config {
	int mode;        /* enum ss_mode */
	int start;       /* enum ss_start */
	int log_level;   /* enum ss_log_level */
	char device[64]; /* "" = choose by address */
	int port;        /* 0 = any active port */
	int gid_index;   /* -1 = the GID of the local address */
	int sq_depth;
	int rq_depth;
	int srq_window;
	int srq_pool;
	int srq_pool_max;
	int srq_hold;
	int tx_pool_max;
	int qp_pool;
	int buf_size;
	int max_inline;
	int hello_timeout_ms;
	int acked_timeout_ms;
	int server_wait_ms;
	int linger_ms;
	int cache_ttl_s;
	int poll_us;
	int move_after_ms; /* -1: a connection that starts on TCP never moves */
	int move_after_bytes;
	int move_after_calls;
	char peers[256];       /* SRQSHIM_PEERS, checked by ss_policy_parse() */
	char test_delays[128]; /* SRQSHIM_TEST_DELAYS, checked by ss_test_delays_parse() */
};

/* Points of the negotiation where a test may make the shim sleep (SRQSHIM_TEST_DELAYS). */
enum ss_test_point {
	SS_TP_CLIENT_HELLO,  /* client: before the HELLO goes out */
	SS_TP_CLIENT_READY,  /* client: before READY (or a DECLINE of an ACCEPT) */
	SS_TP_SERVER_ACK,    /* server: before an ACK or a LATER */
	SS_TP_SERVER_ACCEPT, /* server: before ACCEPT */
	SS_TP_FIRST_READ,    /* server: a blocking read, between its state check and its wait */
	SS_TP_SERVER_PAIR,   /* server: the HELLO taken, before the socketpair goes on the fd */
	SS_TP_LOAD,          /* before the transport module is loaded */
	SS_TP_DOWN_RETURN,   /* a live downgrade: the peer's RDMA stream ended, before RETURN */
	SS_TP_HANDOVER,      /* a forked child's request for its connection: before the answer */
	SS_TP_CLIENT_LOOK,   /* client starting on TCP: the progress thread's look, unlocked */
	SS_TP_SHUT_CONNECT,  /* client: shutdown() found the connect running, before it shuts */
	SS_TP__COUNT,
};

/*
 * Parses "point=ms[,point=ms...]" (points: client-hello, client-ready,
 * server-ack, server-accept, first-read, server-pair, load, down-return,
 * handover) into ms[]. Returns 0 or -EINVAL with a message.
 */
int ss_test_delays_parse(const char *value, int ms[SS_TP__COUNT], char *err, size_t errlen);

enum ss_opt_type {
	SS_OPT_INT,
	SS_OPT_STRING,
	SS_OPT_ENUM,
};

struct ss_option {
	const char *name; /* without the SRQSHIM_ prefix */
	const char *defval;
	const char *doc;
	size_t offset; /* of the field in struct ss_config */
	enum ss_opt_type type;
	long min, max;              /* SS_OPT_INT: inclusive range; SS_OPT_STRING: max length */
	const char *const *choices; /* SS_OPT_ENUM: NULL-terminated names, stored as the index */
	/* SS_OPT_STRING: optional check; returns 0 or -EINVAL with a message in err */
	int (*check)(const char *value, char *err, size_t errlen);
};

extern const struct ss_option ss_options[];
extern const size_t ss_n_options;

/* Returns the value of variable name (with prefix), or NULL when unset. */
typedef const char *(*ss_config_lookup_fn)(const char *name, void *arg);
/* Receives one complete message per rejected value. */
typedef void (*ss_config_report_fn)(const char *msg, void *arg);

/*
 * Parses value for opt into cfg. Returns 0, or -EINVAL/-ERANGE with a
 * message in err (cfg untouched).
 */
int ss_option_parse(const struct ss_option *opt, const char *value, struct ss_config *cfg,
		    char *err, size_t errlen);

/* Writes the current value of opt in cfg as text. */
void ss_option_format(const struct ss_option *opt, const struct ss_config *cfg, char *buf,
		      size_t len);

/*
 * Fills cfg with defaults, then each option set through lookup. A bad value
 * is reported and leaves the default. Returns the number of bad values.
 */
int ss_config_load(struct ss_config *cfg, ss_config_lookup_fn lookup, void *lookup_arg,
		   ss_config_report_fn report, void *report_arg);

/* lookup function reading the process environment (secure_getenv). */
const char *ss_config_getenv(const char *name, void *arg);

#endif
