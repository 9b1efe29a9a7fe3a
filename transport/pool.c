#include "transport/pool.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "transport/log.h"

struct ss_pool_chunk {
	struct ss_pool_chunk *next;
	struct ibv_mr *mr;
	uint8_t *mem;
	uint32_t n_blks, blk_size; /* its shape, for a cache */
	struct ss_blk blks[];
};

/* The registered length of a chunk of n blocks of blk_size bytes (whole pages). */
static size_t pool_chunk_len(uint32_t n, uint32_t blk_size)
{
	return ((size_t)n * blk_size + 4095) & ~(size_t)4095;
}

void ss_pool_cache_init(struct ss_pool_cache *c, uint32_t max)
{
	memset(c, 0, sizeof(*c));
	pthread_mutex_init(&c->lock, NULL);
	c->max = max;
}

uint32_t ss_pool_cache_count(struct ss_pool_cache *c)
{
	uint32_t n;

	pthread_mutex_lock(&c->lock);
	n = c->n;
	pthread_mutex_unlock(&c->lock);
	return n;
}

/* A cached chunk of n blocks of blk_size bytes, or NULL. */
static struct ss_pool_chunk *pool_cache_take(struct ss_pool_cache *c, uint32_t n, uint32_t blk_size)
{
	struct ss_pool_chunk **pp, *ch = NULL;

	pthread_mutex_lock(&c->lock);
	for (pp = &c->chunks; *pp; pp = &(*pp)->next)
		if ((*pp)->n_blks == n && (*pp)->blk_size == blk_size) {
			ch = *pp;
			*pp = ch->next;
			c->n--;
			break;
		}
	pthread_mutex_unlock(&c->lock);
	return ch;
}

/* Keeps ch in c if there is room. */
static bool pool_cache_keep(struct ss_pool_cache *c, struct ss_pool_chunk *ch)
{
	bool kept;

	pthread_mutex_lock(&c->lock);
	kept = c->n < c->max;
	if (kept) {
		ch->next = c->chunks;
		c->chunks = ch;
		c->n++;
	}
	pthread_mutex_unlock(&c->lock);
	return kept;
}

int ss_pool_init(struct ss_pool *p, struct ibv_pd *pd, uint32_t blk_size, uint32_t chunk_blks,
		 uint32_t max_blks, int first_chunk)
{
	memset(p, 0, sizeof(*p));
	pthread_mutex_init(&p->lock, NULL);
	p->pd = pd;
	p->blk_size = blk_size;
	p->chunk_blks = chunk_blks ? chunk_blks : 1;
	p->max_blks = max_blks;
	if (first_chunk) {
		int ret = ss_pool_grow(p, p->chunk_blks);

		if (ret < 0)
			return ret;
	}
	return 0;
}

void ss_pool_set_cache(struct ss_pool *p, struct ss_pool_cache *cache)
{
	p->cache = cache;
}

/* A new registered chunk of n blocks of p's size, or NULL with *err set. */
static struct ss_pool_chunk *pool_chunk_make(struct ss_pool *p, uint32_t n, int *err)
{
	size_t len = pool_chunk_len(n, p->blk_size);
	struct ss_pool_chunk *ch = calloc(1, sizeof(*ch) + n * sizeof(struct ss_blk));

	*err = ENOMEM;
	if (!ch)
		return NULL;
	ch->mem = aligned_alloc(4096, len);
	if (!ch->mem) {
		free(ch);
		return NULL;
	}
	/* Local write only: peers reach this memory through SENDs alone. */
	ch->mr = ibv_reg_mr(p->pd, ch->mem, len, IBV_ACCESS_LOCAL_WRITE);
	if (!ch->mr) {
		*err = errno ? errno : ENOMEM;
		ss_log_error("ibv_reg_mr(%zu bytes): %s", len, strerror(*err));
		free(ch->mem);
		free(ch);
		return NULL;
	}
	ch->n_blks = n;
	ch->blk_size = p->blk_size;
	return ch;
}

/* Called with the lock held. */
static int grow_locked(struct ss_pool *p, uint32_t n)
{
	struct ss_pool_chunk *ch = NULL;
	int err;

	if (n > p->max_blks - ss_pool_made(p))
		n = p->max_blks - ss_pool_made(p);
	if (n == 0)
		return 0;
	if (p->cache)
		ch = pool_cache_take(p->cache, n, p->blk_size);
	if (!ch && !(ch = pool_chunk_make(p, n, &err)))
		return -err;
	for (uint32_t i = 0; i < n; i++) {
		ch->blks[i].addr = ch->mem + (size_t)i * p->blk_size;
		ch->blks[i].lkey = ch->mr->lkey;
		ch->blks[i].next = p->free;
		p->free = &ch->blks[i];
	}
	ch->next = p->chunks;
	p->chunks = ch;
	atomic_fetch_add_explicit(&p->n_blks, n, memory_order_relaxed);
	p->n_free += n;
	p->reg_bytes += pool_chunk_len(n, p->blk_size);
	return (int)n;
}

int ss_pool_grow(struct ss_pool *p, uint32_t n)
{
	int ret;

	pthread_mutex_lock(&p->lock);
	ret = grow_locked(p, n);
	pthread_mutex_unlock(&p->lock);
	return ret;
}

struct ss_blk *ss_pool_get(struct ss_pool *p, int grow)
{
	struct ss_blk *b;

	pthread_mutex_lock(&p->lock);
	if (!p->free && grow)
		grow_locked(p, p->chunk_blks);
	b = p->free;
	if (b) {
		p->free = b->next;
		p->n_free--;
	}
	pthread_mutex_unlock(&p->lock);
	return b;
}

uint32_t ss_pool_get_many(struct ss_pool *p, struct ss_blk **head_p, uint32_t max)
{
	struct ss_blk *head = NULL;
	uint32_t n = 0;

	pthread_mutex_lock(&p->lock);
	while (n < max && p->free) {
		struct ss_blk *b = p->free;

		p->free = b->next;
		b->next = head;
		head = b;
		n++;
	}
	p->n_free -= n;
	pthread_mutex_unlock(&p->lock);
	*head_p = head;
	return n;
}

void ss_pool_put(struct ss_pool *p, struct ss_blk *b)
{
	pthread_mutex_lock(&p->lock);
	b->next = p->free;
	p->free = b;
	p->n_free++;
	pthread_mutex_unlock(&p->lock);
}

int ss_pool_can_get(struct ss_pool *p)
{
	int ok;

	pthread_mutex_lock(&p->lock);
	ok = p->free != NULL || ss_pool_made(p) < p->max_blks;
	pthread_mutex_unlock(&p->lock);
	return ok;
}

void ss_pool_fini(struct ss_pool *p)
{
	struct ss_pool_chunk *ch, *next;

	for (ch = p->chunks; ch; ch = next) {
		next = ch->next;
		if (p->cache && pool_cache_keep(p->cache, ch))
			continue;
		ibv_dereg_mr(ch->mr);
		free(ch->mem);
		free(ch);
	}
	p->chunks = NULL;
	p->free = NULL;
	atomic_store_explicit(&p->n_blks, 0, memory_order_relaxed);
	p->n_free = 0;
	if (p->pd)
		pthread_mutex_destroy(&p->lock);
}
