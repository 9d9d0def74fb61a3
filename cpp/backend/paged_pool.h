// The KV pool in pages and each held user's page table, beside a CacheLedger that decides
// everything (hstu_replay/server/paged_cache.py's semantics): a cached user's new tokens go on
// after its last token, in its last partly filled page and then in fresh pages, so a hit copies
// nothing. The pool has room for the ledger's budget plus one full request; its memory is taken
// as pages are used (one full request first, then twice the size, at most the whole pool). With a
// host tier behind it (host_tier.h), a user the host holds more of is onboarded into its pages at
// `begin`, and `offload` copies the request's users out after the forward pass.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache_ledger.h"
#include "host_tier.h"

namespace hstu {

struct PoolShape {
  int64_t layers, heads, head_dim, page_tokens;
  int64_t budget_tokens;
  int64_t request_pages;  // a full request's pages: max batch x pages of the longest history
  bool reserve;           // all the pool's memory taken at start: it never grows (nor moves)
};

struct UserPages {
  int64_t key, hit, total;  // hit: tokens reused, both tiers merged
  int64_t onboarded;        // of the hit, tokens onboarded from the host tier
  const std::vector<int64_t>* pages;  // the user's pages in token order (owned by the pool)
};

struct Counters {
  int64_t hit_tokens = 0, computed_tokens = 0, evicted_users = 0, requests = 0;
};

class PagedPool {
 public:
  // `host.budget_tokens` 0: no host tier.
  PagedPool(const PoolShape& shape, const HostTierShape& host, at::ScalarType dtype, at::Device device);

  void check_request(const std::vector<std::pair<int64_t, int64_t>>& request) const;
  // Account one request and give each user pages for all its tokens (cached ones first, those the
  // host tier held onboarded into them).
  std::vector<UserPages> begin(const std::vector<std::pair<int64_t, int64_t>>& request);
  // After the forward pass of `users` (their pages hold all their tokens): offload to the host tier.
  void offload(const std::vector<UserPages>& users);
  // After the request: release the pages of its users the ledger did not keep.
  void finish(const std::vector<std::pair<int64_t, int64_t>>& request);
  // Hold nothing for `key` in either tier (a request that failed half-way).
  void forget(int64_t key);
  void clear();
  // The users' pages as the rows of one int64 table [users, widest] (short rows padded with page 0).
  at::Tensor page_table(const std::vector<UserPages>& users) const;
  // The control model's figures, by name (upper case, as CONTROL_OUTPUTS).
  std::map<std::string, int64_t> stats() const;

  at::Tensor pool_k, pool_v;  // [layers, slots, heads, head_dim]
  int64_t page_tokens() const { return shape_.page_tokens; }
  // Bumped each time the pool is reallocated: what holds its addresses (a CUDA graph) is stale then.
  int64_t generation() const { return generation_; }

 private:
  int64_t allocated_pages() const { return pool_k.size(1) / shape_.page_tokens; }
  int64_t page_bytes() const;
  void grow(int64_t to_pages);
  void reserve(int64_t needed);
  void release(int64_t key);
  // Pool slots of tokens [start, end) of a user with these pages, on the pool's device.
  at::Tensor slots(const std::vector<int64_t>& pages, int64_t start, int64_t end) const;
  void onboard(const UserPages& user);

  PoolShape shape_;
  CacheLedger ledger_;
  std::unique_ptr<HostTier> host_;  // none: one tier
  int64_t num_pages_;  // the most the pool ever takes
  std::unordered_map<int64_t, std::vector<int64_t>> pages_;
  std::vector<int64_t> free_;  // a stack of allocated free pages: low pages on top
  Counters counters_;
  int64_t generation_ = 0;
};

}  // namespace hstu
