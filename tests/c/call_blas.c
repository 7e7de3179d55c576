/* Loads the cuBLAS library named in argv[1] and calls each GEMM entry point N times (argv[2]) the way a
   program would, through dlopen/dlsym and cuBLAS's signatures: call i of each has the shapes below,
   with the values around the shape arguments (strides, leading dimensions, types) set to others. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
typedef int (*gemm_t)(void *, int, int, int, int, int, const void *, const void *, int, const void *, int,
                      const void *, void *, int);
typedef int (*gemm_ex_t)(void *, int, int, int, int, int, const void *, const void *, int, int, const void *, int, int,
                         const void *, void *, int, int, int, int);
typedef int (*strided_ex_t)(void *, int, int, int, int, int, const void *, const void *, int, int, long long,
                            const void *, int, int, long long, const void *, void *, int, int, long long, int, int,
                            int);
typedef int (*strided_t)(void *, int, int, int, int, int, const void *, const void *, int, long long, const void *,
                         int, long long, const void *, void *, int, long long, int);
int main(int argc, char **argv) {
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    gemm_t s = (gemm_t)dlsym(lib, "cublasSgemm_v2"), d = (gemm_t)dlsym(lib, "cublasDgemm_v2"),
           h = (gemm_t)dlsym(lib, "cublasHgemm");
    gemm_ex_t ex = (gemm_ex_t)dlsym(lib, "cublasGemmEx");
    strided_ex_t sbx = (strided_ex_t)dlsym(lib, "cublasGemmStridedBatchedEx");
    strided_t sb = (strided_t)dlsym(lib, "cublasSgemmStridedBatched");
    long n = argc > 2 ? atol(argv[2]) : 10;
    for (int i = 0; i < n; i++) {
        s(NULL, 0, 1, i + 1, 2, 3, NULL, NULL, 99, NULL, 98, NULL, NULL, 97);
        d(NULL, 1, 0, 4, i + 1, 5, NULL, NULL, 99, NULL, 98, NULL, NULL, 97);
        h(NULL, 0, 0, 6, 7, i + 1, NULL, NULL, 99, NULL, 98, NULL, NULL, 97);
        ex(NULL, 0, 0, i + 2, 3, 4, NULL, NULL, 2, 99, NULL, 2, 98, NULL, NULL, 0, 97, 68, -1);
        sbx(NULL, 0, 0, 2, 3, 4, NULL, NULL, 2, 99, 1LL << 40, NULL, 2, 98, 1LL << 41, NULL, NULL, 0, 97, 1LL << 42,
            i + 1, 68, -1);
        sb(NULL, 0, 0, 5, 6, 7, NULL, NULL, 99, 1LL << 40, NULL, 98, 1LL << 41, NULL, NULL, 97, 1LL << 42, i + 2);
    }
    return 0;
}
