#include "ops/cpu/repack.h"

#include <cstring>

#include "core/error.h"
#include "ops/cpu/isa.h"

namespace qwenrt::ops::cpu {

PanelFormat panel_format(DType type) {
  switch (type) {
    case DType::Q4_K:
      return {0, 36, -1};  // d, dmin, scales, qs: 144 bytes
    case DType::Q6_K:
      return {0, 52, 208};  // ql, qh, scales (208 bytes), then d
    case DType::Q8_0:
      return {2, 8, 0};  // d, then 32 codes
    default:
      fail("cpu repack: no panel layout for {}", dtype_name(type));
  }
}

bool can_repack(const TensorView& w) {
  switch (w.dtype) {
    case DType::Q4_K:
    case DType::Q6_K:
    case DType::Q8_0:
      break;
    default:
      return false;
  }
  if (active_isa() < Isa::kAvx512 || w.layout != Layout::kRows) return false;
  if (w.n_dims < 2 || w.n_dims > 3 || w.ne[3] != 1 || w.ne[1] % kPanelRows != 0) return false;
  const int64_t rb = w.row_bytes();
  return w.ne[0] % traits(w.dtype).block_elems == 0 && w.nb[1] == rb && w.nb[2] == rb * w.ne[1];
}

int64_t panel_count(const TensorView& w) {
  return w.ne[2] * (w.ne[1] / kPanelRows);
}

int64_t panel_bytes(const TensorView& w) {
  return kPanelRows * w.nb[1];
}

void write_panels(const TensorView& w, uint8_t* dst, int part, int n_parts, int64_t first,
                  int64_t end) {
  if (!can_repack(w)) fail("cpu repack: cannot repack a {} view", dtype_name(w.dtype));
  const PanelFormat f = panel_format(w.dtype);
  const int64_t block_bytes = traits(w.dtype).block_bytes;
  const int64_t nb = w.ne[0] / traits(w.dtype).block_elems;
  const int64_t record = kPanelRows * block_bytes;
  const auto* src = static_cast<const uint8_t*>(w.data);
  // Panel i of the tensor (expert e = i / panels): rows 16 i .. 16 i + 15 of the 2D slices laid
  // end to end, so its bytes start at 16 i rows in, in either layout.
  if (end < 0) end = panel_count(w);
  if (first < 0 || first > end || end > panel_count(w))
    fail("cpu repack: panels {}..{} of {}", first, end, panel_count(w));
  const int64_t panels = end - first;
  for (int64_t i = first + panels * part / n_parts; i < first + panels * (part + 1) / n_parts;
       ++i) {
    const uint8_t* rows = src + i * kPanelRows * w.nb[1];
    uint8_t* records = dst + i * kPanelRows * w.nb[1];
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* rec = records + b * record;
      for (int r = 0; r < kPanelRows; ++r) {
        const uint8_t* blk = rows + r * w.nb[1] + b * block_bytes;
        for (int d = 0; d < f.n_dw; ++d)
          std::memcpy(rec + (d * kPanelRows + r) * 4, blk + f.dw_begin + 4 * d, 4);
        if (f.f16_at >= 0) std::memcpy(rec + f.n_dw * kPanelRows * 4 + 2 * r, blk + f.f16_at, 2);
      }
    }
  }
}

TensorView panel_view(const TensorView& w, const uint8_t* dst) {
  TensorView out = w;
  out.data = dst;
  out.layout = Layout::kPanels16;
  return out;
}

TensorView repack_panels(const TensorView& w, uint8_t* dst) {
  write_panels(w, dst);
  return panel_view(w, dst);
}

}  // namespace qwenrt::ops::cpu
