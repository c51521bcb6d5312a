"""mla_decode and merge_states against the float64 references in reference.py: a sequence striped
over N ranks, attended per rank and merged equals attention over the whole sequence, for every
mask, both cache dtypes, N not a power of two, contexts shorter than N (empty shards) and
partial last pages."""
import re

import numpy as np
import pytest

import dcp
import reference as ref

KV_LORA = 16
ROPE = 8
WIDTH = KV_LORA + ROPE


def stripe(latents, n, interleave, page_size, rng, bits=None):
    """Each request's latent rows [S_b, W] laid out over n ranks: per rank a page pool (pages of
    all requests, shuffled) and a page table. `bits`: the same rows as bf16 bits (uint16)."""
    pools, tables = [], []
    for r in range(n):
        local = [[p for p in range(len(lat)) if dcp.owner(p, n, interleave) == r] for lat in latents]
        pages_each = [max(1, -(-len(rows) // page_size)) for rows in local]
        total = sum(pages_each)
        order = rng.permutation(total)
        src = latents if bits is None else bits
        pool = np.zeros((total, page_size, WIDTH), dtype=src[0].dtype)
        table = np.full((len(latents), max(pages_each)), -1, dtype=np.int32)
        k = 0
        for b, rows in enumerate(local):
            for j in range(pages_each[b]):
                table[b, j] = order[k]
                k += 1
            for p in rows:
                j = dcp.row(p, n, interleave)
                pool[table[b, j // page_size], j % page_size] = src[b][p]
        pools.append(pool)
        tables.append(table)
    return pools, tables


def striped_attention(q, latents, query_lens, n, interleave, page_size, rng, kv_dtype="fp32",
                      **masks):
    bits = [ref.bf16_bits(l) for l in latents] if kv_dtype == "bf16" else None
    pools, tables = stripe(latents, n, interleave, page_size, rng, bits)
    seq_lens = np.array([len(l) for l in latents], dtype=np.int64)
    o_parts, lse_parts = [], []
    for r in range(n):
        kw = dict(masks)
        if r != 0:
            kw.pop("sinks", None)  # a sink counts once per group
        o, lse = dcp.mla_decode(q, pools[r], tables[r], seq_lens, scale=0.3, kv_lora_rank=KV_LORA,
                                query_lens=np.array(query_lens, dtype=np.int64), dcp_size=n,
                                dcp_rank=r, interleave=interleave, **kw)
        o_parts.append(o)
        lse_parts.append(lse)
    return dcp.merge_states(np.stack(o_parts), np.stack(lse_parts))


def full_attention(q, latents, query_lens, kv_dtype="fp32", **masks):
    outs, lses = [], []
    t = 0
    for b, lat in enumerate(latents):
        rows = ref.bf16_values(ref.bf16_bits(lat)) if kv_dtype == "bf16" else lat
        for i in range(query_lens[b]):
            q_pos = len(lat) - query_lens[b] + i
            topk = masks.get("topk")
            o, lse = ref.attention(q[t], rows, q_pos, 0.3, KV_LORA,
                                   causal=masks.get("causal", True), window=masks.get("window", 0),
                                   softcap=masks.get("softcap", 0.0), sinks=masks.get("sinks"),
                                   topk=None if topk is None else topk[t])
            outs.append(o)
            lses.append(lse)
            t += 1
    return np.array(outs), np.array(lses)


MASKS = {
    "causal": {},
    "no_causal": {"causal": False},
    "window": {"window": 5},
    "softcap": {"softcap": 2.0},
    "sinks": {"sinks": np.array([0.5, -1.0, -np.inf], dtype=np.float32)},
    "topk": "topk",
}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("n,interleave,page_size", [(1, 1, 4), (2, 1, 1), (3, 1, 4), (5, 2, 4),
                                                    (4, 3, 3)])
@pytest.mark.parametrize("kv_dtype", ["fp32", "bf16"])
def test_striped_then_merged_equals_full_attention(mask, n, interleave, page_size, kv_dtype):
    rng = np.random.default_rng(hash((mask, n, interleave, page_size, kv_dtype)) % 2**32)
    heads = 3
    seq_lens = [1, 2, n + 1, 17, 40]  # shorter than N: empty shards; 17, 40: partial pages
    query_lens = [1, 1, 2, 3, 1]  # several query tokens: verification
    latents = [rng.standard_normal((s, WIDTH)).astype(np.float32) for s in seq_lens]
    tokens = sum(query_lens)
    q = rng.standard_normal((tokens, heads, WIDTH)).astype(np.float32)
    masks = MASKS[mask]
    if masks == "topk":
        topk = np.full((tokens, 6), -1, dtype=np.int32)
        t = 0
        for b, s in enumerate(seq_lens):
            for i in range(query_lens[b]):
                pick = rng.choice(s, size=min(4, s), replace=False)
                topk[t, :len(pick)] = pick
                t += 1
        masks = {"topk": topk}
    o, lse = striped_attention(q, latents, query_lens, n, interleave, page_size, rng, kv_dtype,
                               **masks)
    want_o, want_lse = full_attention(q, latents, query_lens, kv_dtype, **masks)
    assert o.shape == want_o.shape and lse.shape == want_lse.shape
    assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse))
    finite = ~np.isneginf(want_lse)
    np.testing.assert_allclose(lse[finite], want_lse[finite], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(o, want_o, rtol=1e-4, atol=2e-5)


def test_decode_defaults_to_one_token_per_request():
    rng = np.random.default_rng(1)
    latents = [rng.standard_normal((s, WIDTH)).astype(np.float32) for s in (3, 9)]
    pools, tables = stripe(latents, 1, 1, 4, rng)
    q = rng.standard_normal((2, 2, WIDTH)).astype(np.float32)
    o, lse = dcp.mla_decode(q, pools[0], tables[0], np.array([3, 9]), scale=0.3,
                            kv_lora_rank=KV_LORA)
    want_o, want_lse = full_attention(q, latents, [1, 1])
    np.testing.assert_allclose(o, want_o, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5)


@pytest.mark.parametrize("base", ["e", "2"])
def test_merge_states_against_reference(base):
    rng = np.random.default_rng(7)
    parts, rows, dim = 4, 6, 5
    o = rng.standard_normal((parts, rows, dim)).astype(np.float32)
    lse = (rng.standard_normal((parts, rows)) * 3).astype(np.float32)
    lse[1, 2] = -np.inf  # an empty shard
    lse[:, 4] = -np.inf  # a row empty everywhere
    lse[2, 5] = np.nan  # treated as empty
    o[1, 2] = np.nan  # an empty shard's output is never read
    got_o, got_lse = dcp.merge_states(o, lse, lse_base=base)
    want_o, want_lse = ref.merge(o, lse, base)
    assert np.isneginf(got_lse[4]) and np.all(got_o[4] == 0)
    finite = ~np.isneginf(want_lse)
    np.testing.assert_allclose(got_lse[finite], want_lse[finite], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got_o, want_o, rtol=1e-5, atol=1e-6)


def test_merge_states_keeps_leading_shape():
    o = np.zeros((2, 3, 4, 8), dtype=np.float32)
    lse = np.zeros((2, 3, 4), dtype=np.float32)
    got_o, got_lse = dcp.merge_states(o, lse)
    assert got_o.shape == (3, 4, 8) and got_lse.shape == (3, 4)
    np.testing.assert_allclose(got_lse, np.log(2.0), rtol=1e-6)


def _one_request():
    rng = np.random.default_rng(3)
    latents = [rng.standard_normal((10, WIDTH)).astype(np.float32)]
    pools, tables = stripe(latents, 1, 1, 4, rng)
    q = rng.standard_normal((1, 2, WIDTH)).astype(np.float32)
    return q, pools[0], tables[0], np.array([10], dtype=np.int64)


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(q=a["q"].astype(np.float64)), "q must be float32"),
    (lambda a: a.update(kv_pool=a["kv_pool"].astype(np.float64)), "kv_pool must be float32 or bfloat16"),
    (lambda a: a.update(page_table=a["page_table"].astype(np.int64)), "page_table must be int32"),
    (lambda a: a.update(seq_lens=a["seq_lens"].astype(np.int32)), "seq_lens must be int64"),
    (lambda a: a.update(q=a["q"][0]), "q must have 3 dimensions"),
    (lambda a: a.update(q=np.ascontiguousarray(a["q"][:, :, :-1])), "kv_pool has shape"),
    (lambda a: a.update(kv_pool=a["kv_pool"][::2]), "kv_pool must be C-contiguous"),
    (lambda a: a.update(page_table=np.full_like(a["page_table"], 99)), "is outside the pool"),
    (lambda a: a.update(seq_lens=np.array([1000], dtype=np.int64)), "local_len[0] = 1000"),
    (lambda a: a.update(seq_lens=np.array([10, 10], dtype=np.int64)), "page_table has shape"),
    (lambda a: a.update(scale=-1.0), "softmax_scale"),
    (lambda a: a.update(kv_lora_rank=99), "kv_lora_rank = 99"),
    (lambda a: a.update(dcp_rank=1), "dcp_rank"),
    (lambda a: a.update(window=-1), "window = -1"),
    (lambda a: a.update(kernel="fastest"), "portable"),
    (lambda a: a.update(num_threads=0), "num_threads = 0"),
    (lambda a: a.update(query_lens=np.array([11], dtype=np.int64)), "query_lens = 11"),
    (lambda a: a.update(q=[[1.0]]), "q must be a numpy array or a torch tensor"),
    (lambda a: a.update(window=2.5), "window = 2.5 must be an integer"),
    (lambda a: a.update(causal="no"), "causal = 'no' must be True or False"),
    (lambda a: a.update(scale="0.3"), "scale = '0.3' must be a number"),
])
def test_bad_arguments_raise_value_error(change, message):
    q, pool, table, seq_lens = _one_request()
    args = dict(q=q, kv_pool=pool, page_table=table, seq_lens=seq_lens, scale=0.3,
                kv_lora_rank=KV_LORA)
    change(args)
    with pytest.raises(ValueError, match=re.escape(message)):
        dcp.mla_decode(**args)


def test_merge_bad_arguments_raise_value_error():
    o = np.zeros((2, 3, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="float32"):
        dcp.merge_states(o.astype(np.float64), np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="without its last dimension"):
        dcp.merge_states(o, np.zeros((2, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="lse_base"):
        dcp.merge_states(o, np.zeros((2, 3), dtype=np.float32), lse_base="10")
    with pytest.raises(ValueError, match="at least one part"):
        dcp.merge_states(np.zeros((0, 3, 4), dtype=np.float32), np.zeros((0, 3), dtype=np.float32))


def test_every_kernel_path_agrees():
    rng = np.random.default_rng(11)
    latents = [rng.standard_normal((70, WIDTH)).astype(np.float32)]
    pools, tables = stripe(latents, 1, 1, 16, rng)
    q = rng.standard_normal((1, 4, WIDTH)).astype(np.float32)
    want_o, want_lse = full_attention(q, latents, [1])
    for path in dcp.kernel_paths():
        o, lse = dcp.mla_decode(q, pools[0], tables[0], np.array([70]), scale=0.3,
                                kv_lora_rank=KV_LORA, kernel=path)
        np.testing.assert_allclose(o, want_o, rtol=1e-4, atol=2e-5, err_msg=path)
        np.testing.assert_allclose(lse, want_lse, rtol=1e-5, err_msg=path)
