/*
 * tiles.h — the output tile of the CPU backend's matrix products
 * (sgemm.c, dnnl_matmul.cc): each product's output is cut into tiles of
 * TS_CPU_TILE_M rows by TS_CPU_TILE_N columns (edges smaller), each
 * computed whole (the full reduction) by one thread, so the bits depend on
 * the shape alone, never on the thread count. Private to the CPU backend.
 */
#ifndef TS_KERNELS_CPU_TILES_H
#define TS_KERNELS_CPU_TILES_H

enum { TS_CPU_TILE_M = 256, TS_CPU_TILE_N = 256 };

#endif /* TS_KERNELS_CPU_TILES_H */
