// Device probe (docs/measurements/2026-11-29-h200-host-reach): run `host-reach` for the pageable-access
// attributes and copy rates, `host-reach write` to see whether a kernel can write plain malloc memory.
// Can a kernel reach the worker's own host memory? And how fast are pageable and pinned copies?
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <thread>

__global__ void write_host(int* p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = 0x5eed0000 + i;
}
__global__ void read_host(const int* p, int n, int* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(out, p[i] & 1);
}

static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IONBF, 0);
    bool write_test = argc > 1;
    cudaSetDevice(0);
    int v = -1;
    CUdevice dev; cuInit(0); cuDeviceGet(&dev, 0);
    cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, dev);
    printf("PAGEABLE_MEMORY_ACCESS %d\n", v);
    cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, dev);
    printf("PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES %d\n", v);
    cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, dev);
    printf("CONCURRENT_MANAGED_ACCESS %d\n", v);
    cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, dev);
    printf("UNIFIED_ADDRESSING %d\n", v);

    // A kernel writing plain malloc'd memory, as a kernel under test would the worker's heap.
    if (write_test) {
        const int n = 1 << 20;
        std::vector<int> heap(n, 7);
        write_host<<<n / 256, 256>>>(heap.data(), n);
        cudaError_t e = cudaDeviceSynchronize();
        printf("kernel write to std::vector heap memory: %s; heap[5] = %#x (was 0x7)\n", cudaGetErrorString(e), heap[5]);
        return 0;
    }

    // Copies of 64 MiB, as one large launch's O.
    const size_t bytes = 64ull << 20;
    void* d; cudaMalloc(&d, bytes); cudaMemset(d, 1, bytes);
    char* fresh = (char*)malloc(bytes);
    std::vector<char> touched(bytes, 0);
    char* pinned; cudaMallocHost((void**)&pinned, bytes);
    auto rate = [&](const char* what, auto f) {
        f(); cudaDeviceSynchronize();
        double best = 1e9;
        for (int r = 0; r < 5; ++r) { double t0 = now(); f(); cudaDeviceSynchronize(); best = std::min(best, now() - t0); }
        printf("%-58s %7.2f ms  %6.1f GB/s\n", what, best * 1e3, bytes / best / 1e9);
    };
    double t0 = now(); cudaMemcpy(fresh, d, bytes, cudaMemcpyDeviceToHost);
    printf("%-58s %7.2f ms\n", "D2H into untouched malloc (first time)", (now() - t0) * 1e3);
    rate("D2H pageable (touched)", [&] { cudaMemcpy(touched.data(), d, bytes, cudaMemcpyDeviceToHost); });
    rate("H2D pageable (touched)", [&] { cudaMemcpy(d, touched.data(), bytes, cudaMemcpyHostToDevice); });
    rate("D2H pinned", [&] { cudaMemcpy(pinned, d, bytes, cudaMemcpyDeviceToHost); });
    rate("H2D pinned", [&] { cudaMemcpy(d, pinned, bytes, cudaMemcpyHostToDevice); });
    rate("memcpy pinned -> pageable, 1 thread", [&] { memcpy(touched.data(), pinned, bytes); });
    for (int th : {4, 8}) {
        char label[96]; snprintf(label, sizeof label, "memcpy pinned -> pageable, %d threads", th);
        rate(label, [&] {
            std::vector<std::thread> ts;
            for (int k = 0; k < th; ++k) ts.emplace_back([&, k] { size_t c = bytes / th; memcpy(touched.data() + k * c, pinned + k * c, c); });
            for (auto& t : ts) t.join();
        });
    }
    // Chunked: D2H of chunk i+1 into a pinned ring while threads copy chunk i out.
    const size_t chunk = 8ull << 20;
    rate("D2H pinned 8 MiB chunks + 4-thread memcpy out, pipelined", [&] {
        cudaStream_t s; cudaStreamCreate(&s);
        cudaEvent_t ev[2]; cudaEventCreate(&ev[0]); cudaEventCreate(&ev[1]);
        size_t nch = bytes / chunk;
        cudaMemcpyAsync(pinned, d, chunk, cudaMemcpyDeviceToHost, s); cudaEventRecord(ev[0], s);
        for (size_t i = 0; i < nch; ++i) {
            if (i + 1 < nch) { cudaMemcpyAsync(pinned + ((i + 1) % 2) * chunk, (char*)d + (i + 1) * chunk, chunk, cudaMemcpyDeviceToHost, s); cudaEventRecord(ev[(i + 1) % 2], s); }
            cudaEventSynchronize(ev[i % 2]);
            std::vector<std::thread> ts;
            for (int k = 0; k < 4; ++k) ts.emplace_back([&, k, i] { size_t c = chunk / 4; memcpy(touched.data() + i * chunk + k * c, pinned + (i % 2) * chunk + k * c, c); });
            for (auto& t : ts) t.join();
        }
        cudaStreamSynchronize(s); cudaStreamDestroy(s);
    });
    return 0;
}
