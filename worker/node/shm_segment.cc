#include "worker/node/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace hybridps {
namespace {

absl::Status Errno(int err, absl::string_view what, const std::string& name) {
  return absl::UnavailableError(absl::StrCat(what, " ", name, ": ", std::strerror(err)));
}

// Maps `bytes` of `fd` (closed here); on failure unlinks `name`.
absl::StatusOr<void*> Map(int fd, const std::string& name, size_t bytes) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return Errno(err, absl::StrCat("mapping ", bytes, " bytes of"), name);
  }
  return base;
}

}  // namespace

absl::StatusOr<void*> CreateShmSegment(const std::string& name, size_t bytes) {
  shm_unlink(name.c_str());
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return Errno(errno, "creating", name);
  const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    close(fd);
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot reserve ", bytes, " bytes of shared memory for ", name, ": ",
        std::strerror(rc)));
  }
  return Map(fd, name, bytes);
}

absl::StatusOr<void*> AttachShmSegment(const std::string& name, size_t bytes,
                                       absl::Time deadline) {
  while (true) {
    const int fd = shm_open(name.c_str(), O_RDWR, 0600);
    struct stat st {};
    if (fd >= 0 && fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= bytes) {
      return Map(fd, name, bytes);
    }
    if (fd >= 0) close(fd);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("local rank 0 did not create ", name, " in time"));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
}

}  // namespace hybridps
