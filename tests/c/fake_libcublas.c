/* A stand-in for libcublas.so with the GEMM entry points the probe hooks, with cuBLAS's own signatures
   (cublas_api.h), doing nothing but touching their shape arguments. */
typedef void *cublasHandle_t;
typedef int cublasOperation_t, cudaDataType, cublasComputeType_t, cublasGemmAlgo_t;
static volatile long long sink;
#define USE(m, n, k, b) (sink = (long long)(m) * (n) * (k) * (b), 0)

int cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                   const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta, float *C,
                   int ldc) {
    (void)h; (void)ta; (void)tb; (void)alpha; (void)A; (void)lda; (void)B; (void)ldb; (void)beta; (void)C; (void)ldc;
    return USE(m, n, k, 1);
}
int cublasDgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                   const double *alpha, const double *A, int lda, const double *B, int ldb, const double *beta,
                   double *C, int ldc) {
    (void)h; (void)ta; (void)tb; (void)alpha; (void)A; (void)lda; (void)B; (void)ldb; (void)beta; (void)C; (void)ldc;
    return USE(m, n, k, 1);
}
int cublasHgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                const void *alpha, const void *A, int lda, const void *B, int ldb, const void *beta, void *C,
                int ldc) {
    (void)h; (void)ta; (void)tb; (void)alpha; (void)A; (void)lda; (void)B; (void)ldb; (void)beta; (void)C; (void)ldc;
    return USE(m, n, k, 1);
}
int cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                 const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt, int ldb,
                 const void *beta, void *C, cudaDataType ct, int ldc, cublasComputeType_t cp, cublasGemmAlgo_t algo) {
    (void)h; (void)ta; (void)tb; (void)alpha; (void)A; (void)at; (void)lda; (void)B; (void)bt; (void)ldb; (void)beta;
    (void)C; (void)ct; (void)ldc; (void)cp; (void)algo;
    return USE(m, n, k, 1);
}
int cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                               const void *alpha, const void *A, cudaDataType at, int lda, long long sa,
                               const void *B, cudaDataType bt, int ldb, long long sb, const void *beta, void *C,
                               cudaDataType ct, int ldc, long long sc, int batch, cublasComputeType_t cp,
                               cublasGemmAlgo_t algo) {
    (void)h; (void)ta; (void)tb; (void)alpha; (void)A; (void)at; (void)lda; (void)sa; (void)B; (void)bt; (void)ldb;
    (void)sb; (void)beta; (void)C; (void)ct; (void)ldc; (void)sc; (void)cp; (void)algo;
    return USE(m, n, k, batch);
}
int cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float *alpha, const float *A, int lda, long long sa, const float *B, int ldb,
                              long long sb, const float *beta, float *C, int ldc, long long sc, int batch) {
    (void)h; (void)ta; (void)tb; (void)alpha; (void)A; (void)lda; (void)sa; (void)B; (void)ldb; (void)sb; (void)beta;
    (void)C; (void)ldc; (void)sc;
    return USE(m, n, k, batch);
}
