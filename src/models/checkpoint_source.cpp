// CheckpointSource: an HF checkpoint's tensors; in a dry run, FP8 weights as zero views.
#include "core/zero_pages.h"
#include "models/weight_source.h"

namespace sluice {

Tensor CheckpointSource::get(const std::string& name) {
  if (!dry_run_ || !ck_.fp8(name)) return ck_.get(name);
  // A dry run never reads values (values_needed): the dequantized weight's dtype and shape
  // over zero pages, without reading or dequantizing its blocks.
  const SafetensorsEntry& e = ck_.entry(name);
  ck_.consume(name);
  Tensor t;
  t.dtype = ck_.fp8_dtype();
  t.shape[0] = e.shape[0];
  t.shape[1] = e.shape[1];
  t.ndim = 2;
  t.storage = zero_pages(static_cast<size_t>(e.shape[0] * e.shape[1]) * dtype_size(t.dtype));
  t.data = t.storage.get();
  return t;
}

}  // namespace sluice
