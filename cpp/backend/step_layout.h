// Every index a batched step needs, in one int64 host buffer that goes to the device in one copy:
// the new tokens' ids, kinds and positions (every user's new history tokens, then every
// candidate), the pool slots of the new history tokens, the page table and the work items. Each
// part starts 16 bytes aligned, as the package was compiled to expect.
//
// A layout may be larger than its step (a CUDA graph's padded shape, step_graphs.h): rows past
// the step's tokens repeat its first token, page-table cells past a user's pages are page 0, and
// items past the plan's have no rows (their programs do nothing).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "jagged_request.h"
#include "paged_pool.h"
#include "work_plan.h"

namespace hstu {

constexpr int64_t kItemKind = kContextTokens;  // token kinds: 0 user id, 1..5 context, 6 item, 7 action

inline int64_t history_kind(int64_t position) {
  return position < kContextTokens ? position : kItemKind + (position - kContextTokens) % 2;
}

struct StepLayout {
  int64_t tokens, slots, rows, pages, items;  // tokens >= 2: one token alone is padded by a row no item reads

  enum Part { kIds, kKinds, kPositions, kSlots, kTable, kItems, kParts };

  std::array<int64_t, kParts> sizes() const {
    return {tokens, tokens, tokens, slots, rows * pages, items * kItemFields};
  }
  std::array<int64_t, kParts + 1> offsets() const {
    std::array<int64_t, kParts + 1> at{};
    const auto part = sizes();
    for (int i = 0; i < kParts; ++i) at[i + 1] = at[i] + (part[i] + 1) / 2 * 2;
    return at;
  }
  int64_t length() const { return offsets()[kParts]; }

  // Views of a packed device buffer in the package's input order: ids, kinds, positions, page
  // table, items, slots.
  std::vector<at::Tensor> inputs(const at::Tensor& packed) const {
    const auto at = offsets();
    const auto part = sizes();
    const auto view = [&](Part p) { return packed.narrow(0, at[p], part[p]); };
    return {view(kIds), view(kKinds), view(kPositions), view(kTable).view({rows, pages}),
            view(kItems).view({items, kItemFields}), view(kSlots)};
  }

  // Fill `out` (length() values) for users placed in the pool with page table `table` [users, width].
  void pack(const std::vector<UserView>& users, const std::vector<UserPages>& placed, const at::Tensor& table,
            const std::vector<WorkItem>& plan, int64_t page, int64_t* out) const {
    const auto at = offsets();
    std::fill(out, out + length(), int64_t(0));
    int64_t* ids = out + at[kIds];
    int64_t* kinds = out + at[kKinds];
    int64_t* positions = out + at[kPositions];
    int64_t* slot = out + at[kSlots];
    const int64_t width = table.size(1);
    const int64_t* cells = table.data_ptr<int64_t>();
    int64_t token = 0;
    for (size_t u = 0; u < users.size(); ++u) {
      for (int64_t p = placed[u].hit; p < placed[u].total; ++p, ++token) {
        ids[token] = users[u].history_id(p);
        kinds[token] = history_kind(p);
        positions[token] = p;
        slot[token] = cells[u * width + p / page] * page + p % page;
      }
    }
    for (size_t u = 0; u < users.size(); ++u) {
      for (int64_t c = 0; c < users[u].candidates; ++c, ++token) {
        ids[token] = users[u].items[users[u].history + c];
        kinds[token] = kItemKind;
        positions[token] = placed[u].total;
      }
    }
    for (; token < tokens; ++token) {
      ids[token] = ids[0];
      kinds[token] = kinds[0];
      positions[token] = positions[0];
    }
    for (int64_t u = 0; u < table.size(0); ++u) {
      std::copy(cells + u * width, cells + (u + 1) * width, out + at[kTable] + u * pages);
    }
    std::copy(plan.begin(), plan.end(), reinterpret_cast<WorkItem*>(out + at[kItems]));
  }
};

}  // namespace hstu
