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
 * {"endpoint", "job", "job_token", "peer_address" (Gloo's address of this rank), "rank",
 *  "world_size", "device", "budget_bytes", "join_timeout_s",
 *  "collective_timeout_s", "heartbeat_ms", "gather_communicator",
 *  "layout": [{"name", "shape", "dtype", "unit"}],
 *  "plan": {"stage", "param_dtype", "grad_dtype", "optimizer", "reduce_bucket_bytes",
 *           "bucket_buffers", "gather_unit_bytes", "prefetch_depth", "max_live_units",
 *           "partition_alignment_numel"},
 *  "agreed": {name: text}}  (settings every rank must give alike, checked at join)
 * Absent fields take TrainerSession's defaults (the ZEROD_* environment). */
int zerod_session_start(const char* options_json, zerod_session** out);
/* Leaves the job (when not left yet) and frees everything. NULL is ignored. */
void zerod_session_destroy(zerod_session* session);
int zerod_session_leave(zerod_session* session);

/* The job as this rank sees it, as JSON: rank, world_size, generation, job, peer_address (the
 * address this rank's peers reach it by), device, stage,
 * the tensors' units, the plan's memory per category (*out: free with zerod_free). */
int zerod_session_describe(zerod_session* session, char** out);

/* Creates the engine: {"lr", "beta1", "beta2", "eps", "weight_decay", "adamw",
 * "max_grad_norm", "accumulation_steps", "average_accumulation" (true: the mean over the
 * micro-steps; false: their sum), "threads", "loss_scale": {"enabled", "initial_scale",
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
/* Adds tensor t's fp32 gradient (device memory, already multiplied by the loss scale). NULL:
 * this rank has no gradient for t in this micro-step (zeros in the reduction; a tensor no rank
 * gives one before the next step is not stepped). */
int zerod_engine_accumulate_grad(zerod_session* session, int64_t tensor, const float* grad);
/* One optimizer step; lr < 0 keeps the configured one. */
int zerod_engine_step(zerod_session* session, double lr, int* applied, double* grad_norm,
                      double* loss_scale);
int zerod_engine_loss_scale(zerod_session* session, double* scale);

/* The optimizer over parameter groups (zerod_c_optim.cc; ZeroEngine::Step(ParamGroups)).
 * One step: `configs` holds 6 doubles per group (lr, beta1, beta2, eps, weight_decay, and 1 for
 * decoupled weight decay (AdamW) or 0 (Adam)), `tensor_group` each tensor's group (or -1: not
 * optimized). Hyperparameters are read at every call, as torch reads param_groups. */
int zerod_engine_step_groups(zerod_session* session, const double* configs, int64_t group_count,
                             const int32_t* tensor_group, int64_t tensor_count, int* applied,
                             double* grad_norm, double* loss_scale);
/* torch's zero_grad: discards the gradients given since the last step; set_to_none != 0 also
 * forgets which tensors had one (ZeroEngine::ZeroGrad). */
int zerod_engine_zero_grad(zerod_session* session, int set_to_none);
/* This rank's optimizer state, as opt.state_dict() holds it: JSON {"runs": [[offset, numel],
 * ...] (model coordinates, the elements this rank holds), "numel" (their sum), "counters":
 * {"applied_steps", "steps_taken", "loss_scale", "clean_steps", "hysteresis_left",
 * "tensor_steps": [...]}} (*out: free with zerod_free). */
int zerod_engine_state_info(zerod_session* session, char** out);
/* The held elements of state tensor `which` (0 fp32 master, 1 Adam m, 2 Adam v), the runs of
 * zerod_engine_state_info end to end, to or from `count` floats of host memory. */
int zerod_engine_read_state(zerod_session* session, int which, float* out, int64_t count);
int zerod_engine_write_state(zerod_session* session, int which, const float* values, int64_t count);
/* After writing the state: the counters (as zerod_engine_state_info gives them) and the
 * parameters rebuilt from the master (a collective at stages 1-2: every rank calls it). */
int zerod_engine_finish_restore(zerod_session* session, const char* counters_json);
/* The mean of `value` over the ranks (a collective). */
int zerod_engine_average(zerod_session* session, double value, double* mean);
/* The full fp32 parameters in model order into `out` (host memory, `count` floats; a collective).
 */
int zerod_engine_full_parameters(zerod_session* session, float* out, int64_t count);
/* What the engine holds and has sent, as JSON: step, allocated_bytes, memory per category,
 * gather_overflows and peak_gather_buffers (stage 3: ZeroEngine::gather_overflows), pulls_gathers
 * and bytes_pulled (ZeroEngine::pulls_gathers),
 * bytes_sent per collective (*out: free with zerod_free). */
int zerod_engine_stats(zerod_session* session, char** out);
/* Waits for the engine's device work (a no-op in host memory). */
int zerod_engine_synchronize(zerod_session* session);

/* Saves a sharded checkpoint of the engine's state as `root`/step-<S> (a collective: every rank
 * calls it at the same step; runtime/checkpoint/save_protocol.h). It returns on every rank once
 * the checkpoint is complete, or with the same error everywhere. keep_last > 0 then removes all
 * but the newest keep_last complete checkpoints under `root` (0 keeps every one). `user`: text
 * kept in the manifest, rank 0's (NULL: none); `extra`: this rank's own `extra_len` bytes (NULL
 * with 0: none). record = 0 for an in-memory snapshot, which the coordinator does not list
 * (SaveOptions::record). *step_out: the step saved; *directory_out (NULL to skip it): the
 * checkpoint's directory, free with zerod_free. */
int zerod_engine_save(zerod_session* session, const char* root, int64_t keep_last, int record,
                      const char* user, const char* extra, int64_t extra_len, int64_t* step_out,
                      char** directory_out);

/* Loads `path`, a checkpoint directory or a root whose newest complete checkpoint is taken,
 * resharded to this job's world and stage (a collective). *step_out: the step loaded, or -1 when
 * `path` is a root holding no complete checkpoint (nothing is loaded, the outputs below are NULL
 * and 0). *user_out: the saver's user text; *extra_out: this rank's extra bytes (rank 0's when
 * the saving world had no such rank), *extra_len_out of them; *directory_out: the checkpoint
 * loaded. Each output but step_out may be NULL to skip it; what is returned is freed with
 * zerod_free. */
int zerod_engine_load(zerod_session* session, const char* path, int64_t* step_out, char** user_out,
                      char** extra_out, int64_t* extra_len_out, char** directory_out);
/* As zerod_engine_load, of the newest complete checkpoint among the in-memory `snapshots`
 * directory (zerorun's $ZEROD_SNAPSHOT_DIR; NULL or "": none; it wins a tie, and unrecorded
 * snapshots count there alone) and the durable `roots`, newline-separated (may be empty), rank 0
 * deciding for every rank with the coordinator's records: what a restarted trainer resumes from.
 * *step_out -1: none anywhere. */
int zerod_engine_resume(zerod_session* session, const char* snapshots, const char* roots,
                        int64_t* step_out, char** user_out, char** extra_out,
                        int64_t* extra_len_out, char** directory_out);

#ifdef __cplusplus
}
#endif

#endif /* ZEROD_CLIENT_C_API_ZEROD_C_H_ */
