// WType: how the CUDA kernels spell the weight type they read, one code per DType a kernel
// can read (the codes of the quantized kinds leave room for more float types), plus
// `unavailable` for an expert table entry whose expert is not in device memory. Host code
// names types by DType (core/dtype.h) and converts once, through wtype_of. Plain C++, so
// launchers (.cpp) and kernels (.cu) share it.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace sluice::cuda {

enum class WType : int32_t {
  unavailable = -1,  // expert tables only: the expert's pairs are skipped (a later phase, or a cut)
  f32 = 0,
  f16 = 1,
  bf16 = 2,
  q8 = 10,  // core/quant.h layouts
  q4 = 11,
  q2 = 12,
  mxfp4 = 13,  // e2m1 codes two a byte, groups of 32 with one e8m0 scale byte (core/quant.h);
               // the generic matvec and tiled kernels and the MoE expert kernels (matmul_wtype_of)
};

// The code of a weight of dtype t for a kernel of `op` (named in the error): any type the
// matrix kernels read (f32, f16, bf16, q8, q4, q2), else Error(unsupported).
WType wtype_of(DType t, const char* op);
// The code for the generic matrix products (launch_matvec, launch_matmul_tiled) and the MoE
// expert kernels (expert tables): wtype_of's, plus mxfp4 (CudaOps.MatmulMxfp4 and
// CudaMoe.BiasedClampedExpertsEveryKernel check those kernels' mxfp4 paths against the CPU).
WType matmul_wtype_of(DType t, const char* op);
// The same for kernels that read float weights only (norms, biases, embedding rows).
WType float_wtype_of(DType t, const char* op);

}  // namespace sluice::cuda
