#include "host_tier.h"

#include <ATen/ops/empty.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <chrono>

#include "errors.h"

namespace hstu {

namespace {

// hstu_replay.cache_ledger.OFFLOAD_RULES: (tokens on the host, tokens the user has now, chunk) ->
// tokens on the host after the offload
int64_t offload_target(OffloadMode mode, int64_t held, int64_t total, int64_t chunk) {
  return mode == OffloadMode::kFlexKV ? total : held + (total - held) / chunk * chunk;
}

class Stopwatch {
 public:
  int64_t micros() const {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - started_).count();
  }

 private:
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

}  // namespace

OffloadMode offload_mode_named(const std::string& name) {
  if (name == "native") return OffloadMode::kNative;
  if (name == "flexkv") return OffloadMode::kFlexKV;
  throw InputError("config.pbtxt parameter offload_mode: " + name + " is neither native nor flexkv");
}

HostTier::HostTier(const HostTierShape& shape, int64_t page_tokens, int64_t bytes_per_token, at::Device device)
    : shape_(shape), ledger_(shape.budget_tokens, page_tokens), bytes_per_token_(bytes_per_token), device_(device) {
  if (shape.budget_tokens < 1) {
    throw LimitError("host tier of " + std::to_string(shape.budget_tokens) +
                     " tokens; give at least 1 (0 means no host tier)");
  }
  if (shape.chunk_tokens < 1) {
    throw LimitError("offload chunk of " + std::to_string(shape.chunk_tokens) + " tokens; must be at least 1");
  }
}

std::vector<int64_t> HostTier::lookup(const Request& request) const {
  std::vector<int64_t> host;
  for (const auto& [key, total] : request) host.push_back(std::min(ledger_.held(key), total));
  return host;
}

void HostTier::onboard(int64_t key, int64_t tokens, const Writer& write) {
  const Stopwatch timed;
  int64_t start = 0;
  for (const auto& [k, v] : chunks_.at(key)) {
    if (start >= tokens) break;
    const int64_t n = std::min(k.size(1), tokens - start);
    write(start, {k.narrow(1, 0, n), v.narrow(1, 0, n)});
    start += n;
  }
  wait();
  counters_.host_hit_tokens += tokens;
  counters_.onboarded_bytes += tokens * bytes_per_token_;
  counters_.onboard_micros += timed.micros();
}

int64_t HostTier::offload(const Request& request, const Reader& read) {
  const Stopwatch timed;
  Request account;                          // (key, tokens on the host after) of each user it holds any of
  std::vector<std::pair<size_t, KV>> copies;  // (user, its new tokens, copied to the host)
  int64_t moved = 0;
  for (size_t u = 0; u < request.size(); ++u) {
    const auto& [key, total] = request[u];
    const int64_t held = ledger_.held(key);
    const int64_t target = offload_target(shape_.mode, held, total, shape_.chunk_tokens);
    if (target > held) {
      const KV part = read(u, held, target);
      const auto options = part.first.options().device(at::kCPU).pinned_memory(device_.is_cuda());
      KV copy{at::empty(part.first.sizes(), options), at::empty(part.second.sizes(), options)};
      copy.first.copy_(part.first);
      copy.second.copy_(part.second);
      copies.emplace_back(u, std::move(copy));
      moved += target - held;
    }
    if (target > 0) account.emplace_back(key, target);  // nothing held nor offloaded: no place on the host
  }
  if (account.empty()) return 0;
  wait();
  const LedgerOutcome outcome = ledger_.serve(account);
  for (int64_t gone : outcome.evicted) chunks_.erase(gone);
  counters_.host_evicted_users += int64_t(outcome.evicted.size());
  for (const auto& [key, target] : account) {
    if (ledger_.held(key) != target) chunks_.erase(key);  // dropped: served, not kept
  }
  for (auto& [u, copy] : copies) {
    const int64_t key = request[u].first;
    if (ledger_.held(key) > 0) chunks_[key].push_back(std::move(copy));  // kept: it holds its target
  }
  counters_.offloaded_bytes += moved * bytes_per_token_;
  counters_.offload_micros += timed.micros();
  return moved;
}

void HostTier::forget(int64_t key) {
  ledger_.forget(key);
  chunks_.erase(key);
}

void HostTier::clear() {
  ledger_.clear();
  chunks_.clear();
  counters_ = Counters();
}

void HostTier::wait() const {
  if (device_.is_cpu()) return;
  const auto* device = c10::impl::getDeviceGuardImpl(device_.type());
  device->synchronizeDevice(device_.has_index() ? device_.index() : device->getDevice().index());
}

void HostTier::add_stats(std::map<std::string, int64_t>& stats) const {
  const int64_t budget = ledger_.budget_pages() * ledger_.page_tokens();
  stats["HOST_HIT_TOKENS"] = counters_.host_hit_tokens;
  stats["HOST_RESIDENT_TOKENS"] = ledger_.resident_tokens();
  stats["HOST_EVICTED_USERS"] = counters_.host_evicted_users;
  stats["ONBOARDED_BYTES"] = counters_.onboarded_bytes;
  stats["ONBOARD_MICROS"] = counters_.onboard_micros;
  stats["OFFLOADED_BYTES"] = counters_.offloaded_bytes;
  stats["OFFLOAD_MICROS"] = counters_.offload_micros;
  stats["HOST_BUDGET_TOKENS"] = budget;
  stats["HOST_RESIDENT_BYTES"] = ledger_.resident_tokens() * bytes_per_token_;
  stats["HOST_BUDGET_BYTES"] = budget * bytes_per_token_;
}

}  // namespace hstu
