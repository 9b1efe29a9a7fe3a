/* libsrqshim.so: load-time set-up. Interposition builds on this. */
#include "shim/config.h"
#include "transport/log.h"

static struct ss_config ss_cfg;

static void report_bad_option(const char *msg, void *arg)
{
	(void)arg;
	ss_log_error("%s", msg);
}

/* Runs once at load: read the options (bad values are reported, defaults kept). */
__attribute__((constructor)) static void ss_shim_init(void)
{
	/* Errors in the log level itself must still be reported: log at the default first. */
	ss_log_level = SS_LOG_ERROR;
	ss_config_load(&ss_cfg, ss_config_getenv, NULL, report_bad_option, NULL);
	ss_log_level = (enum ss_log_level)ss_cfg.log_level;
}
