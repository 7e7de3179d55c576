/* gpucost's CUDA injection library: CUPTI activity of a process that is not Python, for `gpucost collect-kernels`.
 *
 * CUDA loads the library named by CUDA_INJECTION64_PATH when it initialises and calls InitializeInjection().
 * That opens CUPTI (GPUCOST_CUPTI_LIBRARY: the same libcupti that NVTX_INJECTION64_PATH names, so that NVTX's
 * ranges reach it), enables the activity kinds the Python collector enables (docs/collecting.md), and writes what
 * CUPTI hands back to GPUCOST_ACTIVITY_DIR/activity-<pid>.bin as frames that gpucost reads and converts with the
 * Python collector's own code (gpucost/producers/cupti_native.py holds the reading; the format is there too):
 *
 *   frame   := tag:u8  length:u32  payload[length]          (little-endian, as every CUDA host is)
 *   'H'     := magic "GPUCOST1"  pid:u32  wall_before:i64  cupti:u64  wall_after:i64     (first, at start)
 *   'K'     := corr:u32 start:u64 end:u64 device:u32 stream:u32 grid:i32×3 block:i32×3 regs:u16 static:i32
 *              dynamic:i32  name[rest]
 *   'C','S' := corr:u32 start:u64 end:u64 device:u32 stream:u32 bytes:u64          (memcpy, memset)
 *   'R'     := corr:u32 thread:u32 start:u64                                      (a runtime or driver launch)
 *   'M'     := flags:u32 id:u32 timestamp:u64 thread:u32 domain_len:u16 domain name[rest]
 *   'D'     := device:u32 mig:u8 uuid[16]    (a device's UUID, its MIG instance's if mig: what NVML names it by)
 *   'E'     := wall_before:i64 cupti:u64 wall_after:i64 dropped:u64 calls_unrecorded:u32   (last, at exit)
 *
 * Strings are copied: a record's name is a pointer into this process.  Each completed buffer becomes one write of
 * whole frames, so a process killed with SIGKILL leaves whole frames of the buffers CUPTI had completed.  The file's
 * name holds the pid and the wall clock's ns, so that two processes of one pid (an exec after CUDA started, pid
 * namespaces) each have their own; a child forked without exec writes nothing (it is not the process collected).
 * Devices are named by CUPTI's DEVICE records, not by index: a process's device 0 is whichever GPU
 * CUDA_VISIBLE_DEVICES gave it.  Only the
 * API calls that launch device work (names holding Launch, Memcpy or Memset; host functions excepted) stay
 * recorded, as in the Python collector: recording every call made a launch-bound job 6.5 times slower.
 * The record types (KERNEL_RECORD, ...) are the newest in the headers it is built with (the build picks them).
 */
#define _GNU_SOURCE
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BUFFER_BYTES (8u * 1024u * 1024u)
#define MAX_TEXT 65535u /* a string's bytes in a frame: its u16 length (the reader cuts names at 1,024 chars) */

typedef CUptiResult (*register_fn)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
typedef CUptiResult (*kind_fn)(CUpti_ActivityKind);
typedef CUptiResult (*disable_fn)(CUpti_ActivityKind);
typedef CUptiResult (*flush_fn)(uint32_t);
typedef CUptiResult (*next_fn)(uint8_t *, size_t, CUpti_Activity **);
typedef CUptiResult (*dropped_fn)(CUcontext, uint32_t, size_t *);
typedef CUptiResult (*timestamp_fn)(uint64_t *);
typedef CUptiResult (*api_fn)(CUpti_CallbackId, uint8_t);
typedef CUptiResult (*cb_name_fn)(CUpti_CallbackDomain, uint32_t, const char **);

static struct {
  register_fn register_callbacks;
  kind_fn enable;
  kind_fn enable_and_dump; /* DEVICE records come at CUDA's start, which an injection library may be late for */
  disable_fn disable;
  flush_fn flush_all;
  next_fn next_record;
  dropped_fn dropped;
  timestamp_fn timestamp;
  api_fn runtime_api, driver_api; /* absent from an older CUPTI: every call then stays recorded */
  cb_name_fn callback_name;
} cupti;

static int out_fd = -1;
static pid_t owner = 0; /* the process collected: a child forked from it shares its memory, not its file */
static uint32_t calls_unrecorded = 0;
static const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_DEVICE,   CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                           CUPTI_ACTIVITY_KIND_RUNTIME,  CUPTI_ACTIVITY_KIND_DRIVER,
                                           CUPTI_ACTIVITY_KIND_MARKER,   CUPTI_ACTIVITY_KIND_MEMCPY,
                                           CUPTI_ACTIVITY_KIND_MEMSET};
#define N_KINDS (sizeof kinds / sizeof kinds[0])
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
  uint8_t *data;
  size_t used, size;
} chunk;

static int reserve(chunk *c, size_t more) {
  if (c->used + more <= c->size) return 1;
  size_t size = c->size ? c->size : 1u << 16;
  while (size < c->used + more) size *= 2;
  uint8_t *data = realloc(c->data, size);
  if (!data) return 0;
  c->data = data, c->size = size;
  return 1;
}

static void put(chunk *c, const void *bytes, size_t n) {
  if (!n) return; /* bytes may be NULL then */
  memcpy(c->data + c->used, bytes, n);
  c->used += n;
}

#define PUT(c, value)                 \
  do {                                \
    __typeof__(value) v_ = (value);   \
    put((c), &v_, sizeof v_);         \
  } while (0)

static size_t text_len(const char *s) { return s ? strnlen(s, MAX_TEXT) : 0; }

/* A frame's head; its length is filled in by end_frame once the payload is in. */
static size_t begin_frame(chunk *c, char tag) {
  PUT(c, (uint8_t)tag);
  size_t at = c->used;
  PUT(c, (uint32_t)0);
  return at;
}

static void end_frame(chunk *c, size_t at) {
  uint32_t length = (uint32_t)(c->used - at - sizeof(uint32_t));
  memcpy(c->data + at, &length, sizeof length);
}

static void write_all(const chunk *c) {
  pthread_mutex_lock(&out_lock);
  for (size_t done = 0; out_fd >= 0 && done < c->used;) {
    ssize_t n = write(out_fd, c->data + done, c->used - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break; /* a full disk: the reader sees a cut frame and counts it */
    done += (size_t)n;
  }
  pthread_mutex_unlock(&out_lock);
}

static int64_t wall_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* The clock pair the reader turns into the offset from CUPTI's clock to the epoch (midpoint of the walls). */
static void put_clock(chunk *c) {
  uint64_t gpu = 0;
  int64_t before = wall_ns();
  cupti.timestamp(&gpu);
  int64_t after = wall_ns();
  PUT(c, before);
  PUT(c, gpu);
  PUT(c, after);
}

/* A copy's or a set's frame: the two record types share these fields, not a layout. */
static int work(chunk *c, char tag, uint32_t corr, uint64_t start, uint64_t end, uint32_t device, uint32_t stream,
                uint64_t bytes) {
  if (!reserve(c, 64)) return 0;
  size_t at = begin_frame(c, tag);
  PUT(c, corr); PUT(c, start); PUT(c, end); PUT(c, device); PUT(c, stream); PUT(c, bytes);
  end_frame(c, at);
  return 1;
}

static int record(chunk *c, const CUpti_Activity *r) {
  size_t at;
  switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL: {
      const KERNEL_RECORD *k = (const KERNEL_RECORD *)r;
      size_t n = text_len(k->name);
      if (!reserve(c, 96 + n)) return 0;
      at = begin_frame(c, 'K');
      PUT(c, (uint32_t)k->correlationId); PUT(c, (uint64_t)k->start); PUT(c, (uint64_t)k->end);
      PUT(c, (uint32_t)k->deviceId); PUT(c, (uint32_t)k->streamId);
      PUT(c, (int32_t)k->gridX); PUT(c, (int32_t)k->gridY); PUT(c, (int32_t)k->gridZ);
      PUT(c, (int32_t)k->blockX); PUT(c, (int32_t)k->blockY); PUT(c, (int32_t)k->blockZ);
      PUT(c, (uint16_t)k->registersPerThread);
      PUT(c, (int32_t)k->staticSharedMemory); PUT(c, (int32_t)k->dynamicSharedMemory);
      put(c, k->name, n);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const MEMCPY_RECORD *m = (const MEMCPY_RECORD *)r;
      return work(c, 'C', m->correlationId, m->start, m->end, m->deviceId, m->streamId, m->bytes);
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const MEMSET_RECORD *m = (const MEMSET_RECORD *)r;
      return work(c, 'S', m->correlationId, m->start, m->end, m->deviceId, m->streamId, m->bytes);
    }
    case CUPTI_ACTIVITY_KIND_DEVICE: {
      const DEVICE_RECORD *d = (const DEVICE_RECORD *)r;
      if (!reserve(c, 32)) return 0;
      at = begin_frame(c, 'D');
      PUT(c, (uint32_t)d->id); PUT(c, (uint8_t)(d->isMigEnabled != 0));
      put(c, d->isMigEnabled ? d->migUuid.bytes : d->uuid.bytes, 16);
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)r;
      if (!reserve(c, 32)) return 0;
      at = begin_frame(c, 'R');
      PUT(c, (uint32_t)a->correlationId); PUT(c, (uint32_t)a->threadId); PUT(c, (uint64_t)a->start);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MARKER: {
      const CUpti_ActivityMarker2 *m = (const CUpti_ActivityMarker2 *)r;
      size_t nd = text_len(m->domain), nn = text_len(m->name);
      if (!reserve(c, 48 + nd + nn)) return 0;
      at = begin_frame(c, 'M');
      PUT(c, (uint32_t)m->flags); PUT(c, (uint32_t)m->id); PUT(c, (uint64_t)m->timestamp);
      PUT(c, (uint32_t)m->objectId.pt.threadId); PUT(c, (uint16_t)nd);
      put(c, m->domain, nd);
      put(c, m->name, nn);
      break;
    }
    default:
      return 1; /* a kind not enabled here */
  }
  end_frame(c, at);
  return 1;
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = aligned_alloc(8, BUFFER_BYTES);
  *size = *buffer ? BUFFER_BYTES : 0;
  *max_records = 0; /* as many as fit */
}

static void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid) {
  (void)context, (void)stream, (void)size;
  if (getpid() != owner) { /* a forked child's copy of the parent's buffers: the parent writes them */
    free(buffer);
    return;
  }
  chunk c = {0};
  CUpti_Activity *r = NULL;
  while (cupti.next_record(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (!record(&c, r)) break; /* out of memory: the frames so far go out */
  }
  write_all(&c);
  free(c.data);
  free(buffer);
}

static int is_launch_call(const char *name) {
  return (strstr(name, "Launch") || strstr(name, "Memcpy") || strstr(name, "Memset")) && !strstr(name, "HostFunc");
}

/* Stops the records of every runtime and driver call that puts no work on a device; returns how many. */
static uint32_t launch_calls_only(void) {
  static const struct {
    CUpti_CallbackDomain domain;
    uint32_t size;
  } domains[] = {{CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_SIZE},
                 {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_SIZE}};
  uint32_t off = 0;
  if (!cupti.runtime_api || !cupti.driver_api || !cupti.callback_name) return 0;
  for (size_t d = 0; d < sizeof domains / sizeof domains[0]; d++) {
    api_fn enable = domains[d].domain == CUPTI_CB_DOMAIN_RUNTIME_API ? cupti.runtime_api : cupti.driver_api;
    for (uint32_t cbid = 1; cbid < domains[d].size; cbid++) {
      const char *name = NULL;
      if (cupti.callback_name(domains[d].domain, cbid, &name) != CUPTI_SUCCESS || !name) continue;
      if (is_launch_call(name)) continue;
      if (enable(cbid, 0) == CUPTI_SUCCESS) off++;
    }
  }
  return off;
}

static void at_exit(void) {
  if (getpid() != owner) return; /* a child forked without exec: its exit is not the collected process's */
  chunk c = {0};
  size_t dropped = 0;
  cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED); /* incomplete buffers too */
  for (size_t i = 0; i < N_KINDS; i++) cupti.disable(kinds[i]);
  cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED); /* what came while they were being disabled */
  cupti.dropped(NULL, 0, &dropped);
  if (reserve(&c, 64)) {
    size_t at = begin_frame(&c, 'E');
    put_clock(&c);
    PUT(&c, (uint64_t)dropped);
    PUT(&c, calls_unrecorded);
    end_frame(&c, at);
    write_all(&c);
  }
  free(c.data);
  pthread_mutex_lock(&out_lock);
  close(out_fd);
  out_fd = -1;
  pthread_mutex_unlock(&out_lock);
}

static int complain(const char *what) {
  fprintf(stderr, "gpucost injection: %s; this process's kernels are not collected\n", what);
  return 0;
}

#define LOOK_UP(field, symbol) (cupti.field = (__typeof__(cupti.field))dlsym(library, symbol))

/* Opens this process's file, a name of its own: the pid and the wall clock's ns, retried if taken. */
static int open_file(const char *dir, char *file, size_t size) {
  for (int attempt = 0; attempt < 16; attempt++) {
    int n = snprintf(file, size, "%s/activity-%ld-%lld.bin", dir, (long)getpid(), (long long)wall_ns() + attempt);
    if (n < 0 || (size_t)n >= size) return -1;
    int fd = open(file, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

/* Undoes a start that failed half way, so that nothing of this process is collected rather than a part of it. */
static int give_up(const char *what, size_t enabled, const char *file) {
  for (size_t i = 0; i < enabled; i++) cupti.disable(kinds[i]);
  close(out_fd);
  out_fd = -1;
  unlink(file);
  return complain(what);
}

int InitializeInjection(void) {
  static int done = 0;
  if (done++) return 1; /* CUDA may call it again: one set of callbacks a process */
  const char *path = getenv("GPUCOST_CUPTI_LIBRARY"), *dir = getenv("GPUCOST_ACTIVITY_DIR");
  if (!path || !*path || !dir || !*dir) return complain("GPUCOST_CUPTI_LIBRARY or GPUCOST_ACTIVITY_DIR is not set");
  void *library = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!library) return complain(dlerror());
  if (!LOOK_UP(register_callbacks, "cuptiActivityRegisterCallbacks") || !LOOK_UP(enable, "cuptiActivityEnable") ||
      !LOOK_UP(disable, "cuptiActivityDisable") || !LOOK_UP(flush_all, "cuptiActivityFlushAll") ||
      !LOOK_UP(next_record, "cuptiActivityGetNextRecord") || !LOOK_UP(dropped, "cuptiActivityGetNumDroppedRecords") ||
      !LOOK_UP(timestamp, "cuptiGetTimestamp"))
    return complain("the CUPTI library lacks the activity API");
  LOOK_UP(enable_and_dump, "cuptiActivityEnableAndDump");
  LOOK_UP(runtime_api, "cuptiActivityEnableRuntimeApi");
  LOOK_UP(driver_api, "cuptiActivityEnableDriverApi");
  LOOK_UP(callback_name, "cuptiGetCallbackName");
  char file[4096];
  owner = getpid();
  out_fd = open_file(dir, file, sizeof file);
  if (out_fd < 0) return complain(strerror(errno));
  if (cupti.register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS)
    return give_up("CUPTI refused the buffer callbacks", 0, file);
  for (size_t i = 0; i < N_KINDS; i++) {
    kind_fn enable = kinds[i] == CUPTI_ACTIVITY_KIND_DEVICE && cupti.enable_and_dump ? cupti.enable_and_dump : cupti.enable;
    if (enable(kinds[i]) != CUPTI_SUCCESS) return give_up("CUPTI refused an activity kind", i, file);
  }
  chunk c = {0}; /* the header before any record: CUDA is still starting, so no buffer has completed */
  if (!reserve(&c, 64)) return give_up("out of memory", N_KINDS, file);
  size_t at = begin_frame(&c, 'H');
  put(&c, "GPUCOST1", 8);
  PUT(&c, (uint32_t)getpid());
  put_clock(&c);
  end_frame(&c, at);
  write_all(&c);
  free(c.data);
  calls_unrecorded = launch_calls_only();
  atexit(at_exit);
  return 1;
}
