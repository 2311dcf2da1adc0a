// A whole file in memory, read-only to its readers. Move-only; unmaps on destruction. Two ways in:
//  - mmap (default): the kernel's page cache, mapped; pages are faulted in on first touch (4 KiB
//    each, 64 KiB with fault-around), shared with other processes and evictable;
//  - ram: the file read once into anonymous memory asked to use transparent huge pages (2 MiB
//    pages: no faults after loading, far fewer TLB misses when experts are read at random).
//    Costs a full read at load. A file larger than half the memory available leaves no copy in
//    the page cache (dropped as it is read).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "base/error.h"

namespace strata {

// Installed and currently available memory (/proc/meminfo MemTotal, MemAvailable); 0 when unknown.
struct SystemMemory {
  uint64_t total = 0;
  uint64_t available = 0;
};
SystemMemory system_memory();

class MappedFile {
 public:
  MappedFile();
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // automatic: ram when the file takes less than 80% of the memory available now
  // (/proc/meminfo MemAvailable), else mmap.
  enum class Mode { mmap, ram, automatic };
  // Maps (or reads) `path`. An empty file maps to an empty span. A failed or short read is an
  // error naming the file and the offset, never zeros.
  static Result<MappedFile> open(const std::string& path, Mode mode = Mode::mmap);

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }
  // How the bytes came in: ram or mmap (never automatic).
  Mode mode() const { return mode_; }
  // ram mode: the bytes, writable, for a loader that rewrites them in place (cpu/repack.h);
  // null in mmap mode (the file's pages are never written).
  uint8_t* mutable_data() const { return mode_ == Mode::ram ? const_cast<uint8_t*>(data_) : nullptr; }
  const std::string& path() const { return path_; }

  // mmap mode: reads the mapping's pages into memory on a background thread (madvise
  // MADV_POPULATE_READ in 64 MiB steps; where the kernel lacks it, MADV_WILLNEED and a read of a
  // byte per page), so that the first request after start finds them resident instead of paying
  // a fault per page. Returns false (and does nothing) in ram mode or when already started. The
  // thread stops at the next step when the file is closed; readers never wait for it.
  bool populate_in_background();
  // Bytes the background thread has populated so far (0 when never started).
  size_t populated_bytes() const;

 private:
  struct Populator;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // bytes of the mapping (ram mode rounds up to 2 MiB)
  Mode mode_ = Mode::mmap;
  std::string path_;
  std::unique_ptr<Populator> populator_;  // the background thread, joined before the unmap
};

}  // namespace strata
