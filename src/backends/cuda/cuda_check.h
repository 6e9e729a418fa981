// CUDA_CHECK(call): throws sluice::Error naming the failed CUDA runtime call, its error
// string, and the file and line. For host code and kernels' launchers alike.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

#define CUDA_CHECK(call)                                                                          \
  do {                                                                                            \
    cudaError_t err_ = (call);                                                                    \
    if (err_ != cudaSuccess)                                                                      \
      ::sluice::fail(::sluice::Status::internal, "CUDA error ", cudaGetErrorString(err_), " in ", \
                     #call, " at ", __FILE__, ":", __LINE__);                                     \
  } while (0)
