// gpuhook selftest's CUDA program: device 0's name, UUID and SM count (an MPS client sees the
// SMs its active thread percentage leaves it), then an allocation written by a kernel and read
// back. One "key: value" line each; "ok" last when everything worked (exit 0), else an
// "error: ..." line (exit 1). Build: nvcc -O2 -cudart static -o gpuhook-cuda-probe cuda_probe.cu
#include <cstdio>
#include <cuda_runtime.h>

static const size_t ALLOC_BYTES = 256u << 20;

__global__ void fill(unsigned int *data, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n)
        data[i] = (unsigned int)(i * 2654435761u);
}

static int fail(const char *what, cudaError_t err)
{
    printf("error: %s: %s\n", what, cudaGetErrorString(err));
    return 1;
}

static void print_uuid(const cudaUUID_t *uuid)
{
    const unsigned char *b = (const unsigned char *)uuid->bytes;
    printf("uuid: GPU-");
    for (int i = 0; i < 16; i++)
        printf(i == 4 || i == 6 || i == 8 || i == 10 ? "-%02x" : "%02x", b[i]);
    printf("\n");
}

static int check_allocation(void)
{
    size_t n = ALLOC_BYTES / sizeof(unsigned int);
    unsigned int *data = 0;
    cudaError_t err = cudaMalloc((void **)&data, ALLOC_BYTES);
    if (err != cudaSuccess)
        return fail("cudaMalloc", err);
    fill<<<(unsigned int)((n + 255) / 256), 256>>>(data, n);
    err = cudaDeviceSynchronize();
    if (err != cudaSuccess)
        return fail("kernel", err);
    size_t probe[3] = {0, n / 2, n - 1};
    for (int i = 0; i < 3; i++) {
        unsigned int got = 0;
        err = cudaMemcpy(&got, data + probe[i], sizeof got, cudaMemcpyDeviceToHost);
        if (err != cudaSuccess)
            return fail("cudaMemcpy", err);
        if (got != (unsigned int)(probe[i] * 2654435761u)) {
            printf("error: element %zu reads %u after the kernel wrote it\n", probe[i], got);
            return 1;
        }
    }
    cudaFree(data);
    printf("alloc: %zu\n", ALLOC_BYTES);
    return 0;
}

int main(void)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess)
        return fail("cudaGetDeviceCount", err);
    printf("devices: %d\n", count);
    if (count < 1) {
        printf("error: no CUDA device\n");
        return 1;
    }
    cudaDeviceProp prop;
    err = cudaGetDeviceProperties(&prop, 0);
    if (err != cudaSuccess)
        return fail("cudaGetDeviceProperties", err);
    int sms = 0;
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    if (err != cudaSuccess)
        return fail("cudaDeviceGetAttribute", err);
    printf("device: %s\n", prop.name);
    print_uuid(&prop.uuid);
    printf("compute capability: %d.%d\n", prop.major, prop.minor);
    printf("sms: %d\n", sms);
    if (check_allocation())
        return 1;
    printf("ok\n");
    return 0;
}
