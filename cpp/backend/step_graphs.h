// CUDA graphs of the fully cached step, which is bound by kernel launches, not by the GPU (as
// hstu_replay/server/step_graphs.py does it for the Python engine): a fully cached request
// computes only its candidates, some 45 small kernels whose launches cost more host time than
// the GPU spends on them; replayed as one graph they are launched at once.
//
// A graph has fixed shapes, so a step is padded to a `StepLayout`: the candidates to the next
// power of two (at least kMinCandidates), the work items to the next power of two of the most
// its blocks can be split into (WorkPlan::capacity, so that users of other lengths share the
// graph), the page table to the largest request's. Graphs are kept in a small LRU by shape and
// dropped when the pool is reallocated (they hold its addresses); a capture the device refuses
// turns them off for the engine (one line on stderr).
//
// Off unless HSTU_REPLAY_CUDA_GRAPHS=1 (the Python engines' are on unless it is 0): here they do
// not pay. In steady state on the H200 a fully cached call took about as long replayed as launched
// (the padded graph keeps the GPU busy longer), and every capture, on a new shape or after the pool
// grew, costs its call milliseconds (docs/benchmarks/reference-server-gpu.md, calls 15-16 and 21).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <utility>

#include "step_layout.h"

namespace torch::inductor {
class AOTIModelPackageLoader;
}

namespace hstu {

constexpr int64_t kMinCandidates = 16;  // smallest padded candidate count (step_graphs.MIN_CANDIDATES)
constexpr int64_t kMinItems = 16;       // smallest padded work-item count (step_graphs.MIN_ITEMS)
constexpr size_t kGraphsKept = 8;       // (step_graphs.CAPACITY)

// Whether graphs run here: a build with CUDA, a package on a GPU, and not turned off.
bool graphs_enabled(const at::Device& device);

class StepGraphs {
 public:
  // `rows` x `pages`: the page table of the largest request (max batch x a full history's pages).
  StepGraphs(torch::inductor::AOTIModelPackageLoader& loader, at::Device device, int64_t rows, int64_t pages);
  ~StepGraphs();

  // The padded layout of a fully cached step of `candidates` tokens and a plan of `capacity` items.
  StepLayout layout(int64_t candidates, int64_t capacity) const;
  // Replays (capturing it first where new) the graph of `layout`, its inputs packed in `host`
  // (pinned); the logits [layout.tokens, 8] float32 on the device, valid until the next call.
  at::Tensor run(const StepLayout& layout, const at::Tensor& host, const at::Tensor& pool_k, const at::Tensor& pool_v,
                 int64_t pool_generation);

 private:
  struct Graph;
  using Shape = std::pair<int64_t, int64_t>;  // (padded candidates, padded items)
  Graph& find_or_capture(const StepLayout& layout, const at::Tensor& host, const at::Tensor& pool_k,
                         const at::Tensor& pool_v);

  torch::inductor::AOTIModelPackageLoader& loader_;
  at::Device device_;
  int64_t rows_, pages_;
  int64_t generation_ = -1;
  std::list<Shape> recent_;  // most recently used first
  std::map<Shape, std::unique_ptr<Graph>> graphs_;
};

}  // namespace hstu
