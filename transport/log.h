/* Logging for every layer: to stderr, and only when stderr is not a socket. */
#ifndef SS_TRANSPORT_LOG_H
#define SS_TRANSPORT_LOG_H

enum ss_log_level {
	SS_LOG_NONE,
	SS_LOG_ERROR,
	SS_LOG_WARN,
	SS_LOG_INFO,
	SS_LOG_DEBUG,
};

/* The current level; the shim sets it from SRQSHIM_LOG_LEVEL at load. */
extern enum ss_log_level ss_log_level;

/* Writes one line "srqshim[pid]: LEVEL: message" with a raw write(2) to fd 2. */
void ss_log_write(enum ss_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define ss_log_at(lvl, ...)                                                                        \
	do {                                                                                       \
		if ((lvl) <= ss_log_level)                                                         \
			ss_log_write((lvl), __VA_ARGS__);                                          \
	} while (0)

#define ss_log_error(...) ss_log_at(SS_LOG_ERROR, __VA_ARGS__)
#define ss_log_warn(...)  ss_log_at(SS_LOG_WARN, __VA_ARGS__)
#define ss_log_info(...)  ss_log_at(SS_LOG_INFO, __VA_ARGS__)
/* Data-path debug messages compile out unless built with -DSS_DEBUG_LOG. */
#ifdef SS_DEBUG_LOG
#define ss_log_debug(...) ss_log_at(SS_LOG_DEBUG, __VA_ARGS__)
#else
#define ss_log_debug(...)                                                                          \
	do {                                                                                       \
		if (0)                                                                             \
			ss_log_write(SS_LOG_DEBUG, __VA_ARGS__);                                   \
	} while (0)
#endif

#endif
