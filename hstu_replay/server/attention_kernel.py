"""The Triton kernel behind `paged_attention` (see there for the work items and the masking rules)."""

import triton
import triton.language as tl


@triton.jit
def silu(s, FAST: tl.constexpr):
    """x * sigmoid(x) = h + h * tanh(h) with h = x / 2: one hardware tanh, no division. FAST is one of
    paged_attention's SILU_* (2: in 16 bits, two values a tanh; 1: in 32 bits; 0: the sigmoid)."""
    if FAST == 2:  # the weights are rounded to 16 bits for the next product anyway
        h = (s * 0.5).to(tl.bfloat16)
        t = tl.inline_asm_elementwise("tanh.approx.bf16x2 $0, $1;", "=r,r", [h], dtype=tl.bfloat16,
                                      is_pure=True, pack=2)
        w = h + h * t
    elif FAST == 1:
        t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [s * 0.5], dtype=tl.float32,
                                      is_pure=True, pack=1)
        w = s * 0.5 + s * 0.5 * t
    else:
        w = s * tl.sigmoid(s)
    return w


@triton.jit
def activated(x):
    """SiLU of the projection's values x, in 32 bits and rounded back to x's type, as the model's
    own SiLU of them rounds (exact sigmoid: these values are read once a program, not in its loop)."""
    return silu(x.to(tl.float32), 0).to(x.dtype)


@triton.jit
def is_chunk(rows, pos0, step, key0, key_end):
    """Whether an item is a chunk of a split: one item of several over the same rows, which add up in
    ACC. An item that visits its rows' whole key range (key 0 to its last row's end) is their only one."""
    return (key0 != 0) | (key_end != pos0 + step * (rows - 1) + 1)


@triton.jit
def split_chunk(ITEMS):
    """This program's item: (first row, rows, whether it is a chunk of a split, whether it is the
    first chunk of its rows)."""
    item = ITEMS + tl.program_id(0) * 7
    row0 = tl.load(item + 1)
    rows = tl.load(item + 2)
    key0 = tl.load(item + 5)
    chunk = is_chunk(rows, tl.load(item + 3), tl.load(item + 4), key0, tl.load(item + 6))
    return row0, rows, chunk, chunk & (key0 == 0)


@triton.jit
def _rows(BASE, row0, rows, stride_t, stride_h, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Pointers to rows row0.. of this program's head in BASE [T, H, D], and which of them exist."""
    m = tl.arange(0, BLOCK_M)
    d = tl.arange(0, HEAD_DIM)
    at = BASE + (row0 + m).to(tl.int64)[:, None] * stride_t + tl.program_id(1) * stride_h + d[None, :]
    return at, (m < rows)[:, None]


@triton.jit
def split_rows_zero(ACC, ITEMS, stride_at, stride_ah, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Before the attention: the rows of every split start at zero in ACC (the first chunk's program
    clears them; every other row of ACC stays unwritten)."""
    row0, rows, chunk, first = split_chunk(ITEMS)
    if first:
        at, ok = _rows(ACC, row0, rows, stride_at, stride_ah, BLOCK_M, HEAD_DIM)
        tl.store(at, tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32), mask=ok)


@triton.jit
def split_rows_finish(ACC, OUT, ITEMS, stride_at, stride_ah, stride_ot, stride_oh, BLOCK_M: tl.constexpr,
                      HEAD_DIM: tl.constexpr):
    """After the attention: the rows of every split, added up in ACC, written to OUT in its type."""
    row0, rows, chunk, first = split_chunk(ITEMS)
    if first:
        acc_at, ok = _rows(ACC, row0, rows, stride_at, stride_ah, BLOCK_M, HEAD_DIM)
        out_at, ok = _rows(OUT, row0, rows, stride_ot, stride_oh, BLOCK_M, HEAD_DIM)
        tl.store(out_at, tl.load(acc_at, mask=ok, other=0.0).to(OUT.dtype.element_ty), mask=ok)


# Q, K_NEW, V_NEW: the projection's values, SiLU not yet applied (it is here, on reading them); K, V:
# the pool's, stored after it. Not specialised: the two integers that vary from request to request
# (specialised on a value of 1 or a multiple of 16, each would compile the kernel again for a new kind
# of request, while it is being served).
@triton.jit(do_not_specialize=["stride_page_table", "new_row0"])
def hstu_paged_attention(Q, K_NEW, V_NEW, K, V, OUT, ACC, ITEMS, PAGE_TABLE,
                         stride_qt, stride_qh, stride_nt, stride_nh, stride_kt, stride_kh, stride_ot, stride_oh,
                         stride_at, stride_ah, stride_page_table, scale, new_row0,
                         PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr, RUNS: tl.constexpr, FAST_SILU: tl.constexpr):
    item = ITEMS + tl.program_id(0) * 7
    head = tl.program_id(1)
    user = tl.load(item)
    row0 = tl.load(item + 1)
    rows = tl.load(item + 2)
    pos0 = tl.load(item + 3)
    step = tl.load(item + 4)
    key0 = tl.load(item + 5)
    key_end = tl.load(item + 6)
    chunk = is_chunk(rows, pos0, step, key0, key_end)
    # RUNS: paged_attention's ALL_ITEMS (0), or one of a split plan's two launches, WHOLE_ITEMS (1) or
    # CHUNKS (2), each on its own tiles: an item of the other launch does nothing here (no rows, no keys)
    if RUNS != 0:
        mine = chunk == (RUNS == 2)
        rows = tl.where(mine, rows, 0)
        key_end = tl.where(mine, key_end, key0)
    m = tl.arange(0, BLOCK_M)
    d = tl.arange(0, HEAD_DIM)
    n = tl.arange(0, BLOCK_N)
    row_ok = m < rows
    # SiLU(q) goes through this program's rows of OUT and is loaded back: a loaded operand of the loop's
    # products stays in shared memory, one computed in registers is held there through the whole loop
    # (on the H200 that made a launch of 128 rows and 4 warps 25-60% slower, call 24). The
    # rows are this program's until it writes its result there (chunks of a split write the same values
    # and leave OUT to split_rows_finish).
    out_rows = (row0 + m).to(tl.int64)[:, None] * stride_ot + head * stride_oh + d[None, :]
    q_raw = tl.load(Q + (row0 + m).to(tl.int64)[:, None] * stride_qt + head * stride_qh + d[None, :],
                    mask=row_ok[:, None], other=0.0)
    tl.store(OUT + out_rows, activated(q_raw).to(OUT.dtype.element_ty), mask=row_ok[:, None])
    tl.debug_barrier()  # every thread's rows are stored before any thread loads them
    q = tl.load(OUT + out_rows, mask=row_ok[:, None], other=0.0)
    query_pos = pos0 + step * m
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if (step == 0) & (key0 == 0) & (rows > 0):  # candidates see themselves (added once: by their first key chunk)
        # K_NEW/V_NEW hold the new keys of Q's rows from new_row0 on (the candidates' at least)
        own = (row0 - new_row0 + m).to(tl.int64)[:, None] * stride_nt + head * stride_nh + d[None, :]
        k_own = activated(tl.load(K_NEW + own, mask=row_ok[:, None], other=0.0)).to(tl.float32)
        v_own = activated(tl.load(V_NEW + own, mask=row_ok[:, None], other=0.0)).to(tl.float32)
        s_own = tl.sum(q.to(tl.float32) * k_own, axis=1)
        # one value a row: a tanh of two packed values cannot apply here
        acc += silu(s_own, 1 if FAST_SILU == 2 else FAST_SILU)[:, None] * v_own
    pages = PAGE_TABLE + user.to(tl.int64) * stride_page_table
    # keys below the block's first position are seen by every row: no mask
    unmasked_end = tl.maximum(key0, tl.minimum(key_end, (pos0 // BLOCK_N) * BLOCK_N))
    for start in range(key0, unmasked_end, BLOCK_N):
        key_pos = start + n
        slot = tl.load(pages + key_pos // PAGE).to(tl.int64) * PAGE + key_pos % PAGE
        offsets = slot[:, None] * stride_kt + head * stride_kh + d[None, :]
        k = tl.load(K + offsets)
        v = tl.load(V + offsets)
        w = silu(tl.dot(q, tl.trans(k)), FAST_SILU)
        acc += tl.dot(w.to(v.dtype), v)
    for start in range(unmasked_end, key_end, BLOCK_N):
        key_pos = start + n
        key_ok = key_pos < key_end
        slot = tl.load(pages + key_pos // PAGE, mask=key_ok, other=0).to(tl.int64) * PAGE + key_pos % PAGE
        offsets = slot[:, None] * stride_kt + head * stride_kh + d[None, :]
        k = tl.load(K + offsets, mask=key_ok[:, None], other=0.0)
        v = tl.load(V + offsets, mask=key_ok[:, None], other=0.0)
        w = silu(tl.dot(q, tl.trans(k)), FAST_SILU)
        w = tl.where((key_pos[None, :] <= query_pos[:, None]) & key_ok[None, :], w, 0.0)
        acc += tl.dot(w.to(v.dtype), v)
    acc = acc * scale
    # SPLIT: items may share rows. The only item of its rows writes them to OUT; a chunk of a split
    # adds its part into ACC (zeroed before by split_rows_zero, written out by split_rows_finish).
    if SPLIT and chunk:
        acc_at, ok = _rows(ACC, row0, rows, stride_at, stride_ah, BLOCK_M, HEAD_DIM)
        tl.atomic_add(acc_at, acc, mask=ok)
    else:
        out_at, ok = _rows(OUT, row0, rows, stride_ot, stride_oh, BLOCK_M, HEAD_DIM)
        tl.store(out_at, acc.to(OUT.dtype.element_ty), mask=ok)
