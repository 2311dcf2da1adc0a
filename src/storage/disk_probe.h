// Disk read bandwidth, one of the limits `strata calibrate` measures: the rate at which the NVMe
// tier can stream experts. Reads are what expert streaming does: O_DIRECT (the page cache is
// bypassed, so the figure is the device's, not RAM's), block-sized and 4 KiB-aligned, with
// `queue_depth` reads in flight through io_uring with registered buffers.
//
// Fallbacks, each said in the result, never silent:
//  - io_uring unavailable (io_uring_queue_init fails: old kernel, seccomp, io_uring_disabled):
//    `queue_depth` threads each doing one pread at a time (same queue depth, more CPU); a line on
//    stderr, once per process;
//  - O_DIRECT refused by the filesystem (EINVAL from open or from a first aligned read): buffered
//    reads, which after the first pass come from the page cache and so are not disk bandwidth;
//  - a memory-backed filesystem (tmpfs, ramfs) accepts O_DIRECT on recent kernels but is RAM: the
//    note says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/error.h"

namespace strata::storage {

enum class DiskAccess {
  sequential,  // block after block from the start of the file, wrapping around (expert streaming)
  random,      // block-aligned offsets drawn at random over the file
};

struct DiskProbeOptions {
  // An existing regular file to read (only read, never written), or a directory in which a
  // temporary file of `file_bytes` is written once (fsync'ed, then dropped from the page cache) and
  // removed before measure_disk_read returns, also on error.
  std::string path;
  size_t file_bytes = size_t(1) << 30;   // temporary file size (directory only)
  size_t block_bytes = size_t(1) << 20;  // bytes per read; a multiple of 4096
  int queue_depth = 32;                  // reads in flight, 1 to 1024
  double seconds = 3.0;                  // time budget of the reads (creating the file not counted)
  bool use_io_uring = true;              // false: the pread thread pool, as when io_uring fails
  DiskAccess access = DiskAccess::sequential;
};

struct DiskProbeResult {
  double gbps = 0;          // bytes_read / seconds / 1e9
  uint64_t bytes_read = 0;  // whole blocks read (a file shorter than the budget is read again)
  double seconds = 0;       // from the first submission to the last completion
  // "io_uring O_DIRECT", "pread O_DIRECT", "io_uring buffered (O_DIRECT refused)",
  // "pread buffered (O_DIRECT refused)"
  std::string method;
  bool io_uring = false;    // io_uring did the reads (else the pread threads)
  bool direct = false;      // O_DIRECT (else buffered: the page cache may have served the reads)
  bool memory_backed = false;  // tmpfs / ramfs: RAM, whatever the method says
  int queue_depth = 0;
  size_t block_bytes = 0;
  uint64_t file_bytes = 0;  // bytes of the file the reads cover (whole blocks)
  // Caveats a user must read beside the figure, empty when none: io_uring unavailable (and why),
  // buffers not registered, a memory-backed filesystem, reads served by the page cache.
  std::string note;
};

// Measures the read bandwidth of the file or directory in `options.path`. Errors (returned, naming
// the path and, for a failed read, the offset): a missing path, a file smaller than one block, bad
// options, a temporary file that cannot be written (disk full), EIO or any other read error.
// Short reads and EINTR/EAGAIN are retried. Blocks the calling thread for about options.seconds
// (plus writing the temporary file). Any thread may call; calls are independent.
Result<DiskProbeResult> measure_disk_read(const DiskProbeOptions& options);

}  // namespace strata::storage
