#include "step_graphs.h"

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#ifdef HSTU_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace hstu {

namespace {

constexpr const char* kGraphsEnv = "HSTU_REPLAY_CUDA_GRAPHS";

int64_t bucket(int64_t n, int64_t minimum) {  // the next power of two, at least `minimum`
  int64_t size = 1;
  while (size < n) size *= 2;
  return std::max(size, minimum);
}

}  // namespace

bool graphs_enabled(const at::Device& device) {
#ifdef HSTU_WITH_CUDA
  const char* value = std::getenv(kGraphsEnv);
  return device.is_cuda() && value != nullptr && std::strcmp(value, "1") == 0;
#else
  (void)device;
  return false;
#endif
}

StepLayout StepGraphs::layout(int64_t candidates, int64_t capacity) const {
  return {bucket(candidates, kMinCandidates), 0, rows_, pages_, bucket(capacity, kMinItems)};
}

#ifdef HSTU_WITH_CUDA

struct StepGraphs::Graph {
  at::cuda::CUDAGraph graph;
  at::Tensor packed;  // the graph's device input
  at::Tensor logits;  // its output
};

StepGraphs::StepGraphs(torch::inductor::AOTIModelPackageLoader& loader, at::Device device, int64_t rows, int64_t pages)
    : loader_(loader), device_(device), rows_(rows), pages_(pages) {}

StepGraphs::~StepGraphs() = default;

at::Tensor StepGraphs::run(const StepLayout& layout, const at::Tensor& host, const at::Tensor& pool_k,
                           const at::Tensor& pool_v, int64_t pool_generation) {
  if (pool_generation != generation_) {
    graphs_.clear();
    recent_.clear();
    generation_ = pool_generation;
  }
  Graph& graph = find_or_capture(layout, host, pool_k, pool_v);
  graph.packed.copy_(host, /*non_blocking=*/true);
  graph.graph.replay();
  return graph.logits;
}

StepGraphs::Graph& StepGraphs::find_or_capture(const StepLayout& layout, const at::Tensor& host,
                                               const at::Tensor& pool_k, const at::Tensor& pool_v) {
  const Shape shape{layout.tokens, layout.items};
  const auto found = graphs_.find(shape);
  if (found != graphs_.end()) {
    recent_.remove(shape);
    recent_.push_front(shape);
    return *found->second;
  }
  auto entry = std::make_unique<Graph>();
  entry->packed = host.to(device_);
  std::vector<at::Tensor> inputs = layout.inputs(entry->packed);
  inputs.push_back(pool_k);
  inputs.push_back(pool_v);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_.index());
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device_.index());
  C10_CUDA_CHECK(cudaStreamSynchronize(current.stream()));  // the input is there; captures are rare
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    loader_.run(inputs);  // loads the kernels and settles the allocator outside the capture
    C10_CUDA_CHECK(cudaStreamSynchronize(side.stream()));
    entry->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      entry->logits = loader_.run(inputs).at(0);
    } catch (...) {
      try {
        entry->graph.capture_end();  // ends the capture on the side stream, whatever it holds
      } catch (...) {
      }
      throw;
    }
    entry->graph.capture_end();
  }
  recent_.push_front(shape);
  Graph& kept = *(graphs_[shape] = std::move(entry));
  while (recent_.size() > kGraphsKept) {
    graphs_.erase(recent_.back());
    recent_.pop_back();
  }
  return kept;
}

#else  // a build without CUDA: graphs_enabled() is false, so none is ever made

struct StepGraphs::Graph {};

StepGraphs::StepGraphs(torch::inductor::AOTIModelPackageLoader& loader, at::Device device, int64_t rows, int64_t pages)
    : loader_(loader), device_(device), rows_(rows), pages_(pages) {
  throw std::logic_error("CUDA graphs need a build of the backend with CUDA");
}

StepGraphs::~StepGraphs() = default;

at::Tensor StepGraphs::run(const StepLayout&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t) {
  throw std::logic_error("CUDA graphs need a build of the backend with CUDA");
}

#endif

}  // namespace hstu
