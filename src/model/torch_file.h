// A checkpoint file written by torch.save (pytorch_model.bin): a zip archive holding a pickled
// state dict and one entry per storage. Internal to dcp.
#pragma once

#include <string>

#include "tensor_file.h"

namespace dcp::torch_file {

// The state dict's tensors, located in the memory-mapped archive. The pickle is read by a
// restricted unpickler that runs nothing: it knows the few globals a state dict of tensors needs
// (collections.OrderedDict, torch._utils' tensor and parameter rebuilders, torch's storage
// types) and refuses any other by name. Every tensor must be contiguous (row-major) inside its
// storage, and every storage a stored (uncompressed) entry of its declared size.
class File final : public TensorFile {
 public:
  explicit File(const std::string& path);
};

}  // namespace dcp::torch_file
