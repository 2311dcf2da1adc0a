#include "base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif

namespace strata {

// The background population of a mapping: the thread walks [data, data + size) in steps and
// checks `stop` between them; `done` counts the bytes behind it.
struct MappedFile::Populator {
  std::atomic<bool> stop{false};
  std::atomic<size_t> done{0};
  std::thread thread;
  ~Populator() {
    stop.store(true, std::memory_order_relaxed);
    if (thread.joinable()) thread.join();
  }
};

bool MappedFile::populate_in_background() {
  if (mode_ != Mode::mmap || data_ == nullptr || size_ == 0 || populator_) return false;
  populator_ = std::make_unique<Populator>();
  Populator* pop = populator_.get();
  const uint8_t* data = data_;
  const size_t size = size_;
  pop->thread = std::thread([pop, data, size] {
    constexpr size_t kStep = size_t(64) << 20;
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    bool populate_read = true;
    for (size_t off = 0; off < size && !pop->stop.load(std::memory_order_relaxed); off += kStep) {
      const size_t n = std::min(kStep, size - off);
      // madvise wants a page-aligned start: the mapping starts on a page, and so does each step
      auto* p = const_cast<uint8_t*>(data + off);
      if (populate_read && madvise(p, n, MADV_POPULATE_READ) != 0) {
        if (errno != EINVAL) break;  // a read failed: the readers meet it themselves, with its error
        populate_read = false;       // a kernel before 5.14
      }
      if (!populate_read) {
        madvise(p, n, MADV_WILLNEED);
        uint8_t sink = 0;
        for (size_t i = 0; i < n; i += page) sink ^= reinterpret_cast<const volatile uint8_t*>(p)[i];
        (void)sink;
      }
      pop->done.store(off + n, std::memory_order_relaxed);
    }
  });
  return true;
}

size_t MappedFile::populated_bytes() const {
  return populator_ ? populator_->done.load(std::memory_order_relaxed) : 0;
}

MappedFile::MappedFile() = default;

MappedFile::~MappedFile() {
  populator_.reset();  // the thread reads the mapping: joined first
  if (data_ != nullptr && mapped_ > 0) munmap(const_cast<uint8_t*>(data_), mapped_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      mode_(other.mode_),
      path_(std::move(other.path_)),
      populator_(std::move(other.populator_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    populator_.reset();
    if (data_ != nullptr && mapped_ > 0) munmap(const_cast<uint8_t*>(data_), mapped_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    mode_ = other.mode_;
    path_ = std::move(other.path_);
    populator_ = std::move(other.populator_);
  }
  return *this;
}

namespace {

// Reads the whole file into anonymous memory backed by transparent huge pages where the kernel
// allows (madvise mode). The page cache keeps its copy (a second load is a memory copy instead of
// a disk read) unless drop_cache: then each chunk's cached pages are dropped once read, for files
// whose two copies would not fit (the kernel would reclaim them under pressure anyway, while the
// load, the repacking and the first tokens wait: on the 2-core VM with 24 GiB and an 18.6 GB
// model, repacking took 3.5-15 s with the cache kept and 0.84 s with it dropped). Returns the
// mapping or an error; the caller owns it (munmap of `mapped` bytes).
Result<uint8_t*> read_into_ram(int fd, const std::string& path, size_t size, size_t mapped, bool drop_cache) {
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return Error{strfmt("%s: cannot allocate %zu bytes to load it into RAM: %s", path.c_str(), mapped,
                        std::strerror(errno))};
  }
  madvise(p, mapped, MADV_HUGEPAGE);  // advisory: 4 KiB pages where THP is off
  auto* dst = static_cast<uint8_t*>(p);
  // 64 MiB chunks read by several threads: what costs is not the copy but the first touch of each
  // fresh page (zeroing it, and in a VM often a fault in the host too), which runs in parallel.
  constexpr size_t kChunk = size_t(64) << 20;
  const size_t n_chunks = (size + kChunk - 1) / kChunk;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::string error;
  auto reader = [&] {
    for (size_t c; !failed.load() && (c = next.fetch_add(1)) < n_chunks;) {
      const size_t end = std::min(size, (c + 1) * kChunk);
      for (size_t off = c * kChunk; off < end;) {
        const ssize_t got = ::pread(fd, dst + off, end - off, off_t(off));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
          const int e = errno;
          std::lock_guard lock(error_mutex);
          if (!failed.exchange(true))
            error = got == 0 ? strfmt("%s: file ended at byte %zu while loading %zu bytes (truncated while reading?)",
                                      path.c_str(), off, size)
                             : strfmt("%s: read failed at byte %zu: %s", path.c_str(), off, std::strerror(e));
          return;
        }
        off += size_t(got);
      }
      if (drop_cache) posix_fadvise(fd, off_t(c * kChunk), off_t(end - c * kChunk), POSIX_FADV_DONTNEED);
    }
  };
  const unsigned n_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < n_threads && i < n_chunks; ++i) threads.emplace_back(reader);
  reader();
  for (std::thread& t : threads) t.join();
  if (failed.load()) {
    munmap(p, mapped);
    return Error{error};
  }
  // No mprotect(PROT_READ) afterwards: on the VM of bench/RESULTS.md it made the first pass over
  // the weights after the load 2x slower (a 16-token decode at 10.5 tok/s instead of 21-22, every
  // later pass at full speed; a read pass over every page removed it too). The bytes are const to
  // every reader through bytes(); only the loader's repacking writes them (mutable_data()).
  return dst;
}

}  // namespace

SystemMemory system_memory() {
  SystemMemory m;
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return m;
  char line[256];
  size_t kb = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "MemTotal: %zu kB", &kb) == 1) m.total = uint64_t(kb) * 1024;
    if (std::sscanf(line, "MemAvailable: %zu kB", &kb) == 1) m.available = uint64_t(kb) * 1024;
  }
  std::fclose(f);
  return m;
}

Result<MappedFile> MappedFile::open(const std::string& path, Mode mode) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error{strfmt("%s: cannot open: %s", path.c_str(), std::strerror(errno))};
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return Error{strfmt("%s: cannot stat: %s", path.c_str(), std::strerror(e))};
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error{strfmt("%s: not a regular file", path.c_str())};
  }
  MappedFile f;
  f.path_ = path;
  f.size_ = static_cast<size_t>(st.st_size);
  if (mode == Mode::automatic)
    mode = double(f.size_) < 0.8 * double(system_memory().available) ? Mode::ram : Mode::mmap;
  f.mode_ = mode;
  if (f.size_ > 0 && mode == Mode::ram) {
    constexpr size_t kHuge = size_t(2) << 20;
    const size_t mapped = (f.size_ + kHuge - 1) / kHuge * kHuge;
    const bool drop_cache = 2 * double(f.size_) > double(system_memory().available);
    auto p = read_into_ram(fd, path, f.size_, mapped, drop_cache);
    if (!p) {
      ::close(fd);
      return p.error();
    }
    f.data_ = *p;
    f.mapped_ = mapped;
  } else if (f.size_ > 0) {
    void* p = mmap(nullptr, f.size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return Error{strfmt("%s: cannot mmap %zu bytes: %s", path.c_str(), f.size_, std::strerror(e))};
    }
    f.data_ = static_cast<const uint8_t*>(p);
    f.mapped_ = f.size_;
  }
  ::close(fd);
  return f;
}

}  // namespace strata
