// bench/gpu/tenant.cu: a saturating (or bursty) GPU tenant for the real-GPU isolation check.
//
// It launches a kernel that spins for --kernel-us microseconds of GPU clock, waits for it
// (cudaEventSynchronize), and adds the kernel's own GPU time (cudaEventElapsedTime) to its
// busy total, for --seconds. The events are timestamps taken by the GPU, so the busy total is
// what the GPU ran for this process, not what the hook or the arbiter believe. It goes through
// cudart, which reaches the driver by dlopen + cuGetProcAddress: the path the hook must catch.
//
// Prints one JSON line: pid, kernels, busy_ms, wall_ms, first_error.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <unistd.h>
#include <thread>

__global__ void spin(long long cycles)
{
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

int main(int argc, char **argv)
{
    double seconds = 5, kernel_us = 500, on_ms = 0, off_ms = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--kernel-us")) kernel_us = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--burst-on-ms")) on_ms = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--burst-off-ms")) off_ms = atof(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 64; }
    }
    int clock_khz = 0;
    cudaError_t err = cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
    if (err != cudaSuccess) { fprintf(stderr, "tenant: %s\n", cudaGetErrorString(err)); return 1; }
    long long cycles = (long long)(kernel_us * clock_khz / 1000.0);
    cudaEvent_t begin, end;
    cudaEventCreate(&begin);
    cudaEventCreate(&end);
    spin<<<1, 1>>>(1);  // warm up: module load, context
    cudaDeviceSynchronize();
    double busy_ms = 0;
    long kernels = 0;
    int first_error = 0;
    auto start = std::chrono::steady_clock::now();
    auto elapsed_ms = [&] {
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    };
    while (elapsed_ms() < seconds * 1000) {
        if (on_ms > 0 && std::fmod(elapsed_ms(), on_ms + off_ms) >= on_ms) {
            std::this_thread::sleep_for(std::chrono::microseconds(500));
            continue;
        }
        cudaEventRecord(begin);
        spin<<<108, 128>>>(cycles);
        err = cudaGetLastError();
        if (err != cudaSuccess) { first_error = (int)err; break; }
        cudaEventRecord(end);
        cudaEventSynchronize(end);
        float ms = 0;
        cudaEventElapsedTime(&ms, begin, end);
        busy_ms += ms;
        kernels++;
    }
    printf("{\"pid\": %d, \"kernels\": %ld, \"busy_ms\": %.3f, \"wall_ms\": %.3f, \"first_error\": %d}\n",
           (int)getpid(), kernels, busy_ms, elapsed_ms(), first_error);
    return first_error ? 2 : 0;
}
