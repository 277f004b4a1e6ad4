/*
 * pipeline_internal.h — private to engine/: pipeline.c: a stage's geometry, the SEND and
 * RECV actions' sends and receives, the tied embedding's traffic.
 */
#ifndef TS_ENGINE_PIPELINE_INTERNAL_H
#define TS_ENGINE_PIPELINE_INTERNAL_H

#include "engine/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the engine's stage geometry for stage s of opts->pipeline_stages
 * (units from the split; the step's schedule, a one-stage 1F1B without
 * pipelining; slots from the schedule). Errors: the split's. */
ts_status ts_engine_set_stage(ts_engine *e, int s);

/* A blocking receive, a non-blocking send (its posting traced) on the
 * pipeline group, count elements of the compute dtype; and the wait for a
 * pending send (*req NULL afterwards; NULL: nothing to wait for). */
ts_status ts_engine_recv(ts_engine *e, void *buf, size_t count, int peer, int tag);
ts_status ts_engine_isend(ts_engine *e, const void *buf, size_t count, int peer, int tag,
                          ts_comm_request **req);
ts_status ts_engine_wait_req(ts_comm_request **req);
/* Waits for every pending send (activations, gradients, the tied
 * gradient): nothing left reading a buffer. Errors are ignored (the
 * engine is stopping or failing anyway) but for the first, returned. */
ts_status ts_engine_wait_sends(ts_engine *e);

/* Stage 0 of a pipeline, before the lender's backward of the step's last
 * micro-batch: receives the tied head's gradient from the last stage into
 * a new transient (P), e->pipe.tied_grads. */
ts_status ts_engine_recv_tied_grads(ts_engine *e);
/* The last stage, after the step's last backward: sends e->pipe.tied_grads. */
ts_status ts_engine_send_tied_grads(ts_engine *e);
/* After an applied optimizer step: stage 0 sends the lender's updated
 * parameters (as its policy holds them) to the last stage's replica. */
ts_status ts_engine_sync_replica(ts_engine *e);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_PIPELINE_INTERNAL_H */
