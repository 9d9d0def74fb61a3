#include "paged_pool.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace hstu {

namespace {

constexpr int64_t kGrowthFactor = 2;  // a pool that must grow takes this many times its pages

int64_t host_memory_bytes() { return int64_t(sysconf(_SC_PAGE_SIZE)) * int64_t(sysconf(_SC_PHYS_PAGES)); }

std::string gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", double(bytes) / double(int64_t(1) << 30));
  return text;
}

}  // namespace

PagedPool::PagedPool(const PoolShape& shape, const HostTierShape& host, at::ScalarType dtype, at::Device device)
    : shape_(shape), ledger_(shape.budget_tokens, shape.page_tokens) {
  if (shape.budget_tokens < 0) {
    throw LimitError("KV-cache budget of " + std::to_string(shape.budget_tokens) + " tokens; must be at least 0");
  }
  num_pages_ = ledger_.budget_pages() + shape.request_pages;
  pool_k = pool_v = at::empty({shape.layers, 0, shape.heads, shape.head_dim}, at::TensorOptions(dtype).device(device));
  const int64_t full = page_bytes() * num_pages_;
  if (device.is_cpu() && full > host_memory_bytes()) {
    throw LimitError("the KV pool (" + std::to_string(shape.budget_tokens) + " tokens + one request: " + gib(full) +
                     ") does not fit in this machine's memory (" + gib(host_memory_bytes()) +
                     "); lower --cache-budget-tokens");
  }
  grow(shape.reserve ? num_pages_ : std::min(num_pages_, shape.request_pages));
  if (host.budget_tokens != 0) {
    host_ = std::make_unique<HostTier>(host, shape.page_tokens, page_bytes() / shape.page_tokens, device);
  }
}

void PagedPool::check_request(const std::vector<std::pair<int64_t, int64_t>>& request) const {
  ledger_.check(request);
  if (host_) host_->check(request);
}

int64_t PagedPool::page_bytes() const {
  return 2 * shape_.page_tokens * shape_.layers * shape_.heads * shape_.head_dim * int64_t(pool_k.element_size());
}

void PagedPool::grow(int64_t to_pages) {
  const int64_t old = allocated_pages();
  at::Tensor grown[2];
  try {
    for (auto& t : grown) t = at::empty({shape_.layers, to_pages * shape_.page_tokens, shape_.heads, shape_.head_dim},
                                        pool_k.options());
  } catch (const c10::Error& error) {
    throw LimitError("the KV pool cannot grow to " + gib(to_pages * page_bytes()) +
                     "; lower --cache-budget-tokens (" + std::string(error.what_without_backtrace()).substr(0, 200) +
                     ")");
  }
  grown[0].narrow(1, 0, pool_k.size(1)).copy_(pool_k);
  grown[1].narrow(1, 0, pool_v.size(1)).copy_(pool_v);
  pool_k = grown[0];
  pool_v = grown[1];
  ++generation_;
  std::vector<int64_t> fresh;  // under the free ones: used after them
  for (int64_t page = to_pages - 1; page >= old; --page) fresh.push_back(page);
  free_.insert(free_.begin(), fresh.begin(), fresh.end());
}

void PagedPool::reserve(int64_t needed) {
  if (needed > int64_t(free_.size())) {
    const int64_t shortfall = needed - int64_t(free_.size());
    grow(std::min(num_pages_, std::max(allocated_pages() * kGrowthFactor, allocated_pages() + shortfall)));
  }
}

std::vector<UserPages> PagedPool::begin(const std::vector<std::pair<int64_t, int64_t>>& request) {
  const LedgerOutcome outcome = ledger_.serve(request);
  for (int64_t key : outcome.evicted) release(key);
  const std::vector<int64_t> host = host_ ? host_->lookup(request) : std::vector<int64_t>(request.size(), 0);
  std::vector<int64_t> hits;  // both tiers merged: no gap, both start at token 0
  for (size_t i = 0; i < request.size(); ++i) hits.push_back(std::max(outcome.hits[i], host[i]));
  counters_.evicted_users += int64_t(outcome.evicted.size());
  counters_.requests += 1;
  for (size_t i = 0; i < request.size(); ++i) {
    counters_.hit_tokens += hits[i];
    counters_.computed_tokens += request[i].second - hits[i];
  }
  int64_t needed = 0;
  for (const auto& [key, total] : request) {
    auto owned = pages_.find(key);
    needed += pages_of(total, shape_.page_tokens) - (owned == pages_.end() ? 0 : int64_t(owned->second.size()));
  }
  try {
    reserve(needed);
  } catch (const LimitError&) {
    for (const auto& entry : request) forget(entry.first);
    throw;
  }
  std::vector<UserPages> users;
  for (size_t i = 0; i < request.size(); ++i) {
    const auto& [key, total] = request[i];
    auto& owned = pages_[key];
    while (int64_t(owned.size()) < pages_of(total, shape_.page_tokens)) {
      owned.push_back(free_.back());
      free_.pop_back();
    }
    // where the host holds more than the pool, its whole sequence is onboarded
    users.push_back({key, hits[i], total, host[i] > outcome.hits[i] ? host[i] : 0, &owned});
    if (users.back().onboarded) onboard(users.back());
  }
  return users;
}

at::Tensor PagedPool::slots(const std::vector<int64_t>& pages, int64_t start, int64_t end) const {
  at::Tensor slots = at::empty({end - start}, at::kLong);
  int64_t* out = slots.data_ptr<int64_t>();
  for (int64_t p = start; p < end; ++p) {
    out[p - start] = pages[p / shape_.page_tokens] * shape_.page_tokens + p % shape_.page_tokens;
  }
  return slots.to(pool_k.device());
}

void PagedPool::onboard(const UserPages& user) {
  host_->onboard(user.key, user.onboarded, [&](int64_t start, const HostTier::KV& part) {
    const at::Tensor at = slots(*user.pages, start, start + part.first.size(1));
    for (auto [pool, data] : {std::pair(&pool_k, &part.first), std::pair(&pool_v, &part.second)}) {
      // through [layers, slots, heads * head_dim] views, as the Python pool writes them
      pool->view({pool->size(0), pool->size(1), -1})
          .index_copy_(1, at, data->to(pool->device()).reshape({data->size(0), data->size(1), -1}));
    }
  });
}

void PagedPool::offload(const std::vector<UserPages>& users) {
  if (!host_) return;
  HostTier::Request request;
  for (const auto& user : users) request.emplace_back(user.key, user.total);
  host_->offload(request, [&](size_t u, int64_t start, int64_t end) {
    const at::Tensor at = slots(*users[u].pages, start, end);
    return HostTier::KV{pool_k.index_select(1, at), pool_v.index_select(1, at)};
  });
}

void PagedPool::finish(const std::vector<std::pair<int64_t, int64_t>>& request) {
  for (const auto& entry : request) {
    if (ledger_.held(entry.first) == 0) release(entry.first);
  }
}

void PagedPool::forget(int64_t key) {
  ledger_.forget(key);
  release(key);
  if (host_) host_->forget(key);
}

void PagedPool::clear() {
  ledger_.clear();
  std::vector<int64_t> keys;
  for (const auto& entry : pages_) keys.push_back(entry.first);
  for (int64_t key : keys) release(key);
  counters_ = Counters();
  if (host_) host_->clear();
}

void PagedPool::release(int64_t key) {
  auto owned = pages_.find(key);
  if (owned == pages_.end()) return;
  free_.insert(free_.end(), owned->second.rbegin(), owned->second.rend());
  pages_.erase(owned);
}

at::Tensor PagedPool::page_table(const std::vector<UserPages>& users) const {
  size_t widest = 1;
  for (const auto& user : users) widest = std::max(widest, user.pages->size());
  at::Tensor table = at::zeros({int64_t(users.size()), int64_t(widest)}, at::kLong);
  int64_t* rows = table.data_ptr<int64_t>();
  for (size_t u = 0; u < users.size(); ++u) {
    std::copy(users[u].pages->begin(), users[u].pages->end(), rows + u * widest);
  }
  return table;
}

std::map<std::string, int64_t> PagedPool::stats() const {
  std::map<std::string, int64_t> stats{
      {"HIT_TOKENS", counters_.hit_tokens},
      {"COMPUTED_TOKENS", counters_.computed_tokens},
      {"EVICTED_USERS", counters_.evicted_users},
      {"RESIDENT_TOKENS", ledger_.resident_tokens()},
      {"REQUESTS", counters_.requests},
      {"GPU_BUDGET_TOKENS", ledger_.budget_pages() * shape_.page_tokens},
      {"RESIDENT_BYTES", allocated_pages() * page_bytes()},
      {"BUDGET_BYTES", num_pages_ * page_bytes()},
  };
  if (host_) host_->add_stats(stats);  // no host tier: its figures are 0
  return stats;
}

}  // namespace hstu
