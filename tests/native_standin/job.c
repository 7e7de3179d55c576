/* A job as CUDA would run it under CUDA_INJECTION64_PATH: the library is loaded and InitializeInjection() called.
 * "exit CODE" returns CODE (the library's exit handler flushes); "kill" has CUPTI hand over its completed buffers
 * (a flush that is not forced, as CUPTI does while a job runs), then dies by SIGKILL, leaving no exit frame;
 * "fork" forks a child that flushes its copy of CUPTI's state and exits, then returns 0 once it has; "exec" runs
 * itself again as "exit 0" in the same process (same pid), as a wrapper that started CUDA before exec would. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
  void *library = dlopen(getenv("CUDA_INJECTION64_PATH"), RTLD_NOW);
  int (*initialize)(void) = library ? (int (*)(void))dlsym(library, "InitializeInjection") : NULL;
  if (!initialize) return 90;
  initialize(); /* CUDA goes on whatever it returns: so does the job */
  if (argc > 1 && strcmp(argv[1], "kill") == 0) {
    int (*flush)(unsigned) = (int (*)(unsigned))dlsym(RTLD_DEFAULT, "cuptiActivityFlushAll");
    if (flush) flush(0);
    raise(SIGKILL);
  }
  if (argc > 1 && strcmp(argv[1], "fork") == 0) {
    pid_t child = fork();
    if (child == 0) {
      int (*flush)(unsigned) = (int (*)(unsigned))dlsym(RTLD_DEFAULT, "cuptiActivityFlushAll");
      if (flush) flush(1);
      exit(0);
    }
    waitpid(child, NULL, 0);
  }
  if (argc > 1 && strcmp(argv[1], "exec") == 0) {
    char *again[] = {argv[0], "exit", "0", NULL};
    execv("/proc/self/exe", again);
    return 91;
  }
  return argc > 2 ? atoi(argv[2]) : 0;
}
