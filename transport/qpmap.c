#include "transport/qpmap.h"

#include <errno.h>
#include <stdlib.h>

static uint32_t qpmap_home(const struct ss_qpmap *m, uint32_t qpn)
{
	return (qpn * 2654435761u) & (m->cap - 1);
}

/* Inserts into a table with room; n counts new keys only. */
static void qpmap_insert(struct ss_qpmap *m, uint32_t qpn, void *val)
{
	uint32_t i = qpmap_home(m, qpn);

	while (m->qpn[i] != 0 && m->qpn[i] != qpn)
		i = (i + 1) & (m->cap - 1);
	if (m->qpn[i] == 0)
		m->n++;
	m->qpn[i] = qpn;
	m->val[i] = val;
}

static int qpmap_grow(struct ss_qpmap *m)
{
	struct ss_qpmap old = *m;
	uint32_t cap = old.cap ? old.cap * 2 : 64;

	m->qpn = calloc(cap, sizeof(*m->qpn));
	m->val = calloc(cap, sizeof(*m->val));
	if (!m->qpn || !m->val) {
		free(m->qpn);
		free(m->val);
		*m = old;
		return -ENOMEM;
	}
	m->cap = cap;
	m->n = 0;
	for (uint32_t i = 0; i < old.cap; i++)
		if (old.qpn[i])
			qpmap_insert(m, old.qpn[i], old.val[i]);
	free(old.qpn);
	free(old.val);
	return 0;
}

int ss_qpmap_put(struct ss_qpmap *m, uint32_t qpn, void *val)
{
	if (qpn == 0)
		return -EINVAL;
	if ((m->n + 1) * 2 > m->cap && qpmap_grow(m) != 0)
		return -ENOMEM;
	qpmap_insert(m, qpn, val);
	return 0;
}

void *ss_qpmap_find(const struct ss_qpmap *m, uint32_t qpn)
{
	if (!m->cap || qpn == 0)
		return NULL;
	for (uint32_t i = qpmap_home(m, qpn);; i = (i + 1) & (m->cap - 1)) {
		if (m->qpn[i] == qpn)
			return m->val[i];
		if (m->qpn[i] == 0)
			return NULL;
	}
}

void ss_qpmap_del(struct ss_qpmap *m, uint32_t qpn)
{
	uint32_t mask = m->cap - 1, i, j;

	if (!m->cap || qpn == 0)
		return;
	for (i = qpmap_home(m, qpn); m->qpn[i] != qpn; i = (i + 1) & mask)
		if (m->qpn[i] == 0)
			return;
	m->qpn[i] = 0;
	m->val[i] = NULL;
	m->n--;
	for (j = (i + 1) & mask; m->qpn[j]; j = (j + 1) & mask) {
		uint32_t home = qpmap_home(m, m->qpn[j]);

		/* j moves into the hole at i unless its home lies cyclically in (i, j]. */
		if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
			m->qpn[i] = m->qpn[j];
			m->val[i] = m->val[j];
			m->qpn[j] = 0;
			m->val[j] = NULL;
			i = j;
		}
	}
}

void ss_qpmap_fini(struct ss_qpmap *m)
{
	free(m->qpn);
	free(m->val);
	m->qpn = NULL;
	m->val = NULL;
	m->cap = m->n = 0;
}
