/*
 * sum.h — comm's rank-order reductions (private to comm; sum.c).
 *
 * Every reduction in comm adds the ranks' contributions in group rank order,
 * element by element (comm.h "Determinism"); these are the only places that
 * add, so every transport gives the same bits.
 */
#ifndef TS_COMM_SUM_H
#define TS_COMM_SUM_H

#include <stddef.h>

#include "base/base.h"
#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst (count,) in dt = ((src[0] + src[1]) + ... + src[n-1]) [+ dst if
 * accumulate], element by element in fp32 (half dtypes widened), rounded
 * once to dt (nearest even). dst may equal one of src. Runs on OpenMP
 * threads from 2^16 elements, which changes no element's order. */
void ts_comm_sum_rank_order(void *dst, const void *const *src, int n, size_t count, ts_dtype dt,
                            int accumulate);

/* buf[i] = all[0*count + i] op all[1*count + i] op ... op all[(n-1)*count + i]
 * for i < count, in rank order; NaN propagates through max and min.
 * all: (n, count) host doubles, not overlapping buf (count,). */
void ts_comm_reduce_f64_rank_order(double *buf, const double *all, size_t n, size_t count,
                                   ts_comm_op op);

#ifdef __cplusplus
}
#endif

#endif /* TS_COMM_SUM_H */
