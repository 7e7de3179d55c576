/* Maps N pages at a fixed hint address and writes one byte to each: N page faults. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 256;
    long page = 4096;
    char *base = mmap((void *)0x7e0000000000, n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) { perror("mmap"); return 1; }
    for (long i = 0; i < n; i++) base[i * page] = 1;
    printf("%lu %lu\n", (unsigned long)base, (unsigned long)(base + n * page));
    return 0;
}
