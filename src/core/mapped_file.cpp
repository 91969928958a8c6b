#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace qwenrt {

MappedFile MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      fail("{}: cannot mmap {} bytes: {}", path, file.size_, std::strerror(err));
    }
    file.data_ = static_cast<const uint8_t*>(p);
    file.mapped_ = true;
  }
  ::close(fd);  // the mapping keeps the file alive
  return file;
}

MappedFile MappedFile::from_bytes(std::span<const uint8_t> bytes, std::string name) {
  MappedFile file;
  file.path_ = std::move(name);
  file.owned_.assign(bytes.begin(), bytes.end());
  file.data_ = file.owned_.data();
  file.size_ = file.owned_.size();
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept {
  *this = std::move(other);
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this == &other) return *this;
  release();
  path_ = std::move(other.path_);
  mapped_ = other.mapped_;
  size_ = other.size_;
  owned_ = std::move(other.owned_);
  // A moved vector keeps its buffer, so an owned data_ stays valid.
  data_ = mapped_ ? other.data_ : owned_.data();
  other.data_ = nullptr;
  other.size_ = 0;
  other.mapped_ = false;
  return *this;
}

MappedFile::~MappedFile() {
  release();
}

void MappedFile::release() {
  if (mapped_ && data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
  mapped_ = false;
}

}  // namespace qwenrt
