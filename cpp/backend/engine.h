// The batched engine in C++: every user of a request in one call of the batched-step AOTInductor
// package (hstu_replay/server/batched_step.py) over the paged pool, as
// hstu_replay/server/batched.py's eager path lays the inputs out.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "jagged_request.h"
#include "paged_pool.h"
#include "phases.h"

namespace torch::inductor {
class AOTIModelPackageLoader;
}

namespace hstu {

struct ModelShape {
  int64_t layers, heads, head_dim;
  Limits limits;
  at::ScalarType dtype;
};

struct Answer {
  at::Tensor logits;              // float32 [candidates, 8], on the CPU
  std::vector<int64_t> cached;    // tokens reused, per user (both tiers)
  std::vector<int64_t> onboarded; // of them, tokens onboarded from the host tier, per user
};

class StepGraphs;

class Engine {
 public:
  // `label`: the model's name, in its phase lines; `host.budget_tokens` 0: no host tier;
  // `reserve_pool`: the KV pool's whole budget taken at start.
  Engine(const std::string& package, const ModelShape& shape, int64_t budget_tokens, int64_t page_tokens,
         bool reserve_pool, const HostTierShape& host, const std::string& label);
  ~Engine();

  Answer infer(const std::vector<UserView>& users);
  void clear();
  std::map<std::string, int64_t> stats();
  const Limits& limits() const { return shape_.limits; }

  PhaseClock clock;  // the model's calls, phase by phase (the backend times its own parts on it too)

 private:
  at::Tensor forward(const std::vector<UserView>& users, const std::vector<UserPages>& placed);

  ModelShape shape_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  at::Device device_;
  std::unique_ptr<PagedPool> pool_;
  std::unique_ptr<StepGraphs> graphs_;  // none: every step runs its kernels one by one
  std::mutex lock_;
};

}  // namespace hstu
