// bench_cuda --read-wave (read_wave.cu): one launch reading a decode MoE layer's gate/up bytes
// cold in L2, in the gate/up kernel's shape, by loads, cp.async and bulk copies.
#pragma once

namespace sluice::bench {

// Prints the table; copy_bw: the device's measured copy bandwidth (bytes / s). Returns 0.
int run_read_wave(double copy_bw);

}  // namespace sluice::bench
