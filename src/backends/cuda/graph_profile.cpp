// A developer's profile of a captured CUDA graph (SLUICE_CUDA_PROFILE=1): the GPU machine has
// no Nsight, so each kernel node of the graph is launched on its own, `reps` times between two
// events, and the times are summed per kernel function. Their total against one replay of the
// whole graph shows what the kernels cost and what the gaps between them cost.
#include "backends/cuda/graph_profile.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.h"

namespace sluice::cuda {
namespace {

// "void sluice::cuda::(anonymous namespace)::matvec_kernel<(sluice::cuda::DotType)2, 1, 4, 1>(...)"
// -> "matvec_kernel<(DotType)2, 1, 4, 1>": the kernel's name and template arguments.
std::string short_name(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  for (const char* ns : {"(anonymous namespace)::", "sluice::cuda::", "sluice::"})
    for (size_t p; (p = s.find(ns)) != std::string::npos;) s.erase(p, std::string(ns).size());
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  int depth = 0;  // cut at the parameter list: the first '(' outside template arguments
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    else if (s[i] == '>') --depth;
    else if (s[i] == '(' && depth == 0 && i > 0) return s.substr(0, i);
  }
  return s;
}

float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

}  // namespace

void profile_graph(cudaGraph_t graph, cudaGraphExec_t exec, cudaStream_t stream, int reps) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  struct Row {
    int count = 0;
    double us = 0;
  };
  std::map<std::string, Row> by_kernel;
  std::map<std::string, int> other;
  double kernel_us = 0;
  int kernel_nodes = 0;
  const int list_first = 24;  // the first kernels one by one (a layer and a half of a decoder)
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeKernel) {
      ++other[type == cudaGraphNodeTypeMemcpy ? "memcpy" : type == cudaGraphNodeTypeMemset ? "memset" : "other"];
      continue;
    }
    cudaKernelNodeParams p{};
    CUDA_CHECK(cudaGraphKernelNodeGetParams(node, &p));
    const char* name = nullptr;
    if (cudaFuncGetName(&name, p.func) != cudaSuccess || !name) name = "?";
    CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int r = 0; r < reps; ++r)
      CUDA_CHECK(cudaLaunchKernel(p.func, p.gridDim, p.blockDim, p.kernelParams, p.sharedMemBytes, stream));
    CUDA_CHECK(cudaEventRecord(e1, stream));
    CUDA_CHECK(cudaEventSynchronize(e1));
    const double us = 1e3 * elapsed_ms(e0, e1) / reps;
    const std::string kernel = short_name(name);
    if (kernel_nodes++ < list_first)
      std::fprintf(stderr, "profile: node %d %s grid %u x %u block %u: %.2f us\n", kernel_nodes - 1, kernel.c_str(),
                   p.gridDim.x, p.gridDim.y, p.blockDim.x, us);
    Row& row = by_kernel[kernel];
    ++row.count;
    row.us += us;
    kernel_us += us;
  }
  // One replay of the whole graph (it rewrites what the kernels above rewrote).
  CUDA_CHECK(cudaGraphLaunch(exec, stream));
  CUDA_CHECK(cudaEventRecord(e0, stream));
  for (int r = 0; r < reps; ++r) CUDA_CHECK(cudaGraphLaunch(exec, stream));
  CUDA_CHECK(cudaEventRecord(e1, stream));
  CUDA_CHECK(cudaEventSynchronize(e1));
  const double graph_us = 1e3 * elapsed_ms(e0, e1) / reps;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);

  std::vector<std::pair<std::string, Row>> rows(by_kernel.begin(), by_kernel.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
  std::fprintf(stderr, "\n| kernel (graph of %zu nodes) | launches | us alone | us each | share |\n|---|---|---|---|---|\n",
               n);
  for (const auto& [name, row] : rows)
    std::fprintf(stderr, "| %s | %d | %.1f | %.2f | %.1f%% |\n", name.c_str(), row.count, row.us, row.us / row.count,
                 100.0 * row.us / graph_us);
  for (const auto& [kind, count] : other) std::fprintf(stderr, "| (%s nodes) | %d | - | - | - |\n", kind.c_str(), count);
  std::fprintf(stderr,
               "| kernels alone, summed | %d | %.1f | | %.1f%% |\n| graph replay | 1 | %.1f | | 100%% |\n"
               "| gaps (replay - kernels) | | %.1f | | %.1f%% |\n\n",
               static_cast<int>(n), kernel_us, 100.0 * kernel_us / graph_us, graph_us, graph_us - kernel_us,
               100.0 * (graph_us - kernel_us) / graph_us);
}

}  // namespace sluice::cuda
