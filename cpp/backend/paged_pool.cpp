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

PagedPool::PagedPool(const PoolShape& shape, at::ScalarType dtype, at::Device device)
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
  grow(std::min(num_pages_, shape.request_pages));
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
  counters_.evicted_users += int64_t(outcome.evicted.size());
  counters_.requests += 1;
  for (size_t i = 0; i < request.size(); ++i) {
    counters_.hit_tokens += outcome.hits[i];
    counters_.computed_tokens += request[i].second - outcome.hits[i];
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
    users.push_back({key, outcome.hits[i], total, &owned});
  }
  return users;
}

void PagedPool::finish(const std::vector<std::pair<int64_t, int64_t>>& request) {
  for (const auto& entry : request) {
    if (ledger_.held(entry.first) == 0) release(entry.first);
  }
}

void PagedPool::forget(int64_t key) {
  ledger_.forget(key);
  release(key);
}

void PagedPool::clear() {
  ledger_.clear();
  std::vector<int64_t> keys;
  for (const auto& entry : pages_) keys.push_back(entry.first);
  for (int64_t key : keys) release(key);
  counters_ = Counters();
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
  return {
      {"HIT_TOKENS", counters_.hit_tokens},
      {"COMPUTED_TOKENS", counters_.computed_tokens},
      {"EVICTED_USERS", counters_.evicted_users},
      {"RESIDENT_TOKENS", ledger_.resident_tokens()},
      {"REQUESTS", counters_.requests},
      {"GPU_BUDGET_TOKENS", ledger_.budget_pages() * shape_.page_tokens},
      {"RESIDENT_BYTES", allocated_pages() * page_bytes()},
      {"BUDGET_BYTES", num_pages_ * page_bytes()},
  };  // no host tier: its figures are 0
}

}  // namespace hstu
