/*
 * A receive block changes hands through the device: posted by one thread
 * (ibv_post_recv, ibv_post_srq_recv), completed to whichever thread polls
 * the CQ. The device orders the two, but ThreadSanitizer cannot see it; in
 * a TSan build these tell it (a release at the post, an acquire at the
 * completion), and elsewhere they are nothing.
 */
#ifndef SS_TRANSPORT_HANDOFF_H
#define SS_TRANSPORT_HANDOFF_H

#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define ss_handoff_post(blk)     __tsan_release(blk)
#define ss_handoff_complete(blk) __tsan_acquire(blk)
#else
#define ss_handoff_post(blk)     ((void)(blk))
#define ss_handoff_complete(blk) ((void)(blk))
#endif

#endif
