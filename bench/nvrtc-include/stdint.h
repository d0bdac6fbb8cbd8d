// NVRTC ships no C library headers, and kernels/attention/common.cuh includes <stdint.h>. This
// stand-in gives the fixed-width integer types from CCCL's <cuda/std/cstdint>, which CuPy puts on
// NVRTC's include path. Used only by bench/kernel_tuner_attention.py (flashtune builds with nvcc).
#pragma once
#include <cuda/std/cstdint>
using cuda::std::int8_t;
using cuda::std::int16_t;
using cuda::std::int32_t;
using cuda::std::int64_t;
using cuda::std::uint8_t;
using cuda::std::uint16_t;
using cuda::std::uint32_t;
using cuda::std::uint64_t;
using cuda::std::intptr_t;
using cuda::std::uintptr_t;
