#ifndef ZEROD_CLIENT_C_API_ZEROD_C_H_
#define ZEROD_CLIENT_C_API_ZEROD_C_H_

/* The C API of a zerod trainer: a TrainerSession and its ZeroEngine behind plain C functions, in
 * one shared library (libzerod_c.so) that any Python loads with ctypes. A C ABI rather than a
 * compiled Python module because one build then serves every Python and torch version: Debian's
 * Python 3.11 + torch 1.13 here, Python 3.12 + torch 2.x on a GPU machine.
 *
 * Every function returns 0 on success, else an absl/gRPC status code (3 INVALID_ARGUMENT, 9
 * FAILED_PRECONDITION, 14 UNAVAILABLE, ...), and zerod_last_error() says what went wrong in this
 * thread's last failed call. Options and reports travel as JSON text (zerod_c.cc documents the
 * fields); tensors as raw pointers to memory of the session's device (host memory on "cpu", GPU
 * memory on "cuda:N"). A session is used from one thread (the trainer's), as the engine is.
 */

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zerod_session zerod_session;

/* The message of this thread's last failed call ("" when none). Valid until the next call. */
const char* zerod_last_error(void);
/* Frees a string a zerod_* function returned. */
void zerod_free(char* text);

/* Joins the job and connects the communicators (TrainerSession::Start). `options_json`:
 * {"endpoint", "job", "rank", "world_size", "device", "budget_bytes", "join_timeout_s",
 *  "collective_timeout_s", "heartbeat_ms", "gather_communicator",
 *  "layout": [{"name", "shape", "dtype", "unit"}],
 *  "plan": {"stage", "param_dtype", "grad_dtype", "optimizer", "reduce_bucket_bytes",
 *           "bucket_buffers", "gather_unit_bytes", "prefetch_depth", "max_live_units",
 *           "partition_alignment_numel"}}
 * Absent fields take TrainerSession's defaults (the ZEROD_* environment). */
int zerod_session_start(const char* options_json, zerod_session** out);
/* Leaves the job (when not left yet) and frees everything. NULL is ignored. */
void zerod_session_destroy(zerod_session* session);
int zerod_session_leave(zerod_session* session);

/* The job as this rank sees it, as JSON: rank, world_size, generation, job, device, stage,
 * the tensors' units, the plan's memory per category (*out: free with zerod_free). */
int zerod_session_describe(zerod_session* session, char** out);

/* Creates the engine: {"lr", "beta1", "beta2", "eps", "weight_decay", "adamw",
 * "max_grad_norm", "accumulation_steps", "threads", "loss_scale": {"enabled", "initial_scale",
 * "growth_interval", "hysteresis"}}. Out-of-range values are INVALID_ARGUMENT naming the field. */
int zerod_engine_create(zerod_session* session, const char* options_json);

/* Initial parameters from rank `root` (a collective): `tensors[t]` points to tensor t's values
 * as fp32 in host memory on `root`; other ranks may pass NULL. */
int zerod_engine_init_from(zerod_session* session, int64_t root, const float* const* tensors);

/* Rank `root`'s `count` floats (host memory) into every rank's `values` (a collective). */
int zerod_engine_broadcast(zerod_session* session, float* values, int64_t count, int64_t root);

int zerod_engine_gather(zerod_session* session, int64_t unit);
int zerod_engine_release(zerod_session* session, int64_t unit);
/* Where tensor t's parameters are now (at stage 3, only while its unit is gathered). */
int zerod_engine_param(zerod_session* session, int64_t tensor, void** data);
/* Adds tensor t's fp32 gradient (device memory, already multiplied by the loss scale). */
int zerod_engine_accumulate_grad(zerod_session* session, int64_t tensor, const float* grad);
/* One optimizer step; lr < 0 keeps the configured one. */
int zerod_engine_step(zerod_session* session, double lr, int* applied, double* grad_norm,
                      double* loss_scale);
int zerod_engine_loss_scale(zerod_session* session, double* scale);
/* The mean of `value` over the ranks (a collective). */
int zerod_engine_average(zerod_session* session, double value, double* mean);
/* The full fp32 parameters in model order into `out` (host memory, `count` floats; a collective).
 */
int zerod_engine_full_parameters(zerod_session* session, float* out, int64_t count);
/* What the engine holds and has sent, as JSON: step, allocated_bytes, memory per category,
 * bytes_sent per collective (*out: free with zerod_free). */
int zerod_engine_stats(zerod_session* session, char** out);
/* Waits for the engine's device work (a no-op in host memory). */
int zerod_engine_synchronize(zerod_session* session);

#ifdef __cplusplus
}
#endif

#endif /* ZEROD_CLIENT_C_API_ZEROD_C_H_ */
