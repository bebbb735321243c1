// A file written whole or not at all: the text goes to a temporary file in the
// same folder, every write and the close are checked, the data is synced, and
// only then is it renamed over the target (and the folder synced). A full disk
// (ENOSPC), a file size limit (EFBIG) or an I/O error leaves the target as it
// was, removes the temporary file and throws smp::Error naming the target.
// Header-only over POSIX: smp-report (no LibTorch, no Boost) uses it too.
#pragma once

#include <smp/error.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

namespace smp {

namespace atomic_file_detail {

inline std::string folder_of(const std::string& path) {
  const size_t at = path.rfind('/');
  return at == std::string::npos ? std::string(".") : at == 0 ? std::string("/") : path.substr(0, at);
}

inline void sync_folder(const std::string& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the rename itself is done
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace atomic_file_detail

// Writes `text` to `path` atomically. `what` leads the message ("run report").
inline void write_file_atomically(const std::string& path, const std::string& text, const std::string& what) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const auto fail = [&](const std::string& step, int e, int fd) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(what + ": writing " + path + " failed (" + step + ": " + std::strerror(e) + "); " + path +
                " is as it was before");
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("open", errno, -1);
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write", n < 0 ? errno : ENOSPC, fd);
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) fail("fsync", errno, fd);
  if (::close(fd) != 0) fail("close", errno, -1);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename", errno, -1);
  atomic_file_detail::sync_folder(atomic_file_detail::folder_of(path));
}

}  // namespace smp
