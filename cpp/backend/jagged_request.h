// One request of the jagged layout (hstu_replay/request.py): `lengths[f*B + b]` is feature f's
// length for user b, `values` concatenates feature by feature, user by user. Users are read as
// views into the input buffers (no copy), with every structural check the Python frontends make.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "errors.h"

namespace hstu {

constexpr int64_t kContextTokens = 6;  // user id + five contextual features
constexpr int64_t kFeatures = 8;

struct Int64s {  // a view of an int64 input
  const int64_t* data = nullptr;
  int64_t size = 0;
  int64_t operator[](int64_t i) const { return data[i]; }
};

struct UserView {
  int64_t key;                   // the cache key (INPUT__3; the user id where a model takes none)
  const int64_t* head;           // user id, then the five contextual features, each `batch` apart
  int64_t head_stride;           // = batch
  const int64_t* items;          // history items then candidates
  const int64_t* actions;        // history actions
  int64_t history;               // history items
  int64_t candidates;
  int64_t total() const { return kContextTokens + 2 * history; }  // history tokens
  int64_t user_id() const { return head[0]; }
  // The raw id of history token p: 6 contextual, then item/action interleaved.
  int64_t history_id(int64_t p) const {
    if (p < kContextTokens) return head[p * head_stride];
    const int64_t pair = (p - kContextTokens) / 2;
    return (p - kContextTokens) % 2 == 0 ? items[pair] : actions[pair];
  }
};

struct Limits {
  int64_t max_batch;
  int64_t max_history;
  int64_t max_candidates;
};

// `user_ids` / `total_history_lengths` may be empty views (a model without them): derived then.
inline std::vector<UserView> split_request(Int64s values, Int64s lengths, Int64s num_candidates, Int64s user_ids,
                                           Int64s totals, const Limits& limits) {
  const int64_t batch = num_candidates.size;
  if (batch == 0 || lengths.size != kFeatures * batch) {
    throw InputError("lengths has " + std::to_string(lengths.size) + " entries; expected 8 x " +
                     std::to_string(batch) + " users");
  }
  if (batch > limits.max_batch) {
    throw LimitError("batch of " + std::to_string(batch) + " users; the model takes at most " +
                     std::to_string(limits.max_batch));
  }
  int64_t sum = 0;
  for (int64_t i = 0; i < lengths.size; ++i) {
    if (lengths[i] < 0) throw InputError("negative length or candidate count");
    if (i < kContextTokens * batch && lengths[i] != 1) {
      throw InputError("every contextual feature must have length 1 per user");
    }
    sum += lengths[i];
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (num_candidates[b] < 0) throw InputError("negative length or candidate count");
    if (lengths[kContextTokens * batch + b] != lengths[(kContextTokens + 1) * batch + b]) {
      throw InputError("video_id and action_weights lengths differ");
    }
    if (num_candidates[b] > lengths[kContextTokens * batch + b]) {
      throw InputError("a user has more candidates than items");
    }
  }
  if (sum != values.size) {
    throw InputError("lengths sum to " + std::to_string(sum) + " but values has " + std::to_string(values.size));
  }
  if ((user_ids.data && user_ids.size != batch) || (totals.data && totals.size != batch)) {
    throw InputError("user_ids and total_history_lengths must have one entry per user (" + std::to_string(batch) +
                     ")");
  }
  const int64_t item_total = (sum - kContextTokens * batch) / 2;
  std::vector<UserView> users;
  int64_t first = kContextTokens * batch;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t seq = lengths[kContextTokens * batch + b];
    UserView user{0, values.data + b, batch, values.data + first, values.data + first + item_total,
                  seq - num_candidates[b], num_candidates[b]};
    user.key = user_ids.data ? user_ids[b] : user.user_id();
    if (totals.data && totals[b] != user.total()) {
      throw InputError("user " + std::to_string(user.user_id()) + ": total_history_length " +
                       std::to_string(totals[b]) + " but the layout implies " + std::to_string(user.total()));
    }
    if (user.history > limits.max_history) {
      throw LimitError("user " + std::to_string(user.user_id()) + ": history of " + std::to_string(user.history) +
                       " items exceeds " + std::to_string(limits.max_history));
    }
    if (user.candidates > limits.max_candidates) {
      throw LimitError("user " + std::to_string(user.user_id()) + ": " + std::to_string(user.candidates) +
                       " candidates exceed " + std::to_string(limits.max_candidates));
    }
    users.push_back(user);
    first += seq;
  }
  return users;
}

}  // namespace hstu
