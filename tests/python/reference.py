"""float64 numpy references, written independently of the C++ library: attention over a whole
latent sequence with every mask, the merge of partial states, and bf16 rounding."""
import numpy as np


def bf16_bits(x):
    """float32 values -> their bf16 bits (round to nearest even), as uint16."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_values(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def attention(q, latent, q_pos, scale, kv_lora_rank, causal=True, window=0, softcap=0.0,
              sinks=None, topk=None):
    """q [H, W] for one token at global position q_pos; latent [S, W] the whole sequence.
    Returns (o [H, kv_lora_rank], lse [H]) in float64; no visible row: o = 0, lse = -inf."""
    q = q.astype(np.float64)
    kv = latent.astype(np.float64)
    seq = kv.shape[0]
    pos = np.arange(seq)
    visible = np.ones(seq, dtype=bool)
    if causal:
        visible &= pos <= q_pos
    if window > 0:
        visible &= q_pos - pos < window
    if topk is not None:
        chosen = np.zeros(seq, dtype=bool)
        for p in topk:
            if 0 <= p < seq:
                chosen[p] = True
        visible &= chosen
    heads = q.shape[0]
    o = np.zeros((heads, kv_lora_rank))
    lse = np.full(heads, -np.inf)
    s = (q @ kv[visible].T) * scale  # [H, rows]
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    for h in range(heads):
        terms = list(s[h])
        if sinks is not None:
            terms.append(float(sinks[h]))
        if not terms or max(terms) == -np.inf:
            continue
        m = max(terms)
        z = sum(np.exp(t - m) for t in terms)
        lse[h] = m + np.log(z)
        if s.shape[1]:
            o[h] = np.exp(s[h] - lse[h]) @ kv[visible][:, :kv_lora_rank]
    return o, lse


def merge(o_parts, lse_parts, base="e"):
    """o_parts [K, rows, dim], lse_parts [K, rows] -> (o [rows, dim], lse [rows]) in float64."""
    lse = lse_parts.astype(np.float64) * (np.log(2.0) if base == "2" else 1.0)
    lse = np.where(np.isnan(lse) | (lse == np.inf), -np.inf, lse)
    o_parts = o_parts.astype(np.float64)
    rows, dim = o_parts.shape[1], o_parts.shape[2]
    out = np.zeros((rows, dim))
    out_lse = np.full(rows, -np.inf)
    for r in range(rows):
        m = lse[:, r].max()
        if m == -np.inf:
            continue
        w = np.exp(lse[:, r] - m)
        out_lse[r] = m + np.log(w.sum())
        for k in range(o_parts.shape[0]):
            if w[k] > 0:
                out[r] += (w[k] / w.sum()) * o_parts[k, r]
    return out, out_lse
