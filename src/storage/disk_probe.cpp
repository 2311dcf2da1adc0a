#include "storage/disk_probe.h"

#include "base/hash.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace strata::storage {

namespace {

using Clock = std::chrono::steady_clock;

// O_DIRECT wants buffers, offsets and lengths aligned to the device's logical block (512 B or
// 4 KiB); 4 KiB covers both.
constexpr size_t kAlign = 4096;
// EINTR/EAGAIN retries of one read before it counts as failed (a read that never gets through).
constexpr int kMaxRetries = 1000;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t, FreeDeleter>;

AlignedBuffer alloc_aligned(size_t bytes) {
  return AlignedBuffer(static_cast<uint8_t*>(std::aligned_alloc(kAlign, bytes)));
}

// Closes a file descriptor on scope exit.
struct FileDescriptor {
  int fd = -1;
  FileDescriptor() = default;
  explicit FileDescriptor(int f) : fd(f) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

// Removes the temporary test file on scope exit, whatever path the probe leaves by.
struct RemoveOnExit {
  std::string path;
  ~RemoveOnExit() {
    if (!path.empty()) ::unlink(path.c_str());
  }
};

// What is read: `n_blocks` whole blocks of `block` bytes from the start of `fd`.
struct ReadTarget {
  int fd = -1;
  const std::string* path = nullptr;  // for messages
  uint64_t n_blocks = 0;
  size_t block = 0;
  DiskAccess access = DiskAccess::sequential;

  // Byte offset of the k-th read.
  uint64_t offset(uint64_t k) const {
    const uint64_t b = access == DiskAccess::sequential ? k % n_blocks : splitmix64(k) % n_blocks;
    return b * block;
  }
};

struct ReadStats {
  uint64_t bytes = 0;
  double seconds = 0;
};

std::string read_error(const ReadTarget& t, uint64_t offset, size_t len, int err) {
  return strfmt("%s: read of %zu bytes at byte %llu failed: %s", t.path->c_str(), len,
                static_cast<unsigned long long>(offset), std::strerror(err));
}

std::string eof_error(const ReadTarget& t, uint64_t offset) {
  return strfmt("%s: file ended at byte %llu, inside the %s it had when the probe started "
                "(truncated while reading?)",
                t.path->c_str(), static_cast<unsigned long long>(offset),
                format_bytes(double(t.n_blocks * t.block)).c_str());
}

// ---- io_uring: `queue_depth` reads in flight, one registered buffer each ----

// The ring, torn down on scope exit once set up (live).
struct Ring {
  io_uring ring{};
  bool live = false;
  ~Ring() {
    if (live) io_uring_queue_exit(&ring);
  }
};

// One read in flight: the block at `offset`, `done` bytes of it already in.
struct Slot {
  uint64_t offset = 0;
  size_t done = 0;
  int retries = 0;
};

Result<ReadStats> read_with_io_uring(Ring& r, const ReadTarget& t, int queue_depth, double budget,
                                     std::string* note) {
  io_uring* ring = &r.ring;
  const size_t qd = size_t(queue_depth);
  // Owned here; the kernel writes into it until the last completion is reaped (the loop below
  // always drains every read in flight before returning, also on error).
  AlignedBuffer buffer = alloc_aligned(qd * t.block);
  if (!buffer) {
    return Error{strfmt("disk probe: cannot allocate %s of read buffers",
                        format_bytes(double(qd * t.block)).c_str())};
  }
  std::vector<iovec> iov(qd);
  for (size_t s = 0; s < qd; ++s) iov[s] = {buffer.get() + s * t.block, t.block};
  // Registered buffers are pinned once, not per read (what the expert reader does). Where the
  // memlock limit refuses them, plain reads still measure the disk.
  const int reg = io_uring_register_buffers(ring, iov.data(), unsigned(qd));
  const bool fixed = reg == 0;
  if (!fixed) {
    *note += strfmt("%sio_uring buffers not registered (%s): plain reads", note->empty() ? "" : "; ",
                    std::strerror(-reg));
  }

  std::vector<Slot> slots(qd);
  uint64_t next = 0;
  size_t in_flight = 0;
  auto submit = [&](size_t s) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    // the ring has at least queue_depth entries and at most queue_depth reads are prepared
    STRATA_CHECK(sqe != nullptr, "io_uring submission queue full");
    const Slot& slot = slots[s];
    uint8_t* dst = buffer.get() + s * t.block + slot.done;
    const auto len = unsigned(t.block - slot.done);
    const uint64_t off = slot.offset + slot.done;
    if (fixed) {
      io_uring_prep_read_fixed(sqe, t.fd, dst, len, off, int(s));
    } else {
      io_uring_prep_read(sqe, t.fd, dst, len, off);
    }
    io_uring_sqe_set_data64(sqe, s);
    ++in_flight;
  };
  auto start = [&](size_t s) {
    slots[s] = Slot{.offset = t.offset(next++)};
    submit(s);
  };

  std::string error;
  bool stopping = false;
  ReadStats stats;
  const auto t0 = Clock::now();
  auto t_last = t0;
  for (size_t s = 0; s < qd; ++s) start(s);
  while (in_flight > 0) {
    // one system call: hand over the reads prepared since the last round, wait for a completion
    const int rc = io_uring_submit_and_wait(ring, 1);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      // Reads submitted before may still land in `buffer`: it is leaked rather than freed under
      // them.
      (void)buffer.release();
      return Error{strfmt("%s: io_uring_submit_and_wait failed: %s", t.path->c_str(), std::strerror(-rc))};
    }
    io_uring_cqe* cqe = nullptr;
    unsigned head = 0, seen = 0;
    io_uring_for_each_cqe(ring, head, cqe) {
      ++seen;
      --in_flight;
      const auto s = size_t(io_uring_cqe_get_data64(cqe));
      const int res = cqe->res;
      Slot& slot = slots[s];
      if (res == -EINTR || res == -EAGAIN) {
        if (++slot.retries <= kMaxRetries) {
          if (error.empty()) submit(s);
          continue;
        }
      }
      if (res < 0) {
        if (error.empty()) error = read_error(t, slot.offset + slot.done, t.block - slot.done, -res);
        stopping = true;
        continue;
      }
      if (res == 0) {
        if (error.empty()) error = eof_error(t, slot.offset + slot.done);
        stopping = true;
        continue;
      }
      slot.done += size_t(res);
      if (slot.done < t.block) {  // short read: ask for the rest
        if (error.empty()) submit(s);
        continue;
      }
      stats.bytes += t.block;
      t_last = Clock::now();
      if (std::chrono::duration<double>(t_last - t0).count() >= budget) stopping = true;
      if (!stopping) start(s);
    }
    io_uring_cq_advance(ring, seen);
  }
  if (fixed) (void)io_uring_unregister_buffers(ring);  // nothing in flight: `buffer` may go
  if (!error.empty()) return Error{error};
  stats.seconds = std::chrono::duration<double>(t_last - t0).count();
  return stats;
}

// ---- pread thread pool: `queue_depth` threads, one blocking read each ----

// Reads one whole block; retries short reads and EINTR/EAGAIN.
Status pread_block(const ReadTarget& t, uint8_t* dst, uint64_t offset) {
  size_t done = 0;
  int retries = 0;
  while (done < t.block) {
    const ssize_t got = ::pread(t.fd, dst + done, t.block - done, off_t(offset + done));
    if (got < 0 && (errno == EINTR || errno == EAGAIN) && ++retries <= kMaxRetries) continue;
    if (got < 0) return Error{read_error(t, offset + done, t.block - done, errno)};
    if (got == 0) return Error{eof_error(t, offset + done)};
    done += size_t(got);
  }
  return Status::success();
}

Result<ReadStats> read_with_pread(const ReadTarget& t, int queue_depth, double budget) {
  std::vector<AlignedBuffer> buffers;  // one per thread, each owned by its thread while it runs
  for (int i = 0; i < queue_depth; ++i) {
    buffers.push_back(alloc_aligned(t.block));
    if (!buffers.back()) {
      return Error{strfmt("disk probe: cannot allocate %s of read buffers",
                          format_bytes(double(size_t(queue_depth) * t.block)).c_str())};
    }
  }
  std::atomic<uint64_t> next{0}, bytes{0};
  std::atomic<bool> go{false}, stop{false};
  std::mutex error_mutex;
  std::string error;  // the first failure; guarded by error_mutex
  Clock::time_point t0;  // written before `go` is set, read after
  auto reader = [&](int i) {
    while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
    while (!stop.load(std::memory_order_relaxed)) {
      const Status st = pread_block(t, buffers[size_t(i)].get(), t.offset(next.fetch_add(1)));
      if (!st) {
        std::lock_guard lock(error_mutex);
        if (error.empty()) error = st.error().message;
        stop = true;
        break;
      }
      bytes += t.block;
      if (seconds_since(t0) >= budget) stop = true;
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < queue_depth; ++i) threads.emplace_back(reader, i);
  t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (std::thread& th : threads) th.join();
  const double seconds = seconds_since(t0);
  if (!error.empty()) return Error{error};
  return ReadStats{.bytes = bytes.load(), .seconds = seconds};
}

// ---- the test file (directory case) ----

// Writes `bytes` of incompressible data (a compressing or deduplicating device would otherwise
// report a figure no model file reaches) to a new file in `dir`, fsyncs it and drops its pages
// from the page cache. Returns its path.
Result<std::string> write_test_file(const std::string& dir, uint64_t bytes) {
  std::string path = dir + "/.strata-disk-probe-XXXXXX";
  FileDescriptor f(::mkostemp(path.data(), O_CLOEXEC));
  if (f.fd < 0) {
    return Error{strfmt("%s: cannot create a disk probe test file: %s", dir.c_str(), std::strerror(errno))};
  }
  RemoveOnExit remove_on_error{path};
  constexpr size_t kChunk = size_t(8) << 20;
  AlignedBuffer chunk = alloc_aligned(kChunk);
  if (!chunk) return Error{"disk probe: cannot allocate the 8 MiB write buffer"};
  auto* words = reinterpret_cast<uint64_t*>(chunk.get());
  for (size_t i = 0; i < kChunk / 8; ++i) words[i] = splitmix64(i);
  for (uint64_t off = 0; off < bytes;) {
    // a fresh first word in each 4 KiB block: no two blocks of the file are equal
    for (size_t b = 0; b < kChunk / 8; b += kAlign / 8) words[b] = splitmix64(off + b);
    const size_t len = size_t(std::min<uint64_t>(kChunk, bytes - off));
    const ssize_t put = ::pwrite(f.fd, chunk.get(), len, off_t(off));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      return Error{strfmt("%s: cannot write the %s disk probe test file (at byte %llu): %s",
                          dir.c_str(), format_bytes(double(bytes)).c_str(),
                          static_cast<unsigned long long>(off), put < 0 ? std::strerror(errno) : "no progress")};
    }
    off += uint64_t(put);
  }
  if (::fsync(f.fd) != 0) {
    return Error{strfmt("%s: cannot fsync the disk probe test file: %s", dir.c_str(), std::strerror(errno))};
  }
  // Clean pages now: dropping them makes even a buffered first pass read the disk.
  (void)::posix_fadvise(f.fd, 0, off_t(bytes), POSIX_FADV_DONTNEED);
  remove_on_error.path.clear();
  return path;
}

Status check_options(const DiskProbeOptions& o) {
  if (o.block_bytes == 0 || o.block_bytes % kAlign != 0 || o.block_bytes > (size_t(1) << 30)) {
    return Error{strfmt("disk probe: block size %zu bytes is not a multiple of 4096 between 4 KiB "
                        "and 1 GiB",
                        o.block_bytes)};
  }
  if (o.queue_depth < 1 || o.queue_depth > 1024) {
    return Error{strfmt("disk probe: queue depth %d is not between 1 and 1024", o.queue_depth)};
  }
  if (!(o.seconds > 0) || !std::isfinite(o.seconds)) {
    return Error{strfmt("disk probe: time budget %g s is not a positive number of seconds", o.seconds)};
  }
  return Status::success();
}

// Whether an aligned 4 KiB O_DIRECT read at offset 0 of `fd` (open with O_DIRECT, at least one
// block long) fails with EINVAL. Other failures are left to the measurement, which names them.
bool direct_read_refused(int fd) {
  AlignedBuffer buf = alloc_aligned(kAlign);
  if (!buf) return false;
  ssize_t got;
  do {
    got = ::pread(fd, buf.get(), kAlign, 0);
  } while (got < 0 && errno == EINTR);
  return got < 0 && errno == EINVAL;
}

bool memory_backed(int fd) {
  struct statfs fs {};
  if (::fstatfs(fd, &fs) != 0) return false;
  return fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC;
}

}  // namespace

Result<DiskProbeResult> measure_disk_read(const DiskProbeOptions& options) {
  STRATA_TRY(check_options(options));
  const std::string& path = options.path;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Error{strfmt("%s: cannot open: %s", path.c_str(), std::strerror(errno))};
  }
  RemoveOnExit remove_test_file;
  std::string file = path;  // the file read
  uint64_t file_bytes = 0;
  if (S_ISDIR(st.st_mode)) {
    file_bytes = options.file_bytes / options.block_bytes * options.block_bytes;
    if (file_bytes == 0) {
      return Error{strfmt("disk probe: test file size %zu bytes is smaller than one read block (%zu bytes)",
                          options.file_bytes, options.block_bytes)};
    }
    Result<std::string> written = write_test_file(path, file_bytes);
    if (!written) return written.error();
    file = *written;
    remove_test_file.path = file;
  } else if (S_ISREG(st.st_mode)) {
    file_bytes = uint64_t(st.st_size) / options.block_bytes * options.block_bytes;
    if (file_bytes == 0) {
      return Error{strfmt("%s: the file (%s) is smaller than one read block (%s)", path.c_str(),
                          format_bytes(double(st.st_size)).c_str(),
                          format_bytes(double(options.block_bytes)).c_str())};
    }
  } else {
    return Error{strfmt("%s: not a regular file or a directory", path.c_str())};
  }

  DiskProbeResult out;
  out.direct = true;
  FileDescriptor f(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT));
  // The filesystem has no direct I/O: open says EINVAL, or (some FUSE and network filesystems)
  // open succeeds and the first aligned read does.
  if ((f.fd < 0 && errno == EINVAL) || (f.fd >= 0 && direct_read_refused(f.fd))) {
    out.direct = false;
    if (f.fd >= 0) ::close(f.fd);
    f.fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (f.fd < 0) return Error{strfmt("%s: cannot open: %s", file.c_str(), std::strerror(errno))};
  if (!remove_test_file.path.empty()) {  // open: the name is no longer needed
    ::unlink(remove_test_file.path.c_str());
    remove_test_file.path.clear();
  }
  if (!out.direct) {
    out.note = "O_DIRECT refused by the filesystem: buffered reads, served by the page cache once "
               "the file is in it (not disk bandwidth)";
  }
  out.memory_backed = memory_backed(f.fd);
  if (out.memory_backed) {
    out.note += strfmt("%smemory-backed filesystem (tmpfs/ramfs): the reads come from RAM, not a disk",
                       out.note.empty() ? "" : "; ");
  }

  const ReadTarget target{.fd = f.fd,
                          .path = &file,
                          .n_blocks = file_bytes / options.block_bytes,
                          .block = options.block_bytes,
                          .access = options.access};
  Result<ReadStats> stats = Error{};
  out.io_uring = false;
  if (options.use_io_uring) {
    Ring ring;
    const int rc = io_uring_queue_init(unsigned(options.queue_depth), &ring.ring, 0);
    if (rc == 0) {
      ring.live = true;
      out.io_uring = true;
      stats = read_with_io_uring(ring, target, options.queue_depth, options.seconds, &out.note);
    } else {
      static std::atomic<bool> logged{false};
      if (!logged.exchange(true)) {
        std::fprintf(stderr, "strata: io_uring unavailable (%s): disk reads use a pread thread pool\n",
                     std::strerror(-rc));
      }
      out.note += strfmt("%sio_uring unavailable (%s): pread thread pool", out.note.empty() ? "" : "; ",
                         std::strerror(-rc));
    }
  }
  if (!out.io_uring) stats = read_with_pread(target, options.queue_depth, options.seconds);
  if (!stats) return stats.error();

  out.bytes_read = stats->bytes;
  out.seconds = stats->seconds;
  out.gbps = stats->seconds > 0 ? double(stats->bytes) / stats->seconds / 1e9 : 0;
  out.method = std::string(out.io_uring ? "io_uring" : "pread") +
               (out.direct ? " O_DIRECT" : " buffered (O_DIRECT refused)");
  out.queue_depth = options.queue_depth;
  out.block_bytes = options.block_bytes;
  out.file_bytes = file_bytes;
  return out;
}

}  // namespace strata::storage
