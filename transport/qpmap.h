/*
 * QP number -> connection: open addressing with linear probing and
 * backward-shift delete (no tombstones, so lookups never slow down with
 * churn). Pure: no locking (the device's poll lock guards it). QP number 0
 * marks a free slot; it is never an RC QP's number.
 */
#ifndef SS_TRANSPORT_QPMAP_H
#define SS_TRANSPORT_QPMAP_H

#include <stdint.h>

struct ss_qpmap {
	uint32_t *qpn;
	void **val;
	uint32_t cap, n; /* cap: a power of two, or 0 before the first put */
};

/* Maps qpn (not 0) to val, replacing any; grows at half full. Returns 0 or -ENOMEM. */
int ss_qpmap_put(struct ss_qpmap *m, uint32_t qpn, void *val);

/* The value of qpn, or NULL. */
void *ss_qpmap_find(const struct ss_qpmap *m, uint32_t qpn);

/* Removes qpn (nothing happens when it is absent). */
void ss_qpmap_del(struct ss_qpmap *m, uint32_t qpn);

/* Frees the table. */
void ss_qpmap_fini(struct ss_qpmap *m);

#endif
