/* train_main.c — `tessera train`: flags → ts_train_config, progress on the
 * terminal, a summary at the end. Prints and exits; the library does not.
 * Under mpirun every rank runs this; rank 0 prints progress and the summary,
 * usage errors print once (on the lead rank), and an error in one rank
 * during training aborts the job so no rank waits in a collective. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "comm/comm.h"
#include "engine/checkpoint.h"
#include "engine/token_file.h"
#include "engine/trainer.h"
#include "kernels/kernels.h"
#include "tools/flags.h"
#include "tools/sample.h"
#include "tools/tools.h"

static const char *USAGE =
    "usage: tessera train --model CONFIG --data DIR [flags]\n"
    "  --micro-batch is per rank; --global-batch = ranks x micro-batch x grad-accum\n"
    "  (give two of --global-batch, --grad-accum and the rank count fixes the third).\n"
    "  --pipeline P: ranks = P stages x data-parallel ranks; each step's --grad-accum\n"
    "  micro-batches flow through the stages (the ranks count is then P x dp).\n"
    "  Several ranks: tessera launch -n N train ...\n"
    "  Exit status: 0 trained (or stopped by SIGINT after saving), 1 failed,\n"
    "  2 bad usage, 3 stopped: non-finite losses or gradients (--max-bad-steps, fp16 at\n"
    "  its minimum loss scale), 4 a peer did not answer within --comm-timeout (launch\n"
    "  --max-restarts restarts it), 5 preempted: stopped by SIGTERM or SIGUSR1 after\n"
    "  saving (resume with --resume auto; tools/slurm/train.sbatch requeues on it).\n";

typedef struct progress {
  int tty;          /* stdout is a terminal */
  size_t log_every; /* steps between permanent lines */
  int fp16;         /* a skipped step is an fp16 overflow (else non-finite values) */
} progress;

static void on_event(const ts_train_event *ev, void *user) {
  const progress *p = user;
  if (ev->is_eval) {
    printf("%sstep %5zu/%zu | val loss %.4f", p->tty ? "\r\033[K" : "", ev->step, ev->steps,
           ev->loss);
    if (ev->accuracy >= 0) printf(" | masked-token accuracy %.1f%%", 100 * ev->accuracy);
    printf("\n");
    fflush(stdout);
    return;
  }
  if (ev->skipped && p->fp16) { /* always a permanent line */
    printf("%sstep %5zu/%zu | loss %.4f | skipped: fp16 overflow in %s, loss scale %g -> %g\n",
           p->tty ? "\r\033[K" : "", ev->step, ev->steps, ev->loss, ev->overflow_tensor,
           (double)ev->loss_scale, (double)ev->next_loss_scale);
    fflush(stdout);
    return;
  }
  if (ev->skipped) {
    printf("%sstep %5zu/%zu | loss %.4f | skipped: non-finite values in %s, nothing applied\n",
           p->tty ? "\r\033[K" : "", ev->step, ev->steps, ev->loss, ev->overflow_tensor);
    fflush(stdout);
    return;
  }
  int permanent = ev->step == 1 || ev->step % p->log_every == 0 || ev->step == ev->steps;
  if (!permanent && !p->tty) return;
  printf("%sstep %5zu/%zu | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | %.2f GFLOP/s%s",
         p->tty ? "\r\033[K" : "", ev->step, ev->steps, ev->loss, ev->lr, ev->grad_norm,
         ev->tokens_per_s, ev->gflops, permanent ? "\n" : "");
  fflush(stdout);
}

/* Whether progress may redraw one line: stdout is a terminal. Under mpirun
 * a rank's stdout is a pseudo-terminal even when the job's output goes to a
 * file, so there TESSERA_TTY (set by tools/launch.sh from its own stdout)
 * decides, and without it the answer is no. */
static int stdout_is_terminal(void) {
  const char *t = getenv("TESSERA_TTY");
  if (t) return strcmp(t, "1") == 0;
  if (getenv("OMPI_COMM_WORLD_RANK") || getenv("PMIX_RANK")) return 0;
  return isatty(STDOUT_FILENO);
}

/* The unigram baselines `tessera prepare` wrote to DIR/meta.json: the
 * loss and the accuracy of always predicting the most frequent token, each
 * < 0 when absent. */
static void unigram_baselines(const char *dir, double *loss, double *accuracy) {
  char path[4096], *buf;
  *loss = *accuracy = -1;
  snprintf(path, sizeof path, "%s/meta.json", dir);
  if (ts_read_file(path, &buf, NULL) != TS_OK) return;
  cJSON *root = cJSON_Parse(buf);
  free(buf);
  const cJSON *l = cJSON_GetObjectItemCaseSensitive(root, "unigram_val_loss");
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "unigram_val_accuracy");
  if (cJSON_IsNumber(l)) *loss = l->valuedouble;
  if (cJSON_IsNumber(a)) *accuracy = a->valuedouble;
  cJSON_Delete(root);
}

/* --sample-every: what a sample during training needs (rank 0). */
typedef struct sampler {
  ts_text_tokenizer *tok;
  const char *prompt;
  char *own_prompt; /* the default prompt (the validation shard's first tokens), or NULL */
  size_t tokens;    /* --sample-tokens */
  size_t steps;     /* the run's last step: its sample is kept for the end */
  ts_device device;
  char *last;       /* the last step's sample, printed after the summary */
  size_t last_len;
} sampler;

/* ts_train_sample_fn: the prompt and what the model writes after it,
 * sampled at temperature 0.8 among the 40 likeliest (seed: the step). */
static ts_status sample_now(void *user, size_t step, const ts_model *m, ts_train_weights_fn read,
                            void *read_user) {
  sampler *s = user;
  ts_tool_sample_opts o = {.tokenizer = s->tok, .prompt = s->prompt, .max_new = s->tokens,
                           .temperature = 0.8f, .top_k = 40, .top_p = 1.0f, .seed = step,
                           .device = s->device, .dtype = TS_FP32};
  FILE *out = stdout;
  if (step == s->steps) {
    free(s->last);
    s->last = NULL;
    out = open_memstream(&s->last, &s->last_len);
    if (!out) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "sample: a buffer");
  } else {
    printf("sample at step %zu: ", step);
  }
  ts_status st = ts_tool_sample(m, read, read_user, &o, out);
  if (out != stdout) fclose(out);
  fflush(stdout);
  return st;
}

/* The default prompt: the text of DATA/val.bin's first 8 tokens. */
static ts_status default_prompt(sampler *s, const char *data) {
  char path[4200];
  snprintf(path, sizeof path, "%s/val.bin", data);
  ts_token_file *tf = NULL;
  TS_CHECK(ts_token_file_open(&tf, path, ts_text_tokenizer_vocab(s->tok)));
  int32_t ids[8];
  size_t n = ts_token_file_num_tokens(tf) < 8 ? ts_token_file_num_tokens(tf) : 8;
  ts_token_file_read(tf, 0, n, ids);
  ts_token_file_close(tf);
  s->own_prompt = ts_text_tokenizer_decode(s->tok, ids, n);
  if (!s->own_prompt || !s->own_prompt[0])
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: its first tokens are no text to prompt with; give --prompt TEXT",
                        path);
  s->prompt = s->own_prompt;
  return TS_OK;
}

/* Rank 0's closing lines: loss, speed, validation, communication, memory. */
static void print_summary(const ts_train_config *cfg, const ts_train_result *res) {
  if (res->resumed_from) printf("resumed from step %zu\n", res->resumed_from);
  if (res->notes[0]) {
    char notes[1536];
    ts_flags_terms(res->notes, notes, sizeof notes);
    printf("%s", notes);
  }
  printf("trained %s (%.2fM parameters) for %zu steps in %.1f s: loss %.4f -> %.4f, "
         "%.0f tok/s, %.2f GFLOP/s\n",
         cfg->model, (double)res->num_params / 1e6, cfg->steps - res->resumed_from, res->seconds, res->first_loss,
         res->final_loss, res->tokens_per_s, res->gflops);
  printf("matrix products: %s\n", ts_k_matmul_impl(cfg->engine.device, cfg->engine.dtype));
  if (res->op_wall_seconds > 0 && ts_k_op_timing()) { /* TESSERA_OP_TIMES=1 */
    double sum = 0;
    printf("op times, steps 2-%zu, rank 0's process:", cfg->steps);
    for (int k = 0; k < TS_K_OPS_KINDS; k++) {
      sum += res->op_seconds[k];
      printf(" %s %.3f s (%.0f%%),", ts_k_op_kind_name((ts_k_op_kind)k), res->op_seconds[k],
             100 * res->op_seconds[k] / res->op_wall_seconds);
    }
    double rest = res->op_wall_seconds > sum ? res->op_wall_seconds - sum : 0;
    printf(" outside the ops %.3f s (%.0f%%) of %.3f s\n", rest,
           100 * rest / res->op_wall_seconds, res->op_wall_seconds);
  }
  double uni, uni_acc;
  unigram_baselines(cfg->data_dir, &uni, &uni_acc);
  const char *what =
      res->final_val_accuracy >= 0 ? "masked-token validation loss" : "validation loss";
  if (uni > 0)
    printf("%s %.4f (unigram baseline %.4f)\n", what, res->final_val_loss, uni);
  else
    printf("%s %.4f\n", what, res->final_val_loss);
  if (res->final_val_accuracy >= 0) {
    printf("masked-token accuracy %.1f%%", 100 * res->final_val_accuracy);
    if (uni_acc >= 0)
      printf(" (unigram baseline %.1f%%: always the most frequent token)", 100 * uni_acc);
    printf("\n");
  }
  const ts_mem_account *l = &res->memory;
  const double MiB = 1024.0 * 1024.0;
  if (cfg->engine.dtype == TS_FP16)
    printf("fp16: %zu step%s skipped for overflow\n", res->skipped_steps,
           res->skipped_steps == 1 ? "" : "s");
  int P = cfg->engine.pipeline_stages;
  size_t m = res->global_batch / ((size_t)(res->world_size / P) * cfg->engine.micro_batch);
  if (P > 1) {
    int v = ts_engine_opts_chunks(&cfg->engine); /* virtual stages: ts_schedule_vstage */
    char chunks[48] = "";
    if (v > 1) snprintf(chunks, sizeof chunks, " (%d model chunks per stage)", v);
    printf("pipeline: %d stages x %d data-parallel ranks, %s%s, %zu micro-batches per step "
           "(bubble in theory %.1f%%); units per stage:",
           P, res->world_size / P, ts_schedule_kind_name(cfg->engine.schedule), chunks, m,
           100.0 * ts_schedule_bubble_theory(cfg->engine.schedule, P, v, (int)m));
    for (int s = 0; s < P; s++)
      for (int c = 0; c < v; c++)
        printf("%s%d..%d", c ? "," : " ",
               res->pipeline_split[ts_schedule_vstage(cfg->engine.schedule, P, s, c)],
               res->pipeline_split[ts_schedule_vstage(cfg->engine.schedule, P, s, c) + 1] - 1);
    printf("\n");
  }
  printf("ZeRO stage %d on %d rank%s, global batch %zu: %.3f MB sent per step per rank; rank 0 "
         "peak %.2f MiB (",
         cfg->engine.zero_stage, res->world_size, res->world_size > 1 ? "s" : "",
         res->global_batch, (double)res->comm_bytes_per_step / 1e6, (double)l->peak_total / MiB);
  for (int c = 0; c < TS_MEM_NUM_CATEGORIES; c++)
    printf("%s%s %.2f", c ? ", " : "", ts_mem_category_name((ts_mem_category)c),
           (double)l->peak[c] / MiB);
  printf(")\n");
  if (cfg->engine.offload_dir)
    printf("offload: rank 0 kept %.2f MiB of optimizer state in %s (master %.2f, optim %.2f)\n",
           (double)res->disk.peak_total / MiB, cfg->engine.offload_dir,
           (double)res->disk.peak[TS_MEM_MASTER] / MiB, (double)res->disk.peak[TS_MEM_OPTIM] / MiB);
  if (cfg->engine.offload_optimizer && !cfg->engine.offload_dir) {
    int cpu = cfg->engine.device == TS_DEVICE_CPU;
    printf("offload: rank 0 kept %.2f MiB of optimizer state in %s memory (master %.2f, optim "
           "%.2f), with %.2f MiB of update pieces",
           (double)(res->host.peak[TS_MEM_MASTER] + res->host.peak[TS_MEM_OPTIM]) / MiB,
           cpu ? "host (the cpu device's own)" : "page-locked host",
           (double)res->host.peak[TS_MEM_MASTER] / MiB, (double)res->host.peak[TS_MEM_OPTIM] / MiB,
           (double)res->host.peak[TS_MEM_STAGING] / MiB);
    if (cfg->engine.offload_params && !cpu)
      printf(", and %.2f MiB of parameter shards", (double)res->host.peak[TS_MEM_PARAMS] / MiB);
    else if (cfg->engine.offload_params)
      printf(", and its parameter shards");
    printf("\n");
  }
  int S = ts_engine_shard_size(&cfg->engine, res->world_size / P);
  if (S < res->world_size / P)
    printf(
        "hybrid sharding: ZeRO within %d groups of %d consecutive ranks, replicated across "
        "them\n",
        res->world_size / P / S, S);
  if (S < res->world_size / P || res->comm_remote_bytes_per_step > 0)
    printf("bytes per step per rank by link: %.3f MB within a node, %.3f MB across nodes\n",
           (double)(res->comm_bytes_per_step - res->comm_remote_bytes_per_step) / 1e6,
           (double)res->comm_remote_bytes_per_step / 1e6);
  if (res->slowest_rank >= 0)
    printf(
        "straggler: rank %d (host %s) computes %.3f s per step (median), %.2fx the median "
        "rank's %.3f s; the other ranks wait for it\n",
        res->slowest_rank, ts_comm_host(res->slowest_rank), res->slowest_compute_s,
        res->slowest_compute_s / res->ranks_compute_median_s, res->ranks_compute_median_s);
}

/* Rank 0's checkpoint line: the resumed one's load, the saves (their size
 * from the last one's index) and the time training waited for them (all of
 * a synchronous save; the staging copy of an asynchronous one). */
static void print_checkpoints(const ts_train_config *cfg, const ts_train_result *res) {
  const double GB = 1e9;
  if (res->load_seconds > 0)
    printf("checkpoint load: %.3f GB read by all ranks (checksums and slices) in %.3f s, "
           "%.3f GB/s\n",
           res->load_bytes / GB, res->load_seconds, res->load_bytes / GB / res->load_seconds);
  if (!res->saves) return;
  ts_checkpoint *ck = NULL;
  double bytes = 0;
  if (ts_checkpoint_open(&ck, res->saved, NULL) == TS_OK) {
    ts_checkpoint_info info;
    ts_checkpoint_get_info(ck, &info);
    bytes = (double)info.bytes;
  }
  ts_checkpoint_close(ck);
  double each = res->save_seconds / (double)res->saves;
  if (cfg->save_async)
    printf(
        "checkpoint save: %zu saved asynchronously, %.3f GB each; training blocked %.3f s "
        "per save (the copy to host staging %.3f s, waiting for the previous write %.3f s); "
        "the last write ended %.3f s after training; the last: %s\n",
        res->saves, bytes / GB, each,
        (res->save_seconds - res->save_wait_seconds) / (double)res->saves,
        res->save_wait_seconds / (double)res->saves, res->save_tail_seconds, res->saved);
  else
    printf(
        "checkpoint save: %zu saved, %.3f GB each in %.3f s (%.3f GB/s), training blocked "
        "%.3f s in all; the last: %s\n",
        res->saves, bytes / GB, each, each > 0 ? bytes / GB / each : 0.0, res->save_seconds,
        res->saved);
}

/* --schedule: gpipe or 1f1b into a ts_schedule_kind. */
static ts_status parse_schedule(const char *v, void *kind) {
  return ts_schedule_kind_parse(v, kind);
}

/* --dtype: ts_dtype_parse into a ts_dtype. */
static ts_status parse_dtype(const char *v, void *dtype) { return ts_dtype_parse(v, dtype); }

/* --reshard-after-forward: the index is ts_engine_opts.keep_gathered. */
static const char *const RESHARD[] = {"true", "false", NULL};
/* --comm: the index is ts_engine_opts.comm (ts_engine_comm_kind). */
static const char *const COMM[] = {"auto", "mpi", "staged", "nccl", NULL};
/* --overlap: the index is ts_engine_opts.overlap. */
static const char *const OVERLAP[] = {"off", "on", NULL};

/* --activation-checkpointing: ts_train_parse_recompute into recompute_every. */
static ts_status parse_recompute(const char *v, void *every) { return ts_train_parse_recompute(v, every); }

/* --loss-scale: "dynamic" (0) or a fixed scale > 0. */
static ts_status parse_loss_scale(const char *v, void *scale) {
  float s = 0; /* dynamic */
  if (strcmp(v, "dynamic") != 0 && (ts_flags_float(v, &s) != TS_OK || !(s > 0)))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "expected dynamic or a scale > 0");
  *(float *)scale = s;
  return TS_OK;
}

/* --comm-timeout: seconds written in decimal (no sign, hex or spaces), 0
 * (wait forever) or 1 to 1e9: below a second the start-up alone would
 * stop the job. */
static ts_status parse_comm_timeout(const char *v, void *seconds) {
  int ok = v[0] >= '0' && v[0] <= '9';
  for (const char *p = v; ok && *p; p++) ok = strchr("0123456789.eE+-", *p) != NULL;
  char *end = NULL;
  double s = ok ? strtod(v, &end) : -1;
  if (!ok || *end || !(s == 0 || (s >= 1 && s <= 1e9)))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "expected 0 (wait forever) or seconds from 1 to 1e9, in decimal");
  *(double *)seconds = s;
  return TS_OK;
}

/* Set on SIGINT, SIGTERM or SIGUSR1 when --save is given: the trainer saves
 * at the next step boundary. The value is the kind of stop (ts_train_config
 * stop): TS_TRAIN_STOP_USER on SIGINT (the run ends with status 0),
 * TS_TRAIN_STOP_PREEMPT on SIGTERM or SIGUSR1 (status 5: SLURM's
 * `--signal=USR1@90` before a preemption or the time limit). */
static volatile sig_atomic_t stop_signal;
static volatile int stop_flag;

/* The process that started this rank (its launcher: mpirun, Open MPI's
 * orted or slurmstepd), when one did (an MPI or SLURM launch's variables
 * are set), else 0. */
static pid_t launcher_pid;

/* 1 if this process was started by an MPI or SLURM launcher. */
static int under_launcher(void) {
  return getenv("OMPI_COMM_WORLD_RANK") || getenv("PMIX_RANK") || getenv("SLURM_PROCID");
}

/* Ends this rank when its launcher is gone (it was reparented): Open MPI
 * puts every rank in a process group of its own, so killing the
 * launcher's group (or mpirun alone, SIGKILL) left the ranks training and
 * committing checkpoints, whose pruning raced the restart's load (issue
 * 45). The rank ends at once without a save, exit 1: a restart goes on
 * from the newest complete checkpoint. Checked every second. */
static void end_if_orphaned(void) {
  if (launcher_pid && getppid() != launcher_pid) {
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (!rank) rank = getenv("PMIX_RANK");
    if (!rank) rank = getenv("SLURM_PROCID");
    fprintf(stderr,
            "tessera train: rank %s: its launcher (pid %d) is gone; stopping without a save\n",
            rank ? rank : "?", (int)launcher_pid);
    _exit(1);
  }
}

/* The one thread that takes SIGINT, SIGTERM and SIGUSR1 (sigtimedwait;
 * with `watch` 0 it takes none) and checks each second that the launcher
 * lives (end_if_orphaned); every other thread of the process blocks the
 * signals (watch_stop_signals). A signal that interrupts a thread in
 * oneDNN's AVX2 matrix product can corrupt the heap ("corrupted size vs.
 * prev_size" in its free: 2 runs in 16 under load, with a handler that
 * does nothing too, tools/checkpoint_test.sh's SIGTERM with oneDNN capped
 * to AVX2; the mechanism inside oneDNN is not known), and no thread that
 * computes or communicates ever sees EINTR. */
static void *stop_signal_thread(void *arg) {
  const sigset_t *set = arg;
  const struct timespec second = {1, 0};
  for (;;) {
    int sig = set ? sigtimedwait(set, NULL, &second) : -1;
    if (!set) nanosleep(&second, NULL);
    if (sig > 0) {
      int kind = sig == SIGINT ? TS_TRAIN_STOP_USER : TS_TRAIN_STOP_PREEMPT;
      if (kind >= stop_flag) stop_signal = sig;
      if (kind > stop_flag) /* a preemption outranks a user's stop */
        __atomic_store_n(&stop_flag, kind, __ATOMIC_RELEASE); /* the trainer loads it so */
    }
    end_if_orphaned();
  }
  return NULL;
}

/* With `watch` 1, blocks SIGINT, SIGTERM and SIGUSR1 in this thread, and
 * so in every thread it starts from now on (MPI's, OpenMP's, the
 * communication and checkpoint threads inherit the mask); under a
 * launcher notes the launcher's pid; then starts the thread that takes the
 * signals and watches the launcher, when there is anything to do. Call
 * before anything starts a thread. */
static int watch_stop_signals(int watch) {
  static sigset_t set;
  pthread_t t;
  if (under_launcher()) launcher_pid = getppid();
  if (!watch && !launcher_pid) return 0;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  if (watch && pthread_sigmask(SIG_BLOCK, &set, NULL) != 0) return -1;
  if (pthread_create(&t, NULL, stop_signal_thread, watch ? &set : NULL) != 0) return -1;
  pthread_detach(t);
  return 0;
}

int ts_tool_train(int argc, char **argv) {
  ts_train_config cfg = ts_train_default_config();
  const char *op_times = getenv("TESSERA_OP_TIMES"); /* 1: where the time goes (kernels.h) */
  if (op_times && !strcmp(op_times, "1")) ts_k_op_times_enable(1);
  sampler smp = {NULL, NULL, NULL, 48, 0, TS_DEVICE_CPU, NULL, 0};
  float peak_tflops = 0;
  ts_engine_opts *e = &cfg.engine;
  size_t log_every = 0, zero = 0, seed = (size_t)e->seed, pipeline = 1, shard_group = 0;
  size_t virtual_stages = 1;
  double comm_timeout = 600; /* seconds; 0: none (comm.h ts_comm_set_timeout) */
  const char *warmup_set = NULL, *accum_set = NULL;
  const char *scale_flag = NULL; /* the loss-scaling flag given last (fp16 only) */
  int device = TS_TOOL_DEVICE_CPU, tf32 = 0, plain_attention = 0, save_async = 0, save_sync = 0;
  const ts_flag flags[] = {
      TS_FLAG_STRING("--model", NULL, &cfg.model, "CONFIG",
                     "a preset (llama-tiny, ...) or a Hugging Face config.json; required", NULL),
      TS_FLAG_STRING("--data", NULL, &cfg.data_dir, "DIR",
                     "train.bin and val.bin from tessera prepare; required", NULL),
      TS_FLAG_SIZE("--steps", NULL, &cfg.steps, 1, "N", "optimizer steps (default 200)", NULL),
      TS_FLAG_SIZE("--micro-batch", NULL, &e->micro_batch, 1, "B",
                   "sequences per micro-batch on each rank (default 8)", NULL),
      TS_FLAG_SIZE("--seq", NULL, &e->seq, 1, "T", "tokens per sequence (default 128)", NULL),
      TS_FLAG_FLOAT("--lr", NULL, &cfg.lr, "LR", "peak learning rate, cosine decay (default 3e-3)",
                    NULL),
      TS_FLAG_SIZE("--seed", NULL, &seed, 0, "S", "random seed (default 1337)", NULL),
      TS_FLAG_SIZE("--grad-accum", NULL, &e->grad_accum, 1, "K",
                   "micro-batches per optimizer step (default 1, or from --global-batch)",
                   &accum_set),
      TS_FLAG_SIZE("--warmup", NULL, &cfg.warmup, 0, "N",
                   "linear warm-up steps (default steps / 10)", &warmup_set),
      TS_FLAG_SIZE("--eval-every", NULL, &cfg.eval_every, 0, "N",
                   "steps between validations (default 0: at the end only)", NULL),
      TS_FLAG_SIZE("--eval-batches", NULL, &cfg.eval_batches, 1, "N",
                   "validation micro-batches per validation (default 16)", NULL),
      TS_FLAG_STRING("--trace", NULL, &cfg.trace_path, "FILE",
                     "write the run's timeline as Chrome trace events (chrome://tracing, "
                     "Perfetto): spans per unit and micro-batch, collectives, optimizer",
                     NULL),
      TS_FLAG_STRING("--metrics", NULL, &cfg.metrics_path, "FILE",
                     "write every step and the summary to FILE as JSON Lines", NULL),
      TS_FLAG_FLOAT("--weight-decay", NULL, &e->weight_decay, "WD",
                    "AdamW weight decay (default 0.1)", NULL),
      TS_FLAG_FLOAT("--grad-clip", NULL, &e->grad_clip, "C",
                    "clip the global gradient norm to C (default 1; 0: no clipping)", NULL),
      TS_FLAG_CUSTOM("--comm-timeout", NULL, &comm_timeout, parse_comm_timeout, "S",
                     "stop the job (exit 4) when a collective or pipeline send/receive waits "
                     "S seconds for a peer, naming it (default 600; 0: wait forever)",
                     NULL),
      TS_FLAG_SIZE("--max-bad-steps", NULL, &cfg.max_bad_steps, 1, "N",
                   "fp32/bf16: stop (exit 3) after N steps in a row skipped for a non-finite "
                   "loss or gradient (default 3)",
                   NULL),
      TS_FLAG_SIZE("--log-every", NULL, &log_every, 1, "N",
                   "steps between kept progress lines (default steps / 20)", NULL),
      TS_FLAG_SIZE("--zero", NULL, &zero, 0, "0|1|2|3", "ZeRO stage (default 0: DDP)", NULL),
      TS_FLAG_SIZE("--shard-group", NULL, &shard_group, 1, "S",
                   "hybrid sharding: ZeRO within groups of S consecutive data-parallel ranks "
                   "(a node), replicated across the groups; S must divide them (default: all)",
                   NULL),
      TS_FLAG_SIZE("--global-batch", NULL, &cfg.global_batch, 1, "G",
                   "sequences per optimizer step over all ranks", NULL),
      TS_FLAG_CUSTOM("--dtype", NULL, &e->dtype, parse_dtype, "fp32|bf16|fp16",
                     "compute dtype; master weights and Adam state stay fp32 (default fp32)", NULL),
      TS_FLAG_CUSTOM("--loss-scale", NULL, &e->loss_scale, parse_loss_scale, "dynamic|S",
                     "fp16: dynamic loss scaling or the fixed scale S (default dynamic)",
                     &scale_flag),
      TS_FLAG_SIZE("--loss-scale-window", NULL, &e->loss_scale_window, 1, "N",
                   "fp16, dynamic: clean steps before the scale doubles (default 2000)",
                   &scale_flag),
      TS_FLAG_FLOAT("--min-loss-scale", NULL, &e->min_loss_scale, "S",
                    "fp16, dynamic: the smallest scale (default 1)", &scale_flag),
      TS_FLAG_CUSTOM("--activation-checkpointing", NULL, &e->recompute_every, parse_recompute,
                     "none|all|every:K", "blocks recomputed in backward (default none)", NULL),
      TS_FLAG_CUSTOM("--fp8", NULL, &cfg.fp8, ts_tool_parse_fp8, "off|tensorwise|rowwise",
                     "llama, --dtype bf16: the blocks' linear layers with fp8 products (E4M3 "
                     "operands, E5M2 gradients, dynamic scales per tensor or per row; cuBLASLt "
                     "on GPUs of compute capability 8.9+, a reference on the CPU) (default off)",
                     NULL),
      TS_FLAG_CHOICE("--reshard-after-forward", NULL, &e->keep_gathered, RESHARD,
                     "ZeRO-3: false keeps each unit's gathered parameters from its forward to its "
                     "last backward of the step, one all-gather per unit per step (default true)",
                     NULL),
      TS_FLAG_CHOICE("--overlap", NULL, &e->overlap, OVERLAP,
                     "start collectives ahead (ZeRO-3 prefetch, reduce-scatter beside the next "
                     "backward, DDP buckets) on a communication thread; the same bits either way "
                     "(default on)",
                     NULL),
      TS_FLAG_CHOICE("--comm", NULL, &e->comm, COMM,
                     "transport of the data-parallel and pipeline groups: mpi (host memory), "
                     "staged (device -> page-locked host -> MPI -> device, in chunks; on the CPU "
                     "the same staging of host memory), nccl (one GPU per rank: NCCL on a "
                     "communication stream; pipeline sends staged); auto: mpi on the CPU, on GPUs "
                     "nccl, or staged where ranks share a GPU (default auto)",
                     NULL),
      TS_FLAG_SIZE("--comm-chunk", NULL, &e->comm_chunk_bytes, 64, "BYTES",
                   "staged: bytes of each rank's part of a chunk (default 1048576); the host "
                   "staging is 4 x ranks x this",
                   NULL),
      TS_FLAG_CUSTOM("--device", NULL, &device, ts_tool_parse_device, "cpu|cuda|auto",
                     "where to train; cuda: GPU local_rank % GPUs, auto: cuda if a GPU is seen "
                     "(default cpu)",
                     NULL),
      TS_FLAG_SIZE("--pipeline", NULL, &pipeline, 1, "P",
                   "pipeline stages (default 1: none); P must divide the ranks", NULL),
      TS_FLAG_STRING("--offload-dir", NULL, &e->offload_dir, "DIR",
                     "keep each rank's optimizer state (fp32 master weights, Adam m and v) in a "
                     "scratch file under DIR, a local disk, streamed in pieces: memory holds "
                     "three pieces of it; the same bits (ZeRO-Infinity's disk offload; beside "
                     "a GPU AdamW runs on the CPU). The file is removed however the run ends; "
                     "checkpoints hold the state as always",
                     NULL),
      TS_FLAG_SIZE("--offload-piece", NULL, &e->offload_piece, 1024, "ELEMENTS",
                   "--offload-dir: elements per streamed piece, a multiple of 1024; memory holds "
                   "three pieces of the state (default 4194304: 16 MiB per array); --offload "
                   "optimizer: elements per copy to and from the device",
                   NULL),
      TS_FLAG_CUSTOM("--offload", NULL, e, ts_tool_parse_offload, "none|optimizer|params",
                     "optimizer: keep each rank's optimizer state (fp32 master weights, Adam m "
                     "and v) in page-locked host memory beside the GPU and run AdamW on the CPU "
                     "threads, a unit at a time; params (--zero 3): the parameter shards too, "
                     "copied to the GPU for each all-gather; the same bits (ZeRO-Offload, "
                     "ZeRO-Infinity; on the cpu device the same copies, saving nothing). "
                     "Default none",
                     NULL),
      TS_FLAG_CUSTOM("--schedule", NULL, &e->schedule, parse_schedule,
                     "gpipe|1f1b|interleaved|zb-h1|zbv",
                     "pipeline schedule (default 1f1b); interleaved: 1F1B over "
                     "--virtual-stages model chunks per stage (Megatron-LM's), the bubble divided "
                     "by v; --grad-accum a multiple of P; zb-h1: 1F1B with each backward split "
                     "into the input gradient and a deferred weight gradient that fills the "
                     "cool-down (Qi et al. 2024), the bubble about a third of 1F1B's; zbv: two "
                     "chunks per stage in a V (stage s holds pieces s and 2P-1-s), B and W "
                     "split, stage 0's 1F1B count of micro-batches in flight (plus W's copies), "
                     "the bubble about a sixth of 1F1B's",
                     NULL),
      TS_FLAG_SIZE("--virtual-stages", NULL, &virtual_stages, 1, "v",
                   "model chunks per pipeline stage: 2 to 16 with --schedule interleaved (the "
                   "units split into P v pieces, piece j on stage j mod P), 2 with zbv; default "
                   "1",
                   NULL),
      TS_FLAG_STRING("--pipeline-split", NULL, &e->pipeline_split, "auto|a,b,...",
                     "units per stage (embedding and head count as units; default auto: "
                     "balanced by FLOPs and bytes)",
                     NULL),
      TS_FLAG_STRING("--save", NULL, &cfg.save_dir, "DIR",
                     "save checkpoints into DIR/step-N (every rank its own slices); also at the "
                     "end and on SIGINT/SIGTERM/SIGUSR1, after which the run exits 0 (SIGINT) or 5",
                     NULL),
      TS_FLAG_SIZE("--save-every", NULL, &cfg.save_every, 1, "N",
                   "steps between checkpoints (default: only at the end)", NULL),
      TS_FLAG_SIZE("--keep", NULL, &cfg.keep, 1, "K",
                   "keep the K newest checkpoints in --save DIR (default: all)", NULL),
      TS_FLAG_SWITCH("--save-async", NULL, &save_async,
                     "the default: each save stalls training only to copy the rank's state to "
                     "host staging; a background thread writes it (checkpoint.h)"),
      TS_FLAG_SWITCH("--save-sync", NULL, &save_sync,
                     "saves write to disk while training waits (no staging memory)"),
      TS_FLAG_STRING("--resume", NULL, &cfg.resume, "DIR|auto",
                     "go on from a checkpoint (a step folder, or the newest in a folder of them; "
                     "auto: the newest in --save DIR, if any), at any ranks, ZeRO stage, "
                     "pipeline or dtype",
                     NULL),
      TS_FLAG_STRING("--init-from", NULL, &cfg.init_from, "DIR",
                     "start from the weights of a Hugging Face folder (config.json + "
                     "safetensors, single or sharded, fp32/bf16/fp16): fine-tuning; --model "
                     "defaults to DIR",
                     NULL),
      TS_FLAG_STRING("--tensorboard", NULL, &cfg.tensorboard_dir, "DIR",
                     "rank 0 writes a TensorBoard event file into DIR (loss, val loss, lr, grad "
                     "norm, tokens/s, GFLOP/s, loss scale, memory per category), flushed every "
                     "step",
                     NULL),
      TS_FLAG_FLOAT("--peak-tflops", NULL, &peak_tflops, "F",
                    "this device's peak TFLOP/s per rank: --tensorboard logs MFU against it",
                    NULL),
      TS_FLAG_SIZE("--sample-every", NULL, &cfg.sample_every, 0, "N",
                   "every N steps and at the end, rank 0 prints text the model writes after "
                   "--prompt (LLaMA; DATA's tokenizer; temperature 0.8, top-k 40, seed the step)",
                   NULL),
      TS_FLAG_STRING("--prompt", NULL, &smp.prompt, "TEXT",
                     "the samples' prompt (default: the text of the validation shard's first 8 "
                     "tokens)",
                     NULL),
      TS_FLAG_SIZE("--sample-tokens", NULL, &smp.tokens, 1, "N",
                   "tokens per sample at most (default 48)", NULL),
      TS_FLAG_SWITCH("--tf32", NULL, &tf32,
                     "cuda, fp32: matrix products on TF32 tensor cores (faster, no fp32 parity)"),
      TS_FLAG_SWITCH("--plain-attention", NULL, &plain_attention,
                     "cuda, bf16/fp16: attention on tessera's plain kernels instead of cuDNN's "
                     "fused ones (slow; to check cuDNN)"),
  };
  int r = ts_flags_parse("train", flags, sizeof flags / sizeof *flags, argc, argv, USAGE);
  if (r != TS_FLAGS_OK) return r == TS_FLAGS_HELP ? 0 : 2;
  /* A stop request saves first (--save): its signals are watched before
   * anything can start a thread (the CUDA driver's, when the device is
   * resolved below; MPI's; OpenMP's). */
  if (watch_stop_signals(cfg.save_dir != NULL) != 0) {
    fprintf(stderr, "tessera train: cannot start the thread that takes SIGINT/SIGTERM/SIGUSR1\n");
    return 1;
  }
  if (cfg.save_dir) cfg.stop = &stop_flag;
  if (!cfg.model) cfg.model = cfg.init_from; /* the folder's own config.json */
  if (!cfg.model || !cfg.data_dir)
    return ts_flags_error("train", "--model and --data are required " TS_FLAGS_HINT);
  /* The library's checks, before MPI starts: bad usage (exit 2), in the
   * library's words with the flags named (ts_flags_error maps them). */
  if (ts_engine_check_zero_stage((long long)zero) != TS_OK ||
      ts_engine_check_pipeline_stages((long long)pipeline) != TS_OK)
    return ts_flags_error("train", "%s", ts_last_error());
  if (cfg.lr < 0) return ts_flags_error("train", "--lr %g: expected a learning rate >= 0", (double)cfg.lr);
  if (e->weight_decay < 0)
    return ts_flags_error("train", "--weight-decay %g: expected >= 0", (double)e->weight_decay);
  if (e->grad_clip < 0)
    return ts_flags_error("train",
                          "--grad-clip %g: expected a gradient-norm bound >= 0 (0: no "
                          "clipping)",
                          (double)e->grad_clip);
  if (e->offload_params && zero != 3)
    return ts_flags_error("train", "--offload params: expected --zero 3 (the parameters sharded)");
  if (e->offload_piece && !e->offload_dir && !e->offload_optimizer)
    return ts_flags_error("train", "--offload-piece applies to --offload-dir and --offload optimizer only");
  if (e->offload_piece % 1024)
    return ts_flags_error("train", "--offload-piece %zu: expected a multiple of 1024 elements",
                          e->offload_piece);
  e->zero_stage = (int)zero;
  e->pipeline_stages = (int)pipeline;
  if (virtual_stages > TS_ENGINE_MAX_CHUNKS)
    return ts_flags_error("train", "--virtual-stages %zu: expected 1 to %d", virtual_stages,
                          TS_ENGINE_MAX_CHUNKS);
  e->virtual_stages = (int)virtual_stages;
  if (shard_group > (size_t)INT32_MAX)
    return ts_flags_error("train", "--shard-group %zu: expected at most %d ranks", shard_group,
                          INT32_MAX);
  e->shard_group = (int)shard_group;
  e->seed = seed;
  if (scale_flag && e->dtype != TS_FP16)
    return ts_flags_error("train", "%s applies to --dtype fp16 only (got --dtype %s)", scale_flag,
                          ts_dtype_name(e->dtype));
  if (tf32 && (device == TS_TOOL_DEVICE_CPU || e->dtype != TS_FP32))
    return ts_flags_error("train", "--tf32 applies to --device cuda with --dtype fp32 only");
  e->allow_tf32 = tf32;
  if (plain_attention && (device == TS_TOOL_DEVICE_CPU || e->dtype == TS_FP32))
    return ts_flags_error("train",
                          "--plain-attention applies to --device cuda with --dtype bf16 or fp16");
  e->plain_attention = plain_attention;
  if (ts_tool_resolve_device(device, 1, &e->device, &e->device_index) != TS_OK)
    return ts_flags_error("train", "%s", ts_last_error());
  if (cfg.global_batch && !accum_set) e->grad_accum = 0; /* derived */
  if (!warmup_set) cfg.warmup = cfg.steps / 10;
  if ((cfg.save_every || cfg.keep) && !cfg.save_dir)
    return ts_flags_error("train", "%s needs --save DIR", cfg.save_every ? "--save-every" : "--keep");
  if ((save_async || save_sync) && !cfg.save_dir)
    return ts_flags_error("train", "%s needs --save DIR",
                          save_sync ? "--save-sync" : "--save-async");
  if (save_async && save_sync)
    return ts_flags_error("train", "--save-async and --save-sync: expected one of them");
  cfg.save_async = !save_sync;
  if (cfg.resume && !strcmp(cfg.resume, "auto") && !cfg.save_dir)
    return ts_flags_error("train", "--resume auto needs --save DIR to look in");
  if (cfg.tensorboard_dir && !cfg.tensorboard_dir[0])
    return ts_flags_error("train", "--tensorboard \"\": expected a folder");
  if (peak_tflops < 0 || (peak_tflops > 0 && !cfg.tensorboard_dir))
    return ts_flags_error("train", peak_tflops < 0 ? "--peak-tflops %g: expected > 0"
                                                   : "--peak-tflops %g needs --tensorboard DIR",
                          (double)peak_tflops);
  cfg.peak_flops = (double)peak_tflops * 1e12;
  if ((smp.prompt || smp.tokens != 48) && !cfg.sample_every)
    return ts_flags_error("train", "%s needs --sample-every N",
                          smp.prompt ? "--prompt" : "--sample-tokens");
  if (cfg.sample_every && pipeline > 1)
    return ts_flags_error("train",
                          "--sample-every with --pipeline %zu: not supported yet (a sample needs "
                          "every stage's weights on rank 0), expected --pipeline 1",
                          pipeline);
  if (cfg.sample_every) { /* the tokenizer and the prompt before any rank starts */
    ts_status sst = ts_text_tokenizer_open(&smp.tok, cfg.data_dir);
    if (sst == TS_OK && !smp.prompt) sst = default_prompt(&smp, cfg.data_dir);
    if (sst != TS_OK) {
      ts_text_tokenizer_free(smp.tok);
      free(smp.own_prompt);
      return ts_flags_error("train", "--sample-every needs the data's tokenizer: %s",
                            ts_last_error());
    }
    smp.steps = cfg.steps;
    smp.device = e->device;
    cfg.sample = sample_now;
    cfg.sample_user = &smp;
  }
  progress p = {stdout_is_terminal(), log_every ? log_every : (cfg.steps + 19) / 20,
                e->dtype == TS_FP16};
  ts_comm_set_timeout(comm_timeout, "--comm-timeout"); /* parse_comm_timeout checked it */
  ts_comm *world = NULL;
  ts_status st = ts_comm_init(&argc, &argv);
  if (st == TS_OK) st = ts_comm_world(&world);
  if (st != TS_OK) {
    fprintf(stderr, "tessera train: %s\n", ts_flags_last_error());
    return 1;
  }
  int rank = ts_comm_rank(world), n = ts_comm_size(world);
  if (e->device == TS_DEVICE_CUDA && n > 1) {
    /* every rank picks the same transport: one rank sharing its GPU puts
     * all on staged (auto; NCCL refuses two ranks on one GPU) */
    double shared = ts_tool_gpu_shared();
    st = ts_comm_all_reduce_f64(world, &shared, 1, TS_COMM_MAX);
    if (st != TS_OK) {
      fprintf(stderr, "tessera train: %s\n", ts_flags_last_error());
      ts_comm_free(world);
      ts_comm_finalize();
      return 1;
    }
    e->gpu_shared = shared != 0;
    ts_comm_reset_counters(world); /* the step's bytes only */
  }
  cfg.dp = world;
  ts_train_result res;
  st = ts_train_run(&cfg, on_event, &p, &res);
  ts_comm_free(world);
  if (st != TS_OK) {
    if (!res.failed_elsewhere) {
      if (n > 1)
        fprintf(stderr, "tessera train: rank %d of %d: %s\n", rank, n, ts_flags_last_error());
      else
        fprintf(stderr, "tessera train: %s\n", ts_flags_last_error());
    }
    /* Setup errors are agreed by every rank; a failure during training is
     * one rank's, and its peers would wait for it in the next collective. */
    if (n > 1 && !res.setup_failed && !res.failed_together) ts_comm_abort(1);
    ts_comm_finalize();
    return st == TS_ERR_NUMERIC ? 3 : 1; /* 3: training diverged (README, exit codes) */
  }
  int preempted = res.stopped_at && res.stop_kind == TS_TRAIN_STOP_PREEMPT;
  if (rank == 0 && res.stopped_at) {
    /* the signal this rank took, else (another rank took it) the kind */
    const char *sig = stop_signal == SIGINT ? "SIGINT" : stop_signal == SIGUSR1 ? "SIGUSR1"
                      : stop_signal == SIGTERM ? "SIGTERM" : preempted ? "SIGTERM/SIGUSR1"
                      : "SIGINT";
    printf("stopped after step %zu on %s: saved %s%s\n", res.stopped_at, sig, res.saved,
           preempted ? " (exit 5: preempted; resume with --resume auto)" : "");
  } else if (rank == 0) {
    print_summary(&cfg, &res);
    print_checkpoints(&cfg, &res);
    if (smp.last) printf("sample at step %zu: %s", cfg.steps, smp.last);
  }
  free(smp.last);
  free(smp.own_prompt);
  ts_text_tokenizer_free(smp.tok);
  ts_comm_finalize();
  return preempted ? 5 : 0;
}
