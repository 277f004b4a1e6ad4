/*
 * family.h — private to models/: the pieces every family's unit code
 * shares (building a unit's tensor layout, carving saved and workspace
 * buffers, splitting the workspace between a unit and its kernels).
 */
#ifndef TS_MODELS_FAMILY_H
#define TS_MODELS_FAMILY_H

#include <stddef.h>

#include "models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets up u as a unit of role r, kind ops and block index layer (-1 for
 * other roles), borrowing nothing, with no tensors yet. */
void ts_family_start_unit(ts_unit *u, const ts_unit_ops *ops, ts_unit_role r, int layer);

/* Appends a tensor (rows x cols, ndim 1 or 2; cols = 1 for vectors) to u's
 * layout after the existing ones. Weight decay applies to ndim 2. init and
 * std say how it starts (std only for TS_INIT_NORMAL). Asserts the
 * TS_UNIT_MAX_TENSORS bound. */
void ts_family_add_tensor(ts_unit *u, const char *name, size_t rows, size_t cols, int ndim,
                          ts_init_kind init, double std);

/* Carves n elements of size es from *p, a cursor into a buffer starting at
 * base, and returns the region; regions start at 64-byte offsets from base
 * (the engine's buffers are 64-byte aligned, or 256 from cudaMalloc), as
 * vectorised GPU loads, cuBLASLt and cuDNN want. The layout does not
 * depend on base's address, so a NULL base gives the same sizes. */
void *ts_family_carve(void *base, char **p, size_t n, size_t es);

/* Rounds n up to a multiple of 64 (temporaries keep the kernels' share of
 * the workspace aligned). */
static inline size_t ts_family_round64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Pointer to tensor i of unit u inside a flat buffer of dtype dt. */
void *ts_family_tensor(const ts_unit *u, int i, const void *flat, ts_dtype dt);

/* Splits ctx's workspace: the first `temps` bytes for the unit, the rest
 * for the kernels (in *kctx). TS_ERR_OUT_OF_MEMORY ("FAMILY WHAT:
 * workspace has X bytes, needs Y") when ctx has fewer than `need`. */
ts_status ts_family_split_ws(const ts_kctx *ctx, size_t temps, size_t need, ts_kctx *kctx,
                             const char *family, const char *what);

#ifdef __cplusplus
}
#endif

#endif /* TS_MODELS_FAMILY_H */
