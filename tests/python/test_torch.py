"""torch tensors in and out (fp32 and bf16, shared memory, non-contiguous and wrong dtypes
refused), and the GIL released while kernels and generate() run."""
import threading
import time

import numpy as np
import pytest

import dcp
import reference as ref

torch = pytest.importorskip("torch")

WIDTH, KV_LORA = 24, 16


def _case(context=40, heads=4, page_size=8, seed=5):
    rng = np.random.default_rng(seed)
    latent = rng.standard_normal((context, WIDTH)).astype(np.float32)
    pages = -(-context // page_size)
    pool = np.zeros((pages, page_size, WIDTH), dtype=np.float32)
    pool.reshape(-1, WIDTH)[:context] = latent
    table = np.arange(pages, dtype=np.int32)[None, :]
    q = rng.standard_normal((1, heads, WIDTH)).astype(np.float32)
    return q, latent, pool, table, np.array([context], dtype=np.int64)


def test_fp32_tensors_in_tensors_out():
    q, latent, pool, table, seq = _case()
    o, lse = dcp.mla_decode(torch.from_numpy(q), torch.from_numpy(pool), torch.from_numpy(table),
                            torch.from_numpy(seq), scale=0.25, kv_lora_rank=KV_LORA)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.float32 and o.shape == (1, 4, KV_LORA)
    want_o, want_lse = ref.attention(q[0], latent, 39, 0.25, KV_LORA)
    np.testing.assert_allclose(o[0].numpy(), want_o, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(lse[0].numpy(), want_lse, rtol=1e-5)


def test_bf16_cache_as_tensor_or_uint16_bits_is_read_in_place():
    q, latent, pool, table, seq = _case()
    pool_bf16 = torch.from_numpy(pool).to(torch.bfloat16)
    bits = pool_bf16.view(torch.int16).numpy().view(np.uint16)  # the same memory
    o_t, lse_t = dcp.mla_decode(torch.from_numpy(q), pool_bf16, table, seq, scale=0.25,
                                kv_lora_rank=KV_LORA)
    o_n, lse_n = dcp.mla_decode(q, bits, table, seq, scale=0.25, kv_lora_rank=KV_LORA)
    assert np.array_equal(o_t.numpy(), o_n) and np.array_equal(lse_t.numpy(), lse_n)
    rounded = pool_bf16.float().numpy().reshape(-1, WIDTH)[:40]
    want_o, want_lse = ref.attention(q[0], rounded, 39, 0.25, KV_LORA)
    np.testing.assert_allclose(o_n[0], want_o, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(lse_n[0], want_lse, rtol=1e-5)
    # Our bf16 rounding agrees with torch's.
    assert np.array_equal(ref.bf16_bits(pool), bits)


def test_bf16_query_is_widened():
    q, latent, pool, table, seq = _case()
    q_bf16 = torch.from_numpy(q).to(torch.bfloat16)
    o, lse = dcp.mla_decode(q_bf16, pool, table, seq, scale=0.25, kv_lora_rank=KV_LORA)
    want_o, _ = ref.attention(q_bf16.float().numpy()[0], latent, 39, 0.25, KV_LORA)
    np.testing.assert_allclose(o[0].numpy(), want_o, rtol=1e-4, atol=2e-5)


def test_merge_states_with_tensors():
    gen = torch.Generator().manual_seed(3)
    o = torch.randn(3, 5, 8, generator=gen)
    lse = torch.randn(3, 5, generator=gen)
    got_o, got_lse = dcp.merge_states(o, lse)
    want_o, want_lse = ref.merge(o.numpy(), lse.numpy())
    np.testing.assert_allclose(got_o.numpy(), want_o, rtol=1e-5, atol=1e-6)
    # A merged LSE near zero still carries the fp32 rounding of its terms (up to a few units):
    # an absolute bound, as test_kernels.py's merge test has.
    np.testing.assert_allclose(got_lse.numpy(), want_lse, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(kv_pool=a["kv_pool"].transpose(0, 1)), "kv_pool must be C-contiguous"),
    (lambda a: a.update(q=a["q"][:, ::2]), "q must be C-contiguous"),
    (lambda a: a.update(kv_pool=a["kv_pool"].double()), "kv_pool must be float32 or bfloat16"),
    (lambda a: a.update(kv_pool=a["kv_pool"].half()), "kv_pool must be float32 or bfloat16"),
    (lambda a: a.update(page_table=a["page_table"].long()), "page_table must be int32"),
    (lambda a: a.update(q=a["q"].reshape(-1)), "q must have 3 dimensions"),
    (lambda a: a.update(q=a["q"].requires_grad_(False)[:, :2].clone()[:, :, :8].contiguous()),
     "kv_pool has shape"),
])
def test_bad_tensors_raise(change, message):
    q, _, pool, table, seq = _case()
    args = dict(q=torch.from_numpy(q), kv_pool=torch.from_numpy(pool),
                page_table=torch.from_numpy(table), seq_lens=torch.from_numpy(seq))
    change(args)
    with pytest.raises(ValueError) as e:
        dcp.mla_decode(**args, scale=0.25, kv_lora_rank=KV_LORA if message != "kv_pool has shape"
                       else 4)
    assert message in str(e.value)


def _count_until(event):
    count = 0
    while not event.is_set():
        count += 1
    return count


def _iterations_per_second(start_other):
    """How fast this thread counts until an event that `start_other(event)` sets from another
    thread."""
    done = threading.Event()
    start = time.perf_counter()
    other = start_other(done)
    count = _count_until(done)
    seconds = time.perf_counter() - start
    other.join()
    return count / seconds


def _share_of_time_this_thread_ran(call):
    """While `call` runs in another thread, how fast a Python loop runs here, as a fraction of
    its speed beside a thread that only sleeps: near 1 when `call` lets go of the GIL, near 0
    when it holds it."""
    def sleeper(done):
        t = threading.Timer(0.3, done.set)
        t.start()
        return t

    def caller(done):
        t = threading.Thread(target=lambda: (call(), done.set()))
        t.start()
        return t

    return _iterations_per_second(caller) / _iterations_per_second(sleeper)


def _long_decode_case():
    # 128 heads over a 64K-token context: about 75 MB of bf16 cache read per call.
    rng = np.random.default_rng(0)
    context, page = 65536, 64
    pool = torch.from_numpy(rng.standard_normal((context // page, page, 576), dtype=np.float32))
    pool = pool.to(torch.bfloat16)
    table = np.arange(context // page, dtype=np.int32)[None, :]
    q = rng.standard_normal((1, 128, 576)).astype(np.float32)
    return q, pool, table, np.array([context], dtype=np.int64)


def test_gil_is_released_during_mla_decode():
    q, pool, table, seq = _long_decode_case()
    start = time.perf_counter()
    dcp.mla_decode(q, pool, table, seq, scale=0.04)
    seconds = time.perf_counter() - start
    assert seconds > 0.02, f"a call of {seconds:.3f} s is too short to tell"
    share = _share_of_time_this_thread_ran(
        lambda: [dcp.mla_decode(q, pool, table, seq, scale=0.04) for _ in range(3)])
    assert share > 0.3, f"this thread ran at {share:.2f} of its speed during the kernel calls"


def test_the_gil_check_sees_a_call_that_holds_the_gil():
    # The measurement above must be able to fail: a C loop that keeps the GIL (sum over a range).
    share = _share_of_time_this_thread_ran(lambda: sum(range(3 * 10**7)))
    assert share < 0.3, f"share {share:.2f} while the GIL was held"
