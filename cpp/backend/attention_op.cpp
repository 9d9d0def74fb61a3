// hstu_replay::paged_attention in C++: the operator a batched-step package compiled for a CPU
// calls back into its process for (the Python twin is hstu_replay/server/attention_ops.py, whose
// computation is paged_attention.reference_attention). Same schema, same order of operations.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace {

// q, k_new, v_new: the layer's projection before its SiLU, applied here (of k_new and v_new to the
// candidates' own rows alone, the only ones read); the pool's keys and values after it.
at::Tensor paged_attention(const at::Tensor& q_projected, const at::Tensor& k_new, const at::Tensor& v_new,
                           const at::Tensor& pool_k, const at::Tensor& pool_v, const at::Tensor& page_table,
                           const at::Tensor& items, int64_t page_tokens, double normaliser) {
  const at::Tensor q = at::silu(q_projected);
  at::Tensor out = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
  const at::Tensor work = items.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor table = page_table.to(at::kLong);
  const auto rows_of = work.accessor<int64_t, 2>();
  const auto index = q.options().dtype(at::kLong);
  const int64_t new_row0 = q.size(0) - k_new.size(0);  // k_new/v_new hold the last rows' new keys
  for (int64_t i = 0; i < work.size(0); ++i) {
    const int64_t user = rows_of[i][0], row0 = rows_of[i][1], rows = rows_of[i][2], pos0 = rows_of[i][3];
    const int64_t step = rows_of[i][4], key0 = rows_of[i][5], key_end = rows_of[i][6];
    if (rows <= 0) continue;
    at::Tensor target = out.narrow(0, row0, rows);
    const at::Tensor query_rows = q.narrow(0, row0, rows);
    if (step == 0 && key0 == 0) {  // candidates see themselves (added once: by their first key chunk)
      const at::Tensor own_k = at::silu(k_new.narrow(0, row0 - new_row0, rows)).to(at::kFloat);
      const at::Tensor own_v = at::silu(v_new.narrow(0, row0 - new_row0, rows)).to(at::kFloat);
      const at::Tensor own = at::silu((query_rows.to(at::kFloat) * own_k).sum(-1, /*keepdim=*/true));
      target.add_(own * own_v);
    }
    if (key_end <= key0) continue;
    const at::Tensor key_pos = at::arange(key0, key_end, index);
    const at::Tensor slots =
        table[user].index_select(0, at::floor_divide(key_pos, page_tokens)) * page_tokens + key_pos.remainder(page_tokens);
    const at::Tensor keys = pool_k.index_select(0, slots).transpose(0, 1);  // [H, keys, D]
    const at::Tensor vals = pool_v.index_select(0, slots).transpose(0, 1);
    const at::Tensor query = query_rows.transpose(0, 1);  // [H, rows, D]
    const at::Tensor query_pos = pos0 + step * at::arange(rows, index);
    const at::Tensor weights = at::silu(at::matmul(query, keys.transpose(1, 2)))
                                   .masked_fill(key_pos.unsqueeze(0) > query_pos.unsqueeze(1), 0.0);
    target.add_(at::matmul(weights, vals).transpose(0, 1).to(at::kFloat));
  }
  return (out / normaliser).to(q.scalar_type());
}

}  // namespace

TORCH_LIBRARY(hstu_replay, m) {
  m.def("paged_attention(Tensor q, Tensor k, Tensor v, Tensor pool_k, Tensor pool_v, Tensor page_table, "
        "Tensor items, SymInt page_tokens, float normaliser) -> Tensor");
}

TORCH_LIBRARY_IMPL(hstu_replay, CPU, m) { m.impl("paged_attention", paged_attention); }
