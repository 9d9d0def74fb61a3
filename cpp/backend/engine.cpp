#include "engine.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <cstdio>

#include "step_graphs.h"
#include "step_layout.h"
#include "work_plan.h"

namespace hstu {

namespace {

at::Device package_device(torch::inductor::AOTIModelPackageLoader& loader) {
  const auto metadata = loader.get_metadata();
  const auto found = metadata.find("AOTI_DEVICE_KEY");
  return at::Device(found == metadata.end() || found->second.empty() ? std::string("cpu") : found->second);
}

// A host buffer for `length` packed indices: pinned where they go to a GPU (one asynchronous copy).
at::Tensor host_buffer(int64_t length, const at::Device& device) {
  return at::empty({length}, at::TensorOptions(at::kLong).pinned_memory(device.is_cuda()));
}

}  // namespace

Engine::Engine(const std::string& package, const ModelShape& shape, int64_t budget_tokens, int64_t page_tokens,
               bool reserve_pool, const HostTierShape& host, const std::string& label)
    : clock(label),
      shape_(shape),
      // single-threaded: calls are serialised by lock_, and the runner then records no CUDA event
      // per call (an event query inside a capture is what a device refuses)
      loader_(std::make_unique<torch::inductor::AOTIModelPackageLoader>(package, "model", true, 1, -1)),
      device_(package_device(*loader_)) {
  const int64_t table_pages = pages_of(kContextTokens + 2 * shape.limits.max_history, page_tokens);
  pool_ = std::make_unique<PagedPool>(
      PoolShape{shape.layers, shape.heads, shape.head_dim, page_tokens, budget_tokens,
                shape.limits.max_batch * table_pages, reserve_pool},
      host, shape.dtype, device_);
  if (graphs_enabled(device_)) {
    graphs_ = std::make_unique<StepGraphs>(*loader_, device_, shape.limits.max_batch, table_pages);
  }
}

Engine::~Engine() = default;

Answer Engine::infer(const std::vector<UserView>& users) {
  std::vector<std::pair<int64_t, int64_t>> request;
  for (const auto& user : users) request.emplace_back(user.key, user.total());
  std::lock_guard<std::mutex> hold(lock_);
  std::vector<UserPages> placed;
  {
    const auto timed = clock.phase("engine.cache");
    pool_->check_request(request);
    placed = pool_->begin(request);
  }
  Answer answer;
  try {
    answer.logits = forward(users, placed);
    const auto timed = clock.phase("engine.offload");
    pool_->offload(placed);
  } catch (...) {
    for (const auto& entry : request) pool_->forget(entry.first);  // the ledger counts them as held: undo
    pool_->finish(request);
    throw;
  }
  pool_->finish(request);
  for (const auto& user : placed) {
    answer.cached.push_back(user.hit);
    answer.onboarded.push_back(user.onboarded);
  }
  return answer;
}

at::Tensor Engine::forward(const std::vector<UserView>& users, const std::vector<UserPages>& placed) {
  std::vector<int64_t> past, n_hist, n_cand;
  int64_t hist_tokens = 0, cand_tokens = 0;
  WorkPlan plan;
  at::Tensor table;
  {
    const auto timed = clock.phase("engine.plan");
    for (size_t u = 0; u < users.size(); ++u) {
      past.push_back(placed[u].hit);
      n_hist.push_back(placed[u].total - placed[u].hit);
      n_cand.push_back(users[u].candidates);
      hist_tokens += n_hist.back();
      cand_tokens += n_cand.back();
    }
    plan = plan_work(past, n_hist, n_cand, shape_.heads);
    table = pool_->page_table(placed);
  }
  c10::InferenceMode inference;
  if (graphs_ && hist_tokens == 0) {  // fully cached: one graph launch
    try {
      const StepLayout layout = graphs_->layout(cand_tokens, plan.capacity);
      at::Tensor host = host_buffer(layout.length(), device_);
      layout.pack(users, placed, table, plan.items, pool_->page_tokens(), host.data_ptr<int64_t>());
      at::Tensor logits;
      {
        const auto timed = clock.phase("engine.graph");
        logits = graphs_->run(layout, host, pool_->pool_k, pool_->pool_v, pool_->generation());
      }
      const auto timed = clock.phase("engine.wait");
      return logits.narrow(0, 0, cand_tokens).to(at::kCPU, at::kFloat).contiguous();
    } catch (const std::exception& error) {  // a capture the device refused: every step runs its kernels from now on
      std::fprintf(stderr, "hstu-replay: CUDA graphs off: %s\n",
                   std::string(error.what()).substr(0, std::string(error.what()).find('\n')).c_str());
      graphs_.reset();
    }
  }
  const int64_t tokens = hist_tokens + cand_tokens;
  const StepLayout layout{std::max<int64_t>(tokens, 2), hist_tokens, table.size(0), table.size(1),
                          int64_t(plan.items.size())};
  at::Tensor on_device;
  std::vector<at::Tensor> outputs;
  {
    const auto timed = clock.phase("engine.step");
    at::Tensor host = host_buffer(layout.length(), device_);
    layout.pack(users, placed, table, plan.items, pool_->page_tokens(), host.data_ptr<int64_t>());
    on_device = host.to(device_, /*non_blocking=*/true);
    std::vector<at::Tensor> inputs = layout.inputs(on_device);
    inputs.push_back(pool_->pool_k);
    inputs.push_back(pool_->pool_v);
    outputs = loader_->run(inputs);
  }
  const auto timed = clock.phase("engine.wait");
  return outputs.at(0).narrow(0, 0, cand_tokens).to(at::kCPU, at::kFloat).contiguous();
}

void Engine::clear() {
  std::lock_guard<std::mutex> hold(lock_);
  pool_->clear();
}

std::map<std::string, int64_t> Engine::stats() {
  std::lock_guard<std::mutex> hold(lock_);
  return pool_->stats();
}

}  // namespace hstu
