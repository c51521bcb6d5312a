"""Decode Context Parallelism for MLA attention: the C++ core of dcp, from Python.

- Layout: ``owner``, ``row``, ``local_count``, ``position``, ``chunk_share`` (ints or int arrays).
- ``topology(tp_size, dcp_size, ...)``: the resolved rank groups, as ``dcp topology --json``.
- ``mla_decode(q, kv_pool, page_table, seq_lens, scale=...) -> (o, lse)``: local absorbed-MLA
  attention over one rank's paged latent cache, fp32 or bf16.
- ``merge_states(o_parts, lse_parts) -> (o, lse)``: the exact merge of partial results.
- ``LLM(model=..., tp_size=..., dcp_size=...).generate(prompts, SamplingParams(...))``: offline
  generation, ranks as threads of this process.
- ``parse_tool_calls(text, format) -> (content, calls)``: a reply's tool calls, as ``dcp serve``
  reads them (formats ``deepseek_v3``, ``kimi_k2``, ``minicpm3``).

Arrays are numpy arrays or CPU torch tensors (bf16 included: numpy has no bf16, so a bf16 cache
may also be passed as its bits in a uint16 array). Inputs are read in place, never copied; a
wrong dtype, shape or a non-contiguous array raises ValueError. Outputs are numpy arrays, or
torch tensors sharing their memory when the query was a torch tensor. Every kernel releases the
GIL while it runs.
"""
from ._arrays import as_kernel_array, like_input
from ._numbers import boolean, integer, real
from ._layout import chunk_share, local_count, owner, position, row, topology
from ._llm import (LLM, CompletionOutput, GuidedDecodingParams, Logprob, RequestOutput,
                   SamplingParams, StructuredOutputsParams)
from . import _dcp

__all__ = ["owner", "row", "local_count", "position", "chunk_share", "topology", "mla_decode",
           "merge_states", "kernel_paths", "LLM", "SamplingParams", "GuidedDecodingParams", "StructuredOutputsParams",
           "RequestOutput", "CompletionOutput", "Logprob", "parse_tool_calls"]

kernel_paths = _dcp.kernel_paths


def parse_tool_calls(text, format):
    """The tool calls in a reply's text (decoded with special tokens kept), as ``dcp serve``
    reads them for tool_choice "auto": returns (content, calls), the text outside the calls and a
    list of {"id", "name", "arguments"} dicts, arguments being JSON text. A block that does not
    read as calls is content, whole. format: "deepseek_v3", "kimi_k2" or "minicpm3"."""
    if not isinstance(text, str) or not isinstance(format, str):
        raise ValueError("parse_tool_calls takes the reply's text and the format's name (strings)")
    return _dcp._parse_tool_calls(text, format)

__version__ = _dcp.__version__  # the C++ library's, as `dcp --version` prints it


def mla_decode(q, kv_pool, page_table, seq_lens, *, scale, kv_lora_rank=512, query_lens=None,
               dcp_size=1, dcp_rank=0, interleave=1, causal=True, window=0, softcap=0.0,
               sinks=None, topk=None, num_threads=1, kernel="automatic"):
    """Local absorbed-MLA attention over one rank's shard of a paged latent KV cache.

    q          [T, H, W] float32: per query token and head, q_nope absorbed through w_kc (the
               first kv_lora_rank columns) then q_pe (the rest). T = sum(query_lens), one token
               per request by default (decode). A bf16 q is widened to float32 first (a copy).
    kv_pool    [num_pages, page_size, W] float32 or bfloat16: latent rows c_kv | k_pe.
    page_table [B, max_pages] int32: the physical page of local rows [j*page_size, (j+1)*page_size).
    seq_lens   [B] int64: each sequence's global length, its query tokens included; this rank
               holds local_count(seq_len, dcp_rank, dcp_size, interleave) rows of it.
    scale      the softmax scale multiplying q.k.
    Masks on global positions: causal, window (> 0: the last `window` positions), softcap
    (> 0: softcap * tanh(s / softcap)), sinks ([H] float32 natural-log logits added to this
    shard's denominator), topk ([T, k] int32 positions, -1 = none; other ranks' positions skipped).
    Returns (o [T, H, kv_lora_rank] float32, lse [T, H] float32 natural log); a token with no
    visible row gets o = 0, lse = -inf.
    """
    qa = as_kernel_array(q, "q", widen_bf16=True)
    args = _dcp._decode_args(
        qa, as_kernel_array(kv_pool, "kv_pool"), as_kernel_array(page_table, "page_table"),
        as_kernel_array(seq_lens, "seq_lens"),
        None if query_lens is None else as_kernel_array(query_lens, "query_lens"),
        real(scale, "scale"), integer(kv_lora_rank, "kv_lora_rank"),
        integer(dcp_size, "dcp_size"), integer(dcp_rank, "dcp_rank"),
        integer(interleave, "interleave"), boolean(causal, "causal"), integer(window, "window"),
        real(softcap, "softcap"), None if sinks is None else as_kernel_array(sinks, "sinks"),
        None if topk is None else as_kernel_array(topk, "topk"),
        integer(num_threads, "num_threads"), str(kernel))
    o, lse = _dcp._mla_decode(args)
    return like_input(q, o), like_input(q, lse)


def merge_states(o_parts, lse_parts, lse_base="e"):
    """Exact merge of K partial attention states.

    o_parts [K, rows..., dim] float32 and lse_parts [K, rows...] float32 in base `lse_base`
    ("e" or "2"). An empty part is (o = anything, lse = -inf); NaN and +inf LSEs count as empty.
    Returns (o [rows..., dim], lse [rows...] natural log); rows where every part is empty get
    o = 0, lse = -inf.
    """
    o, lse = _dcp._merge_states(as_kernel_array(o_parts, "o_parts"),
                                as_kernel_array(lse_parts, "lse_parts"), str(lse_base))
    return like_input(o_parts, o), like_input(o_parts, lse)
