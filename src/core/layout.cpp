#include "dcp/layout.h"

#include "dcp/error.h"

namespace dcp {

ShardLayout::ShardLayout(int dcp_size, int dcp_rank, int interleave)
    : size_(dcp_size), rank_(dcp_rank), interleave_(interleave) {
  DCP_ARG_CHECK(dcp_size >= 1, "dcp_size = ", dcp_size, " must be >= 1");
  DCP_ARG_CHECK(dcp_rank >= 0 && dcp_rank < dcp_size, "dcp_rank = ", dcp_rank,
                " must be in [0, dcp_size = ", dcp_size, ")");
  DCP_ARG_CHECK(interleave >= 1, "interleave = ", interleave, " must be >= 1");
}

WidenedPages::WidenedPages(int dcp_size, std::int64_t physical_pages, int page_size, int interleave)
    : size_(dcp_size), pages_(physical_pages), page_size_(page_size), interleave_(interleave) {
  DCP_ARG_CHECK(dcp_size >= 1, "dcp_size = ", dcp_size, " must be >= 1");
  DCP_ARG_CHECK(page_size >= 1, "page_size = ", page_size, " must be >= 1");
  DCP_ARG_CHECK(physical_pages >= 0, "physical_pages = ", physical_pages, " must be >= 0");
  DCP_ARG_CHECK(interleave >= 1, "interleave = ", interleave, " must be >= 1");
  DCP_ARG_CHECK(page_size % interleave == 0, "page_size = ", page_size,
                " must be a multiple of interleave = ", interleave);
}

}  // namespace dcp
