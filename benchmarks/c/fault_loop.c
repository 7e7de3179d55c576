/* Map MIB megabytes, write PASSES times over every byte (only the first pass faults), unmap;
   ROUNDS times. PASSES = 1 is the worst case for a page-fault probe: nothing but faults. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
int main(int argc, char **argv) {
    long mib = argc > 1 ? atol(argv[1]) : 64, rounds = argc > 2 ? atol(argv[2]) : 20;
    long passes = argc > 3 ? atol(argv[3]) : 1, page = 4096, faults = 0;
    unsigned long sum = 0;
    for (long r = 0; r < rounds; r++) {
        char *p = mmap(NULL, mib << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) { perror("mmap"); return 1; }
        for (long i = 0; i < (mib << 20); i += page) { p[i] = (char)i; faults++; }
        for (long k = 1; k < passes; k++) { memset(p, (int)k, mib << 20); sum += (unsigned char)p[k * 4099 % (mib << 20)]; }
        munmap(p, mib << 20);
    }
    printf("%ld %lu\n", faults, sum);
    return 0;
}
