// The attention work items of one batched step, as hstu_replay/server/paged_attention.py's
// WorkPlan.plan lays them out: one row (user, first row, rows, position of the first row,
// position step, first key, key end) per block of BLOCK_M query rows, history blocks of every
// user first, then candidate blocks; when the blocks alone would give too few programs, blocks
// of CHUNK_BLOCK_M rows with their keys split into chunks; longest first. `capacity` is the most
// items a plan of the same blocks can have whatever its users' lengths (WorkPlan.capacity): what a
// CUDA graph's items are padded to.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

namespace hstu {

constexpr int64_t kBlockM = 128;       // query rows per work item (the kernel's BLOCK_M)
constexpr int64_t kChunkBlockM = 64;   // query rows per work item of a split plan (CHUNK_BLOCK_M)
constexpr int64_t kBlockN = 64;        // keys per step of the kernel's loop (BLOCK_N)
constexpr int64_t kMinPrograms = 264;  // split keys below this many programs (MIN_PROGRAMS, measured there)
constexpr int64_t kItemFields = 7;

using WorkItem = std::array<int64_t, kItemFields>;
enum Field { kUser, kRow0, kRows, kPos0, kStep, kKey0, kKeyEnd };

struct WorkPlan {
  std::vector<WorkItem> items;
  int64_t capacity;
};

// One item per block of `block_m` query rows: every user's history blocks, then its candidate blocks.
inline std::vector<WorkItem> plan_blocks(const std::vector<int64_t>& past, const std::vector<int64_t>& n_hist,
                                         const std::vector<int64_t>& n_cand, int64_t block_m) {
  const size_t users = past.size();
  std::vector<WorkItem> items;
  int64_t row = 0;
  for (size_t u = 0; u < users; ++u) {  // history blocks
    const int64_t kv_len = past[u] + n_hist[u];
    for (int64_t first = 0; first < n_hist[u]; first += block_m) {
      const int64_t rows = std::min(block_m, n_hist[u] - first);
      items.push_back({int64_t(u), row + first, rows, past[u] + first, 1, 0, kv_len});
    }
    row += n_hist[u];
  }
  for (size_t u = 0; u < users; ++u) {  // candidate blocks
    const int64_t kv_len = past[u] + n_hist[u];
    for (int64_t first = 0; first < n_cand[u]; first += block_m) {
      const int64_t rows = std::min(block_m, n_cand[u] - first);
      items.push_back({int64_t(u), row + first, rows, kv_len - 1, 0, 0, kv_len});
    }
    row += n_cand[u];
  }
  for (auto& item : items) {  // keys a block really visits: up to its last row's position
    item[kKeyEnd] = std::min(item[kKeyEnd], item[kPos0] + item[kStep] * (item[kRows] - 1) + 1);
  }
  return items;
}

inline WorkPlan plan_work(const std::vector<int64_t>& past, const std::vector<int64_t>& n_hist,
                          const std::vector<int64_t>& n_cand, int64_t heads) {
  std::vector<WorkItem> items = plan_blocks(past, n_hist, n_cand, kBlockM);
  const int64_t programs = int64_t(items.size()) * heads;
  const bool split = programs > 0 && programs < kMinPrograms;
  if (split) items = plan_blocks(past, n_hist, n_cand, kChunkBlockM);
  const int64_t capacity = int64_t(items.size()) + (split ? kMinPrograms / heads : 0);
  if (split) {
    int64_t total_keys = 0;
    for (const auto& item : items) total_keys += item[kKeyEnd];
    int64_t chunk = std::max(4 * kBlockN, (total_keys * heads + kMinPrograms - 1) / kMinPrograms);
    chunk = (chunk + kBlockN - 1) / kBlockN * kBlockN;
    std::vector<WorkItem> split;
    for (const auto& item : items) {
      const int64_t pieces = std::max<int64_t>(1, (item[kKeyEnd] + chunk - 1) / chunk);
      for (int64_t p = 0; p < pieces; ++p) {
        WorkItem piece = item;
        piece[kKey0] = p * chunk;
        piece[kKeyEnd] = std::min(item[kKeyEnd], piece[kKey0] + chunk);
        split.push_back(piece);
      }
    }
    items.swap(split);
  }
  std::stable_sort(items.begin(), items.end(), [](const WorkItem& a, const WorkItem& b) {
    return a[kKeyEnd] - a[kKey0] > b[kKeyEnd] - b[kKey0];
  });
  return {std::move(items), capacity};
}

}  // namespace hstu
