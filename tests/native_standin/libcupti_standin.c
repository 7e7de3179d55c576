/* A stand-in for libcupti: the injection library's calls, answered from a recording, as CUPTI would answer them.
 *
 * CUPTI_STANDIN_RECORDS names a text file of the "GPU"'s activity; each record is laid out as the real CUPTI
 * struct of the headers it is built with (KERNEL_RECORD, ...), one buffer after another, so the library under
 * test reads real layouts through cuptiActivityGetNextRecord.  Lines (strings as hex, "-" for a null pointer):
 *   T c1 c2 …        successive cuptiGetTimestamp values          D n      the dropped-record count
 *   B                a new buffer                                  N domain cbid name   a call's name
 *   K kind corr start end device stream gx gy gz bx by bz regs static dynamic name
 *   C kind corr start end device stream bytes     (kind 1 memcpy, 2 memset)
 *   R kind corr thread start                      (kind 4 driver, 5 runtime)
 *   M flags id timestamp thread domain name
 *   V device mig uuid mig_uuid                    (a DEVICE record; the UUIDs as 32 hex digits)
 * A flush delivers every buffer (forced) or all but the last; CUPTI_STANDIN_LOG gets each kind enabled or disabled
 * and each call switched ("kind K", "off K", "api DOMAIN CBID ON"; "dump K" before "kind K" for an enable that dumps); CUPTI_STANDIN_REFUSE=K refuses to enable kind K.
 */
#define _GNU_SOURCE
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BUFFERS 64
#define MAX_NAMES 64

static CUpti_BuffersCallbackRequestFunc requested;
static CUpti_BuffersCallbackCompleteFunc completed;
static char *lines[MAX_BUFFERS]; /* each buffer's record lines, joined by '\n' */
static size_t n_buffers, next_buffer, dropped;
static uint64_t clock_values[16];
static size_t n_clock, next_clock;
static struct {
  int domain;
  uint32_t cbid;
  char name[128];
} names[MAX_NAMES];
static size_t n_names;
static FILE *log_file;

static char *unhex(const char *hex) { /* leaked on purpose: CUPTI's strings live as long as the process */
  if (strcmp(hex, "-") == 0) return NULL;
  size_t n = strlen(hex) / 2;
  char *out = calloc(n + 1, 1);
  for (size_t i = 0; i < n; i++) sscanf(hex + 2 * i, "%2hhx", (unsigned char *)&out[i]);
  return out;
}

static void load(void) {
  const char *path = getenv("CUPTI_STANDIN_RECORDS");
  FILE *f = path ? fopen(path, "r") : NULL;
  if (!f) return;
  const char *log_path = getenv("CUPTI_STANDIN_LOG");
  log_file = log_path ? fopen(log_path, "w") : NULL;
  char line[8192];
  while (fgets(line, sizeof line, f)) {
    if (line[0] == 'B' && n_buffers < MAX_BUFFERS) {
      lines[n_buffers++] = calloc(1, 1);
    } else if (line[0] == 'T') {
      char *p = line + 1, *end;
      for (unsigned long long v; n_clock < 16 && (v = strtoull(p, &end, 10), end != p); p = end)
        clock_values[n_clock++] = v;
    } else if (line[0] == 'D') {
      dropped = strtoull(line + 1, NULL, 10);
    } else if (line[0] == 'N' && n_names < MAX_NAMES) {
      sscanf(line + 1, "%d %u %127s", &names[n_names].domain, &names[n_names].cbid, names[n_names].name);
      n_names++;
    } else if (n_buffers) {
      char **b = &lines[n_buffers - 1];
      size_t had = strlen(*b);
      *b = realloc(*b, had + strlen(line) + 1);
      strcpy(*b + had, line);
    }
  }
  fclose(f);
}

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

/* Lays a buffer's records out as CUPTI's structs; returns the bytes used. */
static size_t fill(const char *text, uint8_t *buffer, size_t size) {
  size_t used = 0;
  char *copy = strdup(text), *save = NULL;
  for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char a[8192], b[8192];
    unsigned long long v[16] = {0};
    uint8_t *at = buffer + used;
    size_t room = size - used, need = 0;
    if (line[0] == 'K') {
      need = align8(sizeof(KERNEL_RECORD));
      if (need > room || sscanf(line + 1, "%llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %s",
                                &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11],
                                &v[12], &v[13], &v[14], a) != 16)
        break;
      KERNEL_RECORD *k = memset(at, 0, need);
      k->kind = (CUpti_ActivityKind)v[0], k->correlationId = v[1], k->start = v[2], k->end = v[3];
      k->deviceId = v[4], k->streamId = v[5], k->gridX = v[6], k->gridY = v[7], k->gridZ = v[8];
      k->blockX = v[9], k->blockY = v[10], k->blockZ = v[11], k->registersPerThread = v[12];
      k->staticSharedMemory = v[13], k->dynamicSharedMemory = v[14], k->name = unhex(a);
    } else if (line[0] == 'C') {
      if (sscanf(line + 1, "%llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]) != 7)
        break;
      if (v[0] == CUPTI_ACTIVITY_KIND_MEMSET) {
        need = align8(sizeof(MEMSET_RECORD));
        if (need > room) break;
        MEMSET_RECORD *m = memset(at, 0, need);
        m->kind = CUPTI_ACTIVITY_KIND_MEMSET, m->correlationId = v[1], m->start = v[2], m->end = v[3];
        m->deviceId = v[4], m->streamId = v[5], m->bytes = v[6];
      } else {
        need = align8(sizeof(MEMCPY_RECORD));
        if (need > room) break;
        MEMCPY_RECORD *m = memset(at, 0, need);
        m->kind = CUPTI_ACTIVITY_KIND_MEMCPY, m->correlationId = v[1], m->start = v[2], m->end = v[3];
        m->deviceId = v[4], m->streamId = v[5], m->bytes = v[6];
      }
    } else if (line[0] == 'R') {
      need = align8(sizeof(CUpti_ActivityAPI));
      if (need > room || sscanf(line + 1, "%llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3]) != 4) break;
      CUpti_ActivityAPI *r = memset(at, 0, need);
      r->kind = (CUpti_ActivityKind)v[0], r->correlationId = v[1], r->threadId = v[2], r->start = v[3];
      r->end = v[3] + 5;
    } else if (line[0] == 'V') {
      need = align8(sizeof(DEVICE_RECORD));
      if (need > room || sscanf(line + 1, "%llu %llu %s %s", &v[0], &v[1], a, b) != 4) break;
      DEVICE_RECORD *d = memset(at, 0, need);
      d->kind = CUPTI_ACTIVITY_KIND_DEVICE, d->id = v[0], d->isMigEnabled = v[1];
      for (int i = 0; i < 16; i++) {
        sscanf(a + 2 * i, "%2hhx", &d->uuid.bytes[i]);
        sscanf(b + 2 * i, "%2hhx", &d->migUuid.bytes[i]);
      }
    } else if (line[0] == 'M') {
      need = align8(sizeof(CUpti_ActivityMarker2));
      if (need > room || sscanf(line + 1, "%llu %llu %llu %llu %s %s", &v[0], &v[1], &v[2], &v[3], a, b) != 6) break;
      CUpti_ActivityMarker2 *m = memset(at, 0, need);
      m->kind = CUPTI_ACTIVITY_KIND_MARKER, m->flags = (CUpti_ActivityFlag)v[0], m->id = v[1], m->timestamp = v[2];
      m->objectKind = CUPTI_ACTIVITY_OBJECT_THREAD, m->objectId.pt.threadId = v[3];
      m->domain = unhex(a), m->name = unhex(b);
    }
    used += need;
  }
  free(copy);
  return used;
}

static size_t record_size(const CUpti_Activity *r) {
  switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL: return align8(sizeof(KERNEL_RECORD));
    case CUPTI_ACTIVITY_KIND_MEMCPY: return align8(sizeof(MEMCPY_RECORD));
    case CUPTI_ACTIVITY_KIND_MEMSET: return align8(sizeof(MEMSET_RECORD));
    case CUPTI_ACTIVITY_KIND_MARKER: return align8(sizeof(CUpti_ActivityMarker2));
    case CUPTI_ACTIVITY_KIND_DEVICE: return align8(sizeof(DEVICE_RECORD));
    default: return align8(sizeof(CUpti_ActivityAPI));
  }
}

CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc r, CUpti_BuffersCallbackCompleteFunc c) {
  requested = r, completed = c;
  load();
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind) {
  const char *refuse = getenv("CUPTI_STANDIN_REFUSE");
  if (refuse && atoi(refuse) == (int)kind) return CUPTI_ERROR_NOT_COMPATIBLE;
  if (log_file) fprintf(log_file, "kind %d\n", (int)kind), fflush(log_file);
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityEnableAndDump(CUpti_ActivityKind kind) {
  if (log_file) fprintf(log_file, "dump %d\n", (int)kind), fflush(log_file);
  return cuptiActivityEnable(kind);
}

CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind) {
  if (log_file) fprintf(log_file, "off %d\n", (int)kind), fflush(log_file);
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityFlushAll(uint32_t flag) {
  size_t last = flag & CUPTI_ACTIVITY_FLAG_FLUSH_FORCED ? n_buffers : (n_buffers ? n_buffers - 1 : 0);
  for (; next_buffer < last; next_buffer++) {
    uint8_t *buffer = NULL;
    size_t size = 0, max_records = 0;
    requested(&buffer, &size, &max_records);
    if (!buffer) return CUPTI_ERROR_OUT_OF_MEMORY;
    completed(NULL, 0, buffer, size, fill(lines[next_buffer], buffer, size));
  }
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, CUpti_Activity **record) {
  uint8_t *next = *record ? (uint8_t *)*record + record_size(*record) : buffer;
  if (next >= buffer + valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *record = (CUpti_Activity *)next;
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t stream, size_t *n) {
  (void)context, (void)stream;
  *n = dropped;
  dropped = 0;
  return CUPTI_SUCCESS;
}

CUptiResult cuptiGetTimestamp(uint64_t *t) {
  *t = n_clock ? clock_values[next_clock < n_clock ? next_clock++ : n_clock - 1] : 0;
  return CUPTI_SUCCESS;
}

CUptiResult cuptiGetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid, const char **name) {
  for (size_t i = 0; i < n_names; i++) {
    if (names[i].domain == (int)domain && names[i].cbid == cbid) return *name = names[i].name, CUPTI_SUCCESS;
  }
  return CUPTI_ERROR_INVALID_PARAMETER;
}

static CUptiResult switched(int domain, CUpti_CallbackId cbid, uint8_t on) {
  if (log_file) fprintf(log_file, "api %d %u %d\n", domain, (unsigned)cbid, (int)on), fflush(log_file);
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityEnableRuntimeApi(CUpti_CallbackId cbid, uint8_t on) {
  return switched(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, on);
}

CUptiResult cuptiActivityEnableDriverApi(CUpti_CallbackId cbid, uint8_t on) {
  return switched(CUPTI_CB_DOMAIN_DRIVER_API, cbid, on);
}
