/*
 * What the check programs share to show their outcome through the status
 * tool rather than through log sentences: with CHECK_STATUS=PREFIX and
 * CHECK_CTL=TOOL set, status_snap(TAG) writes this process's
 * "srqshim-ctl status --json --pid PID" into PREFIX.TAG, for the e2e script
 * to read. Without them it does nothing (a run over kernel TCP).
 */
#pragma once

/* Takes the snapshot now, while the caller's connections are open. */
void status_snap(const char *tag);
