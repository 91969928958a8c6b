#include "io/npy.h"

#include <cstdio>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/mapped_file.h"
#include "quant/quant.h"

namespace qwenrt {

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dims;
  int64_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dims += fmt::format("{}{}", i ? ", " : "", shape[i]);
    count *= shape[i];
  }
  if (shape.size() == 1) dims += ",";
  std::string header =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  // magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of 64.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) fail("{}: cannot open for writing: {}", path, std::strerror(errno));
  const uint16_t header_len = static_cast<uint16_t>(header.size());
  bool ok = std::fwrite("\x93NUMPY\x01\x00", 1, 8, f.get()) == 8 &&
            std::fwrite(&header_len, 2, 1, f.get()) == 1 &&
            std::fwrite(header.data(), 1, header.size(), f.get()) == header.size() &&
            (count == 0 || std::fwrite(data, 4, count, f.get()) == static_cast<size_t>(count));
  if (!ok || std::fflush(f.get()) != 0) fail("{}: write failed", path);
}

NpyArray read_npy_f32(const std::string& path) {
  MappedFile file = MappedFile::open(path);
  const uint8_t* p = file.data();
  if (file.size() < 10 || std::memcmp(p, "\x93NUMPY", 6) != 0) fail("{}: not a .npy file", path);
  const int major = p[6];
  size_t header_len, offset;
  if (major == 1) {
    header_len = p[8] | (p[9] << 8);
    offset = 10;
  } else {
    if (file.size() < 12) fail("{}: truncated .npy header", path);
    header_len = p[8] | (p[9] << 8) | (size_t{p[10]} << 16) | (size_t{p[11]} << 24);
    offset = 12;
  }
  if (offset + header_len > file.size()) fail("{}: truncated .npy header", path);
  const std::string header(reinterpret_cast<const char*>(p + offset), header_len);
  const bool f32 = header.find("'<f4'") != std::string::npos;
  const bool f16 = header.find("'<f2'") != std::string::npos;
  if (!f32 && !f16) fail("{}: expected dtype <f4 or <f2, header is {}", path, header);
  if (header.find("'fortran_order': False") == std::string::npos)
    fail("{}: expected C order", path);
  NpyArray a;
  const size_t open = header.find('(', header.find("'shape'"));
  const size_t close = header.find(')', open);
  if (open == std::string::npos || close == std::string::npos) fail("{}: no shape in header", path);
  int64_t count = 1;
  for (size_t i = open + 1; i < close;) {
    while (i < close && (header[i] == ' ' || header[i] == ',')) ++i;
    if (i >= close) break;
    int64_t v = 0;
    while (i < close && header[i] >= '0' && header[i] <= '9') v = v * 10 + (header[i++] - '0');
    a.shape.push_back(v);
    count *= v;
  }
  const size_t data_at = offset + header_len, elem = f32 ? 4 : 2;
  if (data_at + count * elem > file.size()) {
    fail("{}: {} elements need {} bytes, file has {}", path, count, count * elem,
         file.size() - data_at);
  }
  a.data.resize(count);
  if (f32) {
    std::memcpy(a.data.data(), p + data_at, count * 4);
  } else {
    for (int64_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, p + data_at + 2 * i, 2);
      a.data[i] = quant::fp16_to_fp32(h);
    }
  }
  return a;
}

}  // namespace qwenrt
