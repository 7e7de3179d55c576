/* A stand-in for libcuda.so.1 with the two entry points the probe hooks, doing nothing. */
#include <stddef.h>
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra) {
    (void)f; (void)shared; (void)stream; (void)params; (void)extra;
    return (int)(gx + gy + gz + bx + by + bz) < 0;
}
int cuMemAlloc_v2(unsigned long long *dptr, size_t bytes) { *dptr = (unsigned long long)bytes; return 0; }
