// Block reader of the NVMe tier (issue #6): asynchronous reads of byte ranges of read-only files
// into caller memory, at a fixed queue depth, with retries; the expert store (expert_store.h) is
// its one client.
//
// Two engines, chosen once at construction:
//  - io_uring (liburing) with O_DIRECT and, where the kernel lets it pin them, the caller's buffer
//    region registered (IORING_OP_READ_FIXED): no page cache, no copy, one syscall per batch;
//  - a pread thread pool (queue_depth threads, O_DIRECT too) when io_uring is unavailable (old
//    kernel, seccomp, io_uring_disabled); said once on stderr and in method().
// A file whose filesystem refuses O_DIRECT is read buffered, and method() says so.
//
// O_DIRECT needs offset, length and destination aligned to the device's logical block: every
// request must be aligned to kDirectAlign (the store reads covering aligned ranges).
//
// Retries: a short read continues from where it stopped; EINTR / EAGAIN are retried; any other
// error (EIO, ...) is retried kIoRetries times, then the read completes with an error that names
// the file, the offset and the error. Reads of bytes past the end of the file (a truncated model)
// complete with an error, never with zeros.
//
// FaultInjection makes either engine misbehave on purpose for tests: short reads, EIO and EAGAIN
// at given rates, a range whose reads always fail, and added latency.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"

namespace strata::storage {

inline constexpr size_t kDirectAlign = 4096;
// Retries of a read that failed with an error other than EINTR / EAGAIN (counted per position: bytes
// arriving reset it), and of one that keeps failing with those (a stuck device).
inline constexpr int kIoRetries = 3;
inline constexpr int kAgainRetries = 1000;

struct FaultInjection {
  uint64_t seed = 1;
  double short_read_rate = 0;  // an attempt returns only part of what it asked for
  double eio_rate = 0;         // an attempt fails with EIO (recovered by the retries)
  double eagain_rate = 0;      // an attempt fails with EAGAIN
  int latency_us = 0;          // each attempt completes this much later
  // Every attempt touching [fail_offset, fail_offset + fail_bytes) of file fail_file fails with
  // EIO: the read exhausts its retries and completes with an error.
  int fail_file = -1;
  uint64_t fail_offset = 0, fail_bytes = 0;
};

struct BlockReaderOptions {
  int queue_depth = 32;       // reads in flight at most (1 .. 1024)
  bool use_io_uring = true;   // false: the pread pool from the start
  bool direct = true;         // O_DIRECT (false: buffered, e.g. for a tmpfs in tests)
  // Memory the destinations lie in, registered with io_uring when possible (may be empty).
  std::span<uint8_t> buffer;
  const FaultInjection* faults = nullptr;  // tests only; copied at construction
};

// One read: bytes [offset, offset + bytes) of file `file` (index into the reader's files) into
// dest. With O_DIRECT, offset, bytes and dest are multiples of kDirectAlign; the range may run past
// the end of the file only within the last aligned block (the bytes past the end are then
// unspecified: O_DIRECT fills them with zeros).
struct BlockRead {
  int file = 0;
  uint64_t offset = 0;
  size_t bytes = 0;
  uint8_t* dest = nullptr;
  uint64_t tag = 0;  // the caller's, handed back on completion
};

class BlockReader {
 public:
  // Called once per read on the reader's own thread when the whole range is in (ok) or the read
  // failed for good (the error names file and offset). Must not call back into the reader's
  // submit() while holding locks submit() callers hold; it may call submit().
  using Done = std::function<void(uint64_t tag, const Status& status)>;

  virtual ~BlockReader() = default;
  // "io_uring O_DIRECT (registered buffers)", "pread O_DIRECT", ... and any fallback.
  virtual std::string_view method() const = 0;
  // Queues a read; it starts as soon as fewer than queue_depth are in flight. Thread-safe.
  virtual void submit(const BlockRead& read) = 0;
  // Reads submitted and not yet completed.
  virtual size_t pending() const = 0;
  // Blocks until every submitted read has completed (their Done calls returned).
  virtual void drain() = 0;
};

// Opens `paths` read-only (O_DIRECT unless options.direct is false or the filesystem refuses it)
// and starts the engine. Errors: a file that cannot be opened (named), bad options.
Result<std::unique_ptr<BlockReader>> make_block_reader(const std::vector<std::string>& paths,
                                                       const BlockReaderOptions& options,
                                                       BlockReader::Done done);

}  // namespace strata::storage
