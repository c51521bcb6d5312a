// The kernels: local absorbed-MLA attention over a paged latent cache, and the exact merge of
// partial (O, LSE) states. Arguments are checked here (dtypes, ranks, contiguity, shapes) and by
// the library (values: page ids, lengths, masks); the GIL is released while a kernel runs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "arrays.h"
#include "bindings.h"
#include "dcp/attention.h"
#include "dcp/layout.h"
#include "dcp/merge.h"

namespace dcp::python {
namespace {

struct DecodeArgs {
  py::array q, kv, page_table, seq_lens;
  std::optional<py::array> query_lens, sinks, topk;
  double scale = 0;
  int kv_lora_rank = 512;
  int dcp_size = 1, dcp_rank = 0, interleave = 1;
  bool causal = true;
  std::int64_t window = 0;
  double softcap = 0;
  int num_threads = 1;
  std::string kernel = "automatic";
};

// Everything the kernel reads, owned here: the parameters point into these vectors and into
// the caller's arrays, which stay alive for the call.
struct PreparedDecode {
  MlaAttentionParams params;
  std::vector<std::int32_t> q_start;
  std::vector<std::int64_t> q_pos, local_len;
  std::int64_t tokens = 0;
};

PreparedDecode prepare(const DecodeArgs& a) {
  PreparedDecode p;
  require<float>(a.q, "q", 3, "float32");
  const bool bf16 = has_dtype<std::uint16_t>(a.kv);
  if (!bf16 && !has_dtype<float>(a.kv)) {
    throw py::value_error("kv_pool must be float32 or bfloat16 (torch.bfloat16, or its bits as "
                          "numpy uint16), got " + std::string(py::str(a.kv.dtype())));
  }
  require_layout(a.kv, "kv_pool", 3);
  require<std::int32_t>(a.page_table, "page_table", 2, "int32");
  require<std::int64_t>(a.seq_lens, "seq_lens", 1, "int64");
  const py::ssize_t width = a.q.shape(2);
  if (a.kv_lora_rank < 1 || a.kv_lora_rank > width) {
    throw py::value_error("kv_lora_rank = " + std::to_string(a.kv_lora_rank) +
                          " must be in [1, q.shape[2] = " + std::to_string(width) + "]");
  }
  require_dim(a.kv, "kv_pool", 2, width, "the latent row width, q.shape[2]");
  const py::ssize_t batch = a.seq_lens.shape(0);
  require_dim(a.page_table, "page_table", 0, batch, "one row per request, len(seq_lens)");

  // Query tokens per request: one each (decode) unless query_lens says otherwise.
  p.q_start.assign(static_cast<std::size_t>(batch) + 1, 0);
  const std::int64_t* seq = a.seq_lens.unchecked<std::int64_t, 1>().data(0);
  std::vector<std::int64_t> qlen(static_cast<std::size_t>(batch), 1);
  if (a.query_lens) {
    require<std::int64_t>(*a.query_lens, "query_lens", 1, "int64");
    require_dim(*a.query_lens, "query_lens", 0, batch, "one per request, len(seq_lens)");
    const std::int64_t* ql = a.query_lens->unchecked<std::int64_t, 1>().data(0);
    std::copy_n(ql, batch, qlen.begin());
  }
  for (py::ssize_t b = 0; b < batch; ++b) {
    if (qlen[b] < 1 || qlen[b] > seq[b]) {
      throw py::value_error("request " + std::to_string(b) + ": query_lens = " +
                            std::to_string(qlen[b]) + " must be in [1, seq_lens = " +
                            std::to_string(seq[b]) + "]");
    }
    p.q_start[b + 1] = static_cast<std::int32_t>(p.q_start[b] + qlen[b]);
    if (p.q_start[b + 1] - p.q_start[b] != qlen[b]) throw py::value_error("query_lens too large");
  }
  p.tokens = p.q_start[batch];
  require_dim(a.q, "q", 0, p.tokens, "query tokens: sum(query_lens), one per request by default");
  if (a.dcp_size < 1 || a.dcp_rank < 0 || a.dcp_rank >= a.dcp_size || a.interleave < 1) {
    throw py::value_error("dcp_size = " + std::to_string(a.dcp_size) + ", dcp_rank = " +
                          std::to_string(a.dcp_rank) + ", interleave = " +
                          std::to_string(a.interleave) +
                          ": need dcp_size >= 1, 0 <= dcp_rank < dcp_size, interleave >= 1");
  }
  // Query positions are global: the last query_lens tokens of each sequence. The shard holds the
  // layout's count of the global length.
  p.q_pos.resize(static_cast<std::size_t>(p.tokens));
  p.local_len.resize(static_cast<std::size_t>(batch));
  for (py::ssize_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < qlen[b]; ++i) p.q_pos[p.q_start[b] + i] = seq[b] - qlen[b] + i;
    p.local_len[b] = layout::count(seq[b], a.dcp_rank, a.dcp_size, a.interleave);
  }

  MlaAttentionParams& m = p.params;
  m.num_heads = static_cast<int>(a.q.shape(1));
  m.kv_lora_rank = a.kv_lora_rank;
  m.rope_dim = static_cast<int>(width - a.kv_lora_rank);
  m.softmax_scale = static_cast<float>(a.scale);
  m.num_requests = static_cast<int>(batch);
  m.q_start = p.q_start.data();
  m.q = static_cast<const float*>(a.q.data());
  m.q_pos = p.q_pos.data();
  m.kv = a.kv.data();
  m.kv_dtype = bf16 ? KvDtype::bf16 : KvDtype::fp32;
  m.num_pages = a.kv.shape(0);
  m.page_size = static_cast<int>(a.kv.shape(1));
  m.page_table = static_cast<const std::int32_t*>(a.page_table.data());
  m.page_table_stride = static_cast<int>(a.page_table.shape(1));
  m.local_len = p.local_len.data();
  m.dcp_size = a.dcp_size;
  m.dcp_rank = a.dcp_rank;
  m.interleave = a.interleave;
  m.causal = a.causal;
  m.window = a.window;
  m.softcap = static_cast<float>(a.softcap);
  if (a.sinks) {
    require<float>(*a.sinks, "sinks", 1, "float32");
    require_dim(*a.sinks, "sinks", 0, m.num_heads, "one per head, q.shape[1]");
    m.sinks = static_cast<const float*>(a.sinks->data());
  }
  if (a.topk) {
    require<std::int32_t>(*a.topk, "topk", 2, "int32");
    require_dim(*a.topk, "topk", 0, p.tokens, "one row per query token, q.shape[0]");
    m.topk = static_cast<const std::int32_t*>(a.topk->data());
    m.topk_k = static_cast<int>(a.topk->shape(1));
  }
  m.kernel = parse_kernel_path(a.kernel);
  m.num_threads = a.num_threads;
  return p;  // the library validates the values once the outputs exist (mla_attention)
}

py::tuple mla_decode(const DecodeArgs& a) {
  PreparedDecode p = prepare(a);
  MlaAttentionParams& m = p.params;
  py::array_t<float> out({static_cast<py::ssize_t>(p.tokens), static_cast<py::ssize_t>(m.num_heads),
                          static_cast<py::ssize_t>(m.kv_lora_rank)});
  py::array_t<float> lse(
      {static_cast<py::ssize_t>(p.tokens), static_cast<py::ssize_t>(m.num_heads)});
  m.out = out.mutable_data();
  m.lse = lse.mutable_data();
  {
    py::gil_scoped_release unlocked;
    mla_attention(m);  // validates every value first (page ids, lengths, masks)
  }
  return py::make_tuple(out, lse);
}

// The kernel alone, `calls` times in a C++ loop: what a call costs without Python around it
// (the Python benchmark subtracts it from its own per-call time). Returns seconds per call.
double time_mla_decode(const DecodeArgs& a, int calls) {
  if (calls < 1) throw py::value_error("calls must be >= 1");
  PreparedDecode p = prepare(a);
  MlaAttentionParams& m = p.params;
  std::vector<float> out(static_cast<std::size_t>(p.tokens) * m.num_heads * m.kv_lora_rank);
  std::vector<float> lse(static_cast<std::size_t>(p.tokens) * m.num_heads);
  m.out = out.data();
  m.lse = lse.data();
  validate(m);
  py::gil_scoped_release unlocked;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) mla_attention(m);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
}

LseBase parse_base(const std::string& base) {
  if (base == "e") return LseBase::e;
  if (base == "2") return LseBase::two;
  throw py::value_error("lse_base = '" + base + "' must be 'e' (natural log) or '2'");
}

// o_parts [K, rows..., dim], lse_parts [K, rows...] -> (o [rows..., dim], lse [rows...]).
py::tuple merge_states(const py::array& o_parts, const py::array& lse_parts,
                       const std::string& lse_base) {
  const LseBase base = parse_base(lse_base);
  if (!has_dtype<float>(o_parts) || !has_dtype<float>(lse_parts)) {
    throw py::value_error("o_parts and lse_parts must be float32");
  }
  if (o_parts.ndim() < 2 || lse_parts.ndim() != o_parts.ndim() - 1) {
    throw py::value_error("o_parts must be [K, rows..., dim] and lse_parts [K, rows...]: got " +
                          shape_text(o_parts) + " and " + shape_text(lse_parts));
  }
  require_layout(o_parts, "o_parts", static_cast<int>(o_parts.ndim()));
  require_layout(lse_parts, "lse_parts", static_cast<int>(lse_parts.ndim()));
  for (py::ssize_t d = 0; d < lse_parts.ndim(); ++d) {
    if (lse_parts.shape(d) != o_parts.shape(d)) {
      throw py::value_error("lse_parts " + shape_text(lse_parts) + " must be o_parts " +
                            shape_text(o_parts) + " without its last dimension");
    }
  }
  const py::ssize_t parts = o_parts.shape(0);
  if (parts < 1) throw py::value_error("o_parts must hold at least one part (K >= 1)");
  const py::ssize_t dim = o_parts.shape(o_parts.ndim() - 1);
  if (dim < 1 || dim > (1 << 30)) throw py::value_error("o_parts' last dimension must be >= 1");
  std::int64_t rows = 1;
  std::vector<py::ssize_t> out_shape, lse_shape;
  for (py::ssize_t d = 1; d < o_parts.ndim() - 1; ++d) {
    rows *= o_parts.shape(d);
    out_shape.push_back(o_parts.shape(d));
  }
  lse_shape = out_shape;
  out_shape.push_back(dim);
  py::array_t<float> out(out_shape);
  py::array_t<float> lse(lse_shape);
  const float* o = static_cast<const float*>(o_parts.data());
  const float* l = static_cast<const float*>(lse_parts.data());
  float* out_o = out.mutable_data();
  float* out_l = lse.mutable_data();
  {
    py::gil_scoped_release unlocked;
    merge_attention_states(o, l, static_cast<int>(parts), rows, static_cast<int>(dim), base, out_o,
                           out_l);
  }
  return py::make_tuple(out, lse);
}

}  // namespace

void bind_kernels(py::module_& m) {
  auto decode_args = [](py::array q, py::array kv, py::array page_table, py::array seq_lens,
                        std::optional<py::array> query_lens, double scale, int kv_lora_rank,
                        int dcp_size, int dcp_rank, int interleave, bool causal,
                        std::int64_t window, double softcap, std::optional<py::array> sinks,
                        std::optional<py::array> topk, int num_threads, std::string kernel) {
    DecodeArgs a;
    a.q = std::move(q);
    a.kv = std::move(kv);
    a.page_table = std::move(page_table);
    a.seq_lens = std::move(seq_lens);
    a.query_lens = std::move(query_lens);
    a.scale = scale;
    a.kv_lora_rank = kv_lora_rank;
    a.dcp_size = dcp_size;
    a.dcp_rank = dcp_rank;
    a.interleave = interleave;
    a.causal = causal;
    a.window = window;
    a.softcap = softcap;
    a.sinks = std::move(sinks);
    a.topk = std::move(topk);
    a.num_threads = num_threads;
    a.kernel = std::move(kernel);
    return a;
  };
  py::class_<DecodeArgs>(m, "_DecodeArgs");
  m.def("_decode_args", decode_args, py::arg("q"), py::arg("kv_pool"), py::arg("page_table"),
        py::arg("seq_lens"), py::arg("query_lens"), py::arg("scale"), py::arg("kv_lora_rank"),
        py::arg("dcp_size"), py::arg("dcp_rank"), py::arg("interleave"), py::arg("causal"),
        py::arg("window"), py::arg("softcap"), py::arg("sinks"), py::arg("topk"),
        py::arg("num_threads"), py::arg("kernel"));
  m.def("_mla_decode", &mla_decode, py::arg("args"));
  m.def("_time_mla_decode", &time_mla_decode, py::arg("args"), py::arg("calls"));
  m.def("_merge_states", &merge_states, py::arg("o_parts"), py::arg("lse_parts"),
        py::arg("lse_base"));
  m.def("kernel_paths", [] {
    std::vector<std::string> names;
    for (const KernelPath k : available_kernel_paths()) names.emplace_back(to_string(k));
    return names;
  }, "The exact attention paths this CPU runs, slowest first ('portable' is always there).");
}

}  // namespace dcp::python
