// The cpu backend's placed weight layout (Layout::kPanels16): the blocks of each group of 16 rows
// interleaved so that the AVX-512 tile kernels (matmul_gemm_avx512.cpp) read a panel with plain
// loads instead of 16-row gathers. Same bytes, another order: a decode step reads exactly what it
// read from the file.
//
// A 2D slice [in, out] (out a multiple of 16) becomes panels p = 0 .. out/16 - 1, one after the
// other; panel p holds the nb = in / block_elems blocks of rows 16p .. 16p + 15 as nb records of
// 16 * block_bytes bytes. A record is the blocks' 4-byte words interleaved by row,
//   word[w][r] = bytes [dw_begin + 4w, dw_begin + 4w + 4) of row r's block   (n_dw words),
// then, for the types whose fp16 scale sits outside those words, scale[r] (16 fp16 values).
// A prefix of the rows that is a multiple of 16 is still a valid view, and so is any row range
// whose panels are whole in memory (the kernels mask rows past the view's end).
// A 3D expert tensor is repacked expert by expert (each expert's slice stays where it was); the
// backend's place() does not repack routed experts today (cpu_ops.cpp says why).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace qwenrt::ops::cpu {

inline constexpr int kPanelRows = 16;

struct PanelFormat {
  int dw_begin;  // first byte of the interleaved words in a block
  int n_dw;      // words per block
  int f16_at;    // byte of the fp16 scale kept apart (after the words), or -1
};
// The record format of a type the panel kernels read: Q4_K, Q6_K, Q8_0 (the types with fused
// few-token kernels; others stay in the row layout).
PanelFormat panel_format(DType type);

// Whether a view can take the panel layout: a type above, rows contiguous, out a multiple of 16,
// and the kernels run at the AVX-512 VNNI level (active_isa(): a test that lowers the level keeps
// the row layout; a placed weight is read by the AVX-512 kernels whatever the level later).
bool can_repack(const TensorView& w);

// Writes w's bytes in the panel layout into dst (the view's total bytes, 64-byte aligned): part
// `part` of `n_parts` writes its share of the panels, so a thread pool can split the work. With
// `first` and `end`, only panels [first, end) (panel i: 16 rows, starting 16 i rows into both the
// source and dst); end < 0: to the last.
void write_panels(const TensorView& w, uint8_t* dst, int part = 0, int n_parts = 1,
                  int64_t first = 0, int64_t end = -1);
// Panels of w (16 rows each, over every expert) and the bytes of one.
int64_t panel_count(const TensorView& w);
int64_t panel_bytes(const TensorView& w);
// The view of w's bytes written by write_panels into dst.
TensorView panel_view(const TensorView& w, const uint8_t* dst);
// Both, on the calling thread.
TensorView repack_panels(const TensorView& w, uint8_t* dst);

}  // namespace qwenrt::ops::cpu
