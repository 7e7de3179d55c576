/* Loads the CUDA driver library named in argv[1] and calls it like a CUDA program would:
   N launches of grid (i+1, 2, 1) x block (128, 1, 3), and N allocations of (i+1) MiB. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                        void **, void **);
typedef int (*alloc_t)(unsigned long long *, size_t);
int main(int argc, char **argv) {
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    launch_t launch = (launch_t)dlsym(lib, "cuLaunchKernel");
    alloc_t alloc = (alloc_t)dlsym(lib, "cuMemAlloc_v2");
    long n = argc > 2 ? atol(argv[2]) : 10;
    unsigned long long ptr;
    for (long i = 0; i < n; i++) {
        launch(NULL, (unsigned)(i + 1), 2, 1, 128, 1, 3, 0, NULL, NULL, NULL);
        alloc(&ptr, (size_t)(i + 1) << 20);
    }
    return 0;
}
