#include "engine.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include "work_plan.h"

namespace hstu {

namespace {

constexpr int64_t kItemKind = kContextTokens;  // token kinds: 0 user id, 1..5 context, 6 item, 7 action

int64_t history_kind(int64_t position) {
  return position < kContextTokens ? position : kItemKind + (position - kContextTokens) % 2;
}

at::Device package_device(torch::inductor::AOTIModelPackageLoader& loader) {
  const auto metadata = loader.get_metadata();
  const auto found = metadata.find("AOTI_DEVICE_KEY");
  return at::Device(found == metadata.end() || found->second.empty() ? std::string("cpu") : found->second);
}

}  // namespace

Engine::Engine(const std::string& package, const ModelShape& shape, int64_t budget_tokens, int64_t page_tokens)
    : shape_(shape),
      loader_(std::make_unique<torch::inductor::AOTIModelPackageLoader>(package, "model", false, 1, -1)),
      device_(package_device(*loader_)) {
  const int64_t request_pages = shape.limits.max_batch * pages_of(kContextTokens + 2 * shape.limits.max_history,
                                                                   page_tokens);
  pool_ = std::make_unique<PagedPool>(
      PoolShape{shape.layers, shape.heads, shape.head_dim, page_tokens, budget_tokens, request_pages}, shape.dtype,
      device_);
}

Engine::~Engine() = default;

Answer Engine::infer(const std::vector<UserView>& users) {
  std::vector<std::pair<int64_t, int64_t>> request;
  for (const auto& user : users) request.emplace_back(user.key, user.total());
  std::lock_guard<std::mutex> hold(lock_);
  pool_->check_request(request);
  const std::vector<UserPages> placed = pool_->begin(request);
  Answer answer;
  try {
    answer.logits = forward(users, placed);
  } catch (...) {
    for (const auto& entry : request) pool_->forget(entry.first);  // the ledger counts them as held: undo
    pool_->finish(request);
    throw;
  }
  pool_->finish(request);
  for (const auto& user : placed) answer.cached.push_back(user.hit);
  return answer;
}

at::Tensor Engine::forward(const std::vector<UserView>& users, const std::vector<UserPages>& placed) {
  const int64_t page = pool_->page_tokens();
  std::vector<int64_t> past, n_hist, n_cand;
  int64_t hist_tokens = 0, cand_tokens = 0;
  for (size_t u = 0; u < users.size(); ++u) {
    past.push_back(placed[u].hit);
    n_hist.push_back(placed[u].total - placed[u].hit);
    n_cand.push_back(users[u].candidates);
    hist_tokens += n_hist.back();
    cand_tokens += n_cand.back();
  }
  const std::vector<WorkItem> items = plan_work(past, n_hist, n_cand, shape_.heads);
  const at::Tensor table = pool_->page_table(placed);
  const int64_t width = table.size(1);
  const int64_t* rows = table.data_ptr<int64_t>();
  // Every index the forward needs in one host buffer (pinned for a GPU), copied to the device at once:
  // ids, kinds, positions, slots, page table, work items; each part starts 16 bytes aligned, as the
  // package was compiled to expect.
  const int64_t tokens = hist_tokens + cand_tokens;
  const int64_t padded = std::max<int64_t>(tokens, 2);  // one token alone: pad a row no work item reads
  const auto aligned = [](int64_t n) { return (n + 1) / 2 * 2; };
  const int64_t sizes[] = {padded, padded, padded, hist_tokens, int64_t(table.numel()),
                           int64_t(items.size()) * kItemFields};
  int64_t offsets[7] = {0};
  for (int part = 0; part < 6; ++part) offsets[part + 1] = offsets[part] + aligned(sizes[part]);
  at::Tensor packed = at::empty({offsets[6]}, at::TensorOptions(at::kLong).pinned_memory(device_.is_cuda()));
  int64_t* base = packed.data_ptr<int64_t>();
  int64_t* ids = base + offsets[0];
  int64_t* kinds = base + offsets[1];
  int64_t* positions = base + offsets[2];
  int64_t* slots = base + offsets[3];
  int64_t at_token = 0;
  for (size_t u = 0; u < users.size(); ++u) {
    for (int64_t p = placed[u].hit; p < placed[u].total; ++p, ++at_token) {
      ids[at_token] = users[u].history_id(p);
      kinds[at_token] = history_kind(p);
      positions[at_token] = p;
      slots[at_token] = rows[u * width + p / page] * page + p % page;
    }
  }
  for (size_t u = 0; u < users.size(); ++u) {
    for (int64_t c = 0; c < users[u].candidates; ++c, ++at_token) {
      ids[at_token] = users[u].items[users[u].history + c];
      kinds[at_token] = kItemKind;
      positions[at_token] = placed[u].total;
    }
  }
  for (; at_token < padded; ++at_token) {
    ids[at_token] = ids[0];
    kinds[at_token] = kinds[0];
    positions[at_token] = positions[0];
  }
  std::copy(rows, rows + table.numel(), base + offsets[4]);
  std::copy(items.begin(), items.end(), reinterpret_cast<WorkItem*>(base + offsets[5]));
  c10::InferenceMode inference;
  const at::Tensor on_device = packed.to(device_, /*non_blocking=*/true);
  const auto part = [&](int index) { return on_device.narrow(0, offsets[index], sizes[index]); };
  std::vector<at::Tensor> inputs = {part(0), part(1), part(2), part(4).view({table.size(0), width}),
                                    part(5).view({int64_t(items.size()), kItemFields}), part(3),
                                    pool_->pool_k, pool_->pool_v};
  std::vector<at::Tensor> outputs = loader_->run(inputs);
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
