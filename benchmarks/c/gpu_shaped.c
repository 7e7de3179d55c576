/* A program shaped like a GPU job, for the producer's overhead: it loads the CUDA driver library named in
   argv[1] (the tests' stand-in) and
   - at start-up, allocates: HOST_MIB of host memory written once (its weights and staging buffers: nearly all
     of its page faults happen here) and 64 device buffers (cuMemAlloc_v2);
   - then runs STEPS steps, each copying 4 MiB between its host buffers (an input batch staged, no new faults),
     launching LAUNCHES kernels (cuLaunchKernel) and waiting for them (a synchronize).
   The stand-in library does no work, so the device is emulated here as CUDA's is: a launch returns at once
   and queues KERNEL_US microseconds of device time behind the kernels before it; a synchronize spins until the
   queue is empty, as CUDA's default spin-wait does. A step therefore takes the longer of the CPU's launching
   and the device's kernels, and a probe on the launch path slows the program only where launching is the
   longer: a GPU-bound job hides it, a launch-bound one (small kernels) pays it in full.
   Usage: gpu_shaped LIBCUDA HOST_MIB STEPS LAUNCHES KERNEL_US */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                        void **, void **);
typedef int (*alloc_t)(unsigned long long *, size_t);

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 6) { fprintf(stderr, "usage: gpu_shaped LIBCUDA HOST_MIB STEPS LAUNCHES KERNEL_US\n"); return 2; }
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    launch_t launch = (launch_t)dlsym(lib, "cuLaunchKernel");
    alloc_t alloc = (alloc_t)dlsym(lib, "cuMemAlloc_v2");
    long host = atol(argv[2]) << 20, steps = atol(argv[3]), launches = atol(argv[4]);
    long long kernel_ns = atoll(argv[5]) * 1000, busy_until = 0;
    char *p = mmap(NULL, host, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 1; }
    for (long i = 0; i < host; i += 4096) p[i] = (char)i;
    unsigned long long ptr;
    for (int i = 0; i < 64; i++) alloc(&ptr, (size_t)(i + 1) << 20);
    long batch = 4L << 20, slots = host / batch;
    unsigned long sum = 0;
    for (long s = 0; s < steps; s++) {
        if (slots > 1) memcpy(p + (s % (slots - 1) + 1) * batch, p, (size_t)batch);
        for (long k = 0; k < launches; k++) {
            launch(NULL, (unsigned)(k + 1), 2, 1, 128, 1, 3, 0, NULL, NULL, NULL);
            long long t = now_ns();
            busy_until = (busy_until > t ? busy_until : t) + kernel_ns;
        }
        while (now_ns() < busy_until) { }
        sum += (unsigned char)p[s * 4099 % host];
    }
    printf("%lu\n", sum);
    return 0;
}
