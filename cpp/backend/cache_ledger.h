// Token bookkeeping of the KV cache, with the semantics of hstu_replay/cache_ledger.py: a user
// reuses min(held, total_history_length) tokens; afterwards its key holds total_history_length
// tokens; whole users are evicted least recently used when the pages exceed the budget; the
// running request's users are never evicted (they are dropped, oldest first, only when they
// alone exceed it); a user larger than the whole budget is served and not kept.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "errors.h"

namespace hstu {

inline int64_t pages_of(int64_t tokens, int64_t page_tokens) { return (tokens + page_tokens - 1) / page_tokens; }

struct LedgerOutcome {
  std::vector<int64_t> hits;     // tokens reused, per user of the request
  std::vector<int64_t> evicted;  // keys evicted to make room
};

class CacheLedger {
 public:
  CacheLedger(int64_t budget_tokens, int64_t page_tokens)
      : page_tokens_(page_tokens), budget_pages_(budget_tokens / page_tokens) {}

  int64_t held(int64_t key) const {
    auto found = index_.find(key);
    return found == index_.end() ? 0 : found->second->second;
  }
  int64_t page_tokens() const { return page_tokens_; }
  int64_t budget_pages() const { return budget_pages_; }
  int64_t resident_pages() const { return pages_; }
  int64_t resident_tokens() const { return tokens_; }
  int64_t size() const { return static_cast<int64_t>(index_.size()); }

  // Refuse what the published server would silently get wrong.
  void check(const std::vector<std::pair<int64_t, int64_t>>& request) const {
    std::unordered_set<int64_t> seen;
    for (const auto& [key, tokens] : request) {
      if (!seen.insert(key).second) {
        throw LimitError("cache key " + std::to_string(key) + " appears twice in one request");
      }
      if (tokens < held(key)) {
        throw LimitError("cache key " + std::to_string(key) + ": history of " + std::to_string(tokens) +
                         " tokens is shorter than the " + std::to_string(held(key)) + " held");
      }
    }
  }

  LedgerOutcome serve(const std::vector<std::pair<int64_t, int64_t>>& request) {
    check(request);
    LedgerOutcome outcome;
    for (const auto& [key, tokens] : request) outcome.hits.push_back(std::min(held(key), tokens));
    std::unordered_set<int64_t> protect;
    for (const auto& [key, tokens] : request) {
      protect.insert(key);
      forget(key);
      if (pages_of(tokens, page_tokens_) > budget_pages_) continue;  // served, not kept
      order_.emplace_back(key, tokens);
      index_[key] = std::prev(order_.end());
      add(tokens, 1);
    }
    // The request's keys are the most recent now: evict from the least recent end until the
    // budget holds or only they remain; then drop the oldest of them.
    while (pages_ > budget_pages_ && !order_.empty() && !protect.count(order_.front().first)) {
      outcome.evicted.push_back(order_.front().first);
      forget(order_.front().first);
    }
    while (pages_ > budget_pages_ && !order_.empty()) forget(order_.front().first);
    return outcome;
  }

  void forget(int64_t key) {
    auto found = index_.find(key);
    if (found == index_.end()) return;
    add(found->second->second, -1);
    order_.erase(found->second);
    index_.erase(found);
  }

  void clear() {
    order_.clear();
    index_.clear();
    pages_ = tokens_ = 0;
  }

 private:
  void add(int64_t tokens, int64_t sign) {
    pages_ += sign * pages_of(tokens, page_tokens_);
    tokens_ += sign * tokens;
  }

  int64_t page_tokens_;
  int64_t budget_pages_;
  std::list<std::pair<int64_t, int64_t>> order_;  // (key, tokens), least recent first
  std::unordered_map<int64_t, std::list<std::pair<int64_t, int64_t>>::iterator> index_;
  int64_t pages_ = 0;
  int64_t tokens_ = 0;
};

}  // namespace hstu
