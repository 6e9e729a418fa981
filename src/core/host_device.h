// SLUICE_HOST_DEVICE: a function of a plain C++ header that CUDA device code calls too
// (__host__ __device__ under nvcc, nothing elsewhere).
#pragma once

#if defined(__CUDACC__)
#define SLUICE_HOST_DEVICE __host__ __device__
#else
#define SLUICE_HOST_DEVICE
#endif
