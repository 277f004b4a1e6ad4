/*
 * nccl.h — the NCCL transport of comm (DESIGN.md "GPU", "Communication
 * overlap"): a group whose data lives on GPUs, one GPU per rank, moved by
 * NCCL on a communication stream that is ordered against the caller's
 * compute stream by CUDA events, never by a host wait.
 *
 * The contract of comm.h holds unchanged, bits included: NCCL only moves
 * bytes (every call is a byte transfer: all-gather, broadcast, send and
 * receive), and every sum is the rank-order fp32 sum of comm/sum.h, made on
 * the device by the lender's sum_ranks (kernels ts_k_sum_ranks) after the
 * reduce-scatter's pieces arrived by a grouped all-to-all of sends and
 * receives. NCCL's own reduce-scatter is not used: its ring adds the ranks
 * in an order that depends on the chunk's position in the ring, and sums
 * bf16/fp16 with a rounding to the storage dtype per addition, so its bits
 * would depend on N and on the chunk and differ from MPI's and from the
 * staged transport's. The all-to-all sends the same (N-1) * count elements
 * per rank as a ring reduce-scatter does, and the scratch comm.h already
 * asks for holds the N-1 pieces received.
 *
 * Built only into binaries that link NCCL (//comm:nccl); comm's front
 * itself stays free of CUDA.
 */
#ifndef TS_COMM_NCCL_H
#define TS_COMM_NCCL_H

#include <stddef.h>

#include "base/base.h"
#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the NCCL transport needs from the owner of a group's GPU memory,
 * beside the ts_comm_memory it lends (whose copy and add serve one-rank
 * groups). All borrowed; they must outlive the group's calls. */
typedef struct ts_comm_nccl_streams {
  int device;        /* CUDA device ordinal of this rank's GPU (cudaSetDevice) */
  void *step_stream; /* cudaStream_t the caller computes on: a call starts after the work
                        queued there before it, and a wait makes later work there wait
                        for the call */
  void *comm_stream; /* cudaStream_t, another stream of the same GPU: NCCL's transfers and
                        the sums run there, in submission order */
  void *user;        /* passed back to sum_ranks */
  /* out (count,) = parts[0] + ... + parts[n-1] [+ out if accumulate] in dt,
   * element by element in rank order in fp32, rounded once (kernels.h
   * ts_k_sum_ranks), queued on comm_stream; parts is a host array of n
   * device pointers, out may equal one of them. */
  ts_status (*sum_ranks)(void *user, void *out, const void *const *parts, int n, size_t count,
                         ts_dtype dt, int accumulate);
} ts_comm_nccl_streams;

/* Puts group c on the NCCL transport: from now on its data buffers live on
 * the GPU streams->device (lent as mem, as ts_comm_set_memory does) and its
 * collectives, sends and receives run as NCCL calls on
 * streams->comm_stream. Collective over c: every rank calls it, each with
 * its own GPU (NCCL refuses two ranks on one GPU: use the staged transport
 * there). A one-rank group gets a one-rank NCCL communicator (the same path
 * as N ranks, the transfers being local copies); a plan group (comm.h
 * ts_comm_plan) keeps mem and moves nothing, streams unused but sum_ranks.
 *
 * Ordering: a call queues, on the communication stream, a wait for the
 * work queued on the step stream before it, then its transfers and sums,
 * and returns; a blocking call also makes the step stream wait for it. A
 * started call (ts_comm_i*) is ordered by ts_comm_wait, which makes the
 * step stream wait for it and returns at once: the host never waits for
 * the GPU here (ts_comm_test asks the event without waiting). So the
 * caller's buffers may be read or written by work queued on the step
 * stream after the wait, and by the host only after synchronising that
 * stream. Sends and receives between two ranks match in the order they
 * were started (NCCL has no tags, which are ignored), and a send or a
 * receive blocks the communication stream until its peer's matching call
 * runs: two ranks that each start a send (or each a receive) to the other
 * before the opposite call deadlock (pipelines use the staged transport). barrier and
 * all_reduce_f64 (host memory) go to the group's MPI transport as they are.
 *
 * Set-up is collective even when it fails: every rank takes part whatever
 * its own CUDA set-up gave, and on any rank's failure every rank returns
 * an error and keeps no communicator. Undo with ts_comm_set_memory(c,
 * NULL), which waits for the communication stream and destroys the NCCL
 * communicator; that, and ts_comm_free of the group, are collective too
 * (ncclCommFinalize): every rank of the group must call them. Call with no request
 * outstanding and before any ts_comm_set_thread (a group on a thread is
 * refused; this transport needs none). Errors: TS_ERR_INVALID_ARGUMENT
 * (NULL or missing operations), TS_ERR_INVALID_USAGE (a thread, memory of
 * another owner), TS_ERR_UNSUPPORTED (a group on another transport), TS_ERR_CUDA,
 * TS_ERR_NCCL (NCCL's message, e.g. two ranks on one GPU), TS_ERR_MPI. */
ts_status ts_comm_set_nccl(ts_comm *c, const ts_comm_memory *mem,
                           const ts_comm_nccl_streams *streams);

/* NCCL's version as "2.28.9" (the library loaded, ncclGetVersion). */
const char *ts_comm_nccl_version(void);

#ifdef __cplusplus
}
#endif

#endif /* TS_COMM_NCCL_H */
