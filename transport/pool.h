/*
 * Pools of registered blocks (local write only), grown a chunk at a time
 * up to a bound. The receive pool of an SRQ, the private receive buffers of
 * a connection and the send blocks of a device all come from here. Thread
 * safe: a lock guards the free list, and only the pool's cache's lock (a
 * leaf) is taken under it.
 */
#ifndef SS_TRANSPORT_POOL_H
#define SS_TRANSPORT_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct ibv_pd;
struct ibv_mr;

struct ss_blk {
	struct ss_blk *next; /* free list */
	uint8_t *addr;
	uint32_t lkey;
};

struct ss_pool_chunk;

/*
 * Chunks kept from finished pools for new pools of the same shape: their
 * memory stays registered, so a new pool skips allocating, zeroing and
 * registering it. At most max are kept. The private receive pools of one
 * device's connections share one (its chunks are only ever reused once the
 * QP that had them posted is destroyed and its CQs polled dry). Its lock
 * is a leaf.
 */
struct ss_pool_cache {
	pthread_mutex_t lock;
	struct ss_pool_chunk *chunks;
	uint32_t n, max;
};

/* Prepares an empty cache of at most max chunks. */
void ss_pool_cache_init(struct ss_pool_cache *c, uint32_t max);

/* The chunks kept now. */
uint32_t ss_pool_cache_count(struct ss_pool_cache *c);

struct ss_pool {
	pthread_mutex_t lock;
	struct ibv_pd *pd;
	uint32_t blk_size, chunk_blks, max_blks;
	atomic_uint n_blks; /* blocks made so far (grown under lock, read anywhere) */
	uint32_t n_free;    /* on the free list */
	size_t reg_bytes;   /* registered memory */
	struct ss_blk *free;
	struct ss_pool_chunk *chunks;
	struct ss_pool_cache *cache; /* where chunks come from and go to, if any */
};

/*
 * Prepares an empty pool of blocks of blk_size bytes, made chunk_blks at a
 * time, never more than max_blks. Makes the first chunk when first_chunk is
 * set. Returns 0 or -errno.
 */
int ss_pool_init(struct ss_pool *p, struct ibv_pd *pd, uint32_t blk_size, uint32_t chunk_blks,
		 uint32_t max_blks, int first_chunk);

/*
 * Makes p take its chunks from cache when one of the right shape is there,
 * and give them back to it at ss_pool_fini; before any chunk is made.
 */
void ss_pool_set_cache(struct ss_pool *p, struct ss_pool_cache *cache);

/* Adds up to n blocks (bounded by max_blks) to the free list. Returns the count added or -errno. */
int ss_pool_grow(struct ss_pool *p, uint32_t n);

/* Takes a free block, growing by a chunk when none is free (grow set). NULL: none. */
struct ss_blk *ss_pool_get(struct ss_pool *p, int grow);

/* Takes up to max free blocks without growing, chained through next. Returns the count. */
uint32_t ss_pool_get_many(struct ss_pool *p, struct ss_blk **head_p, uint32_t max);

/* Gives a block back. */
void ss_pool_put(struct ss_pool *p, struct ss_blk *b);

/* Blocks made so far (any thread, no lock). */
static inline uint32_t ss_pool_made(struct ss_pool *p)
{
	return atomic_load_explicit(&p->n_blks, memory_order_relaxed);
}

/* True when a block could be had now (free, or room to grow). */
int ss_pool_can_get(struct ss_pool *p);

/*
 * Deregisters and frees everything, or gives its chunks to its cache while
 * the cache has room; no block may be in use (nor posted to a live queue).
 * Accepts a zeroed pool.
 */
void ss_pool_fini(struct ss_pool *p);

#endif
