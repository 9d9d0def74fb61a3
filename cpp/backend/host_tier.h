// The host tier behind the KV pool, with the semantics of hstu_replay/server/host_tier.py (NVIDIA's:
// KVLookupResult.merge, the native host storage, FlexKV):
// - offload after a forward pass: `flexkv` every token not yet on the host, `native` whole chunks of
//   `chunk_tokens` once a chunk's worth is not yet there (hstu_replay.cache_ledger.OFFLOAD_RULES);
// - lookup merges the tiers: a user reuses max(host, pool) tokens, and where the host holds more
//   than the pool its whole sequence is onboarded (copied into the user's pages);
// - its own page-rounded budget, LRU per user: after a request's forward pass its users become the
//   most recent, in request order, and the host evicts for them as the pool does for a request
//   (its own users protected from each other); a user evicted from both tiers is recomputed.
// K/V wait on the host in chunks, in token order, in pinned memory where the pool is on a GPU.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache_ledger.h"

namespace hstu {

enum class OffloadMode { kNative, kFlexKV };

// "native" or "flexkv" (the server's --offload-mode), else InputError.
OffloadMode offload_mode_named(const std::string& name);

struct HostTierShape {
  int64_t budget_tokens;  // 0: no host tier
  OffloadMode mode;
  int64_t chunk_tokens;
};

class HostTier {
 public:
  using Request = std::vector<std::pair<int64_t, int64_t>>;  // (key, total history tokens) per user
  using KV = std::pair<at::Tensor, at::Tensor>;              // K and V, each [layers, tokens, heads, head_dim]
  using Writer = std::function<void(int64_t start, const KV& part)>;
  using Reader = std::function<KV(size_t user, int64_t start, int64_t end)>;  // user: its index in the request

  // `device`: the pool's (its copies are waited for, so their times are whole).
  HostTier(const HostTierShape& shape, int64_t page_tokens, int64_t bytes_per_token, at::Device device);

  // A history shorter than what the host holds would reuse stale K/V: refused, as the pool does.
  void check(const Request& request) const { ledger_.check(request); }
  // Per user, the tokens the host holds of its history (its order changes at `offload`).
  std::vector<int64_t> lookup(const Request& request) const;
  // The first `tokens` the host holds of `key`, chunk by chunk, to `write`; counted as host hits.
  void onboard(int64_t key, int64_t tokens, const Writer& write);
  // After the forward pass of `request`'s users: what the mode says of each, copied out through
  // `read`, then the request accounted in the host's LRU at once. Returns the tokens offloaded now.
  int64_t offload(const Request& request, const Reader& read);
  void forget(int64_t key);
  void clear();
  // The host's figures, by the control model's names.
  void add_stats(std::map<std::string, int64_t>& stats) const;

 private:
  struct Counters {
    int64_t host_hit_tokens = 0, onboarded_bytes = 0, onboard_micros = 0, offloaded_bytes = 0, offload_micros = 0,
            host_evicted_users = 0;
  };

  void wait() const;

  HostTierShape shape_;
  CacheLedger ledger_;
  int64_t bytes_per_token_;
  at::Device device_;
  std::unordered_map<int64_t, std::vector<KV>> chunks_;  // key -> its K/V on the host, in token order
  Counters counters_;
};

}  // namespace hstu
