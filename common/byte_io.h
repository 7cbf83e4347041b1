// Fixed-layout messages between processes of one build on one host (shared-memory
// exchanges): fields in host byte order, appended by Put (or written by ByteWriter into
// memory sized beforehand) and read back by ByteReader, which refuses to read past the end
// (the bytes came from another process).
#ifndef HYBRIDPS_COMMON_BYTE_IO_H_
#define HYBRIDPS_COMMON_BYTE_IO_H_

#include <cstring>
#include <string>
#include <type_traits>

#include "absl/strings/string_view.h"

namespace hybridps {

template <typename T>
void Put(std::string* out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Writes fields at `out` one after another. The caller sized the memory for what it
// writes (no bounds are checked): the message's length is computed before it is written.
class ByteWriter {
 public:
  explicit ByteWriter(char* out) : at_(out) {}
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    std::memcpy(at_, &v, sizeof v);
    at_ += sizeof v;
  }
  void Append(absl::string_view bytes) {
    if (!bytes.empty()) std::memcpy(at_, bytes.data(), bytes.size());
    at_ += bytes.size();
  }
  void Zeros(size_t n) {
    std::memset(at_, 0, n);
    at_ += n;
  }

 private:
  char* at_;
};

class ByteReader {
 public:
  explicit ByteReader(absl::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  bool Get(T* v) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (bytes_.size() - pos_ < sizeof *v) return false;
    std::memcpy(v, bytes_.data() + pos_, sizeof *v);
    pos_ += sizeof *v;
    return true;
  }
  bool Take(size_t n, absl::string_view* v) {
    if (bytes_.size() - pos_ < n) return false;
    *v = bytes_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  size_t left() const { return bytes_.size() - pos_; }

 private:
  absl::string_view bytes_;
  size_t pos_ = 0;
};

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_BYTE_IO_H_
