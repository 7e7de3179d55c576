/* A job as CUDA would run it under CUDA_INJECTION64_PATH: the library is loaded and InitializeInjection() called.
 * "exit CODE" returns CODE (the library's exit handler flushes); "kill" has CUPTI hand over its completed buffers
 * (a flush that is not forced, as CUPTI does while a job runs), then dies by SIGKILL, leaving no exit frame. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  void *library = dlopen(getenv("CUDA_INJECTION64_PATH"), RTLD_NOW);
  int (*initialize)(void) = library ? (int (*)(void))dlsym(library, "InitializeInjection") : NULL;
  if (!initialize || !initialize()) return 90;
  if (argc > 1 && strcmp(argv[1], "kill") == 0) {
    int (*flush)(unsigned) = (int (*)(unsigned))dlsym(RTLD_DEFAULT, "cuptiActivityFlushAll");
    if (flush) flush(0);
    raise(SIGKILL);
  }
  return argc > 2 ? atoi(argv[2]) : 0;
}
