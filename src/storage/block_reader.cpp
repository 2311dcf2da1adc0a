#include "storage/block_reader.h"

#include "base/hash.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace strata::storage {

namespace {

// One attempt reads at most this much: pread and io_uring lengths are 32-bit (Linux caps a read
// near 2 GiB anyway), and it is the size of one registered iovec. A multiple of kDirectAlign, so
// the next attempt stays aligned.
constexpr size_t kMaxAttempt = size_t(1) << 30;
// user_data of the NOP that tells the reaper to stop (slot indices are below 1024).
constexpr uint64_t kStopTag = ~uint64_t(0);

uint64_t align_up(uint64_t x) { return (x + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }

// Closes a file descriptor when it goes.
struct FileDescriptor {
  int fd = -1;
  FileDescriptor() = default;
  explicit FileDescriptor(int f) : fd(f) {}
  FileDescriptor(FileDescriptor&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  FileDescriptor& operator=(FileDescriptor&&) = delete;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

struct OpenFile {
  FileDescriptor fd;
  std::string path;   // for messages
  uint64_t size = 0;  // at open: reads past it are the truncated-model error
  bool direct = false;
};

// Whether an aligned O_DIRECT read at offset 0 of `fd` fails with EINVAL: some FUSE and network
// filesystems accept O_DIRECT at open and refuse it at the first read.
bool direct_read_refused(int fd) {
  void* buf = std::aligned_alloc(kDirectAlign, kDirectAlign);
  if (buf == nullptr) return false;
  ssize_t got;
  do {
    got = ::pread(fd, buf, kDirectAlign, 0);
  } while (got < 0 && errno == EINTR);
  const bool refused = got < 0 && errno == EINVAL;
  std::free(buf);
  return refused;
}

Result<OpenFile> open_file(const std::string& path, bool direct) {
  OpenFile f{.path = path};
  if (direct) {
    f.fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    f.direct = f.fd.fd >= 0;
    // The filesystem has no direct I/O: open says EINVAL, or the first aligned read does.
    if (f.direct && direct_read_refused(f.fd.fd)) {
      ::close(std::exchange(f.fd.fd, -1));
      f.direct = false;
    } else if (!f.direct && errno != EINVAL) {
      return Error{strfmt("%s: cannot open: %s", path.c_str(), std::strerror(errno))};
    }
  }
  if (!f.direct) f.fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd.fd < 0) return Error{strfmt("%s: cannot open: %s", path.c_str(), std::strerror(errno))};
  struct stat st {};
  if (::fstat(f.fd.fd, &st) != 0) {
    return Error{strfmt("%s: cannot stat: %s", path.c_str(), std::strerror(errno))};
  }
  if (!S_ISREG(st.st_mode)) return Error{strfmt("%s: not a regular file", path.c_str())};
  f.size = uint64_t(st.st_size);
  return f;
}

// "O_DIRECT", "buffered", "buffered (O_DIRECT refused)" or, for a mix, which files are buffered.
std::string access_mode(const std::vector<OpenFile>& files, bool direct) {
  if (!direct) return "buffered";
  const auto n_direct = size_t(std::count_if(files.begin(), files.end(), [](const OpenFile& f) { return f.direct; }));
  if (n_direct == files.size()) return "O_DIRECT";
  if (n_direct == 0) return "buffered (O_DIRECT refused)";
  return strfmt("O_DIRECT (%zu of %zu files buffered: O_DIRECT refused)", files.size() - n_direct, files.size());
}

// One read on its way: what was asked and how far it got. Touched by one thread at a time (the
// engine hands it over under a lock).
struct Progress {
  BlockRead read;
  size_t done = 0;         // bytes in, from read.offset
  int io_retries = 0;      // failures other than EINTR / EAGAIN since the last bytes came in
  int again_retries = 0;   // EINTR / EAGAIN, over the whole read
  uint32_t attempts = 0;   // attempts made; with the read, drives the fault injection

  uint64_t position() const { return read.offset + done; }
  uint8_t* target() const { return read.dest + done; }
  size_t attempt_bytes() const { return std::min(read.bytes - done, kMaxAttempt); }
};

// What the two engines share: the files, the retry and fault logic, completion and drain.
class ReaderBase : public BlockReader {
 public:
  ReaderBase(std::vector<OpenFile> files, const BlockReaderOptions& options, Done done, std::string method)
      : files_(std::move(files)),
        done_(std::move(done)),
        method_(std::move(method)),
        check_alignment_(options.direct) {
    if (options.faults != nullptr) faults_ = *options.faults;
  }

  std::string_view method() const override { return method_; }
  size_t pending() const override { return pending_.load(std::memory_order_acquire); }

  void drain() override {
    std::unique_lock lock(drain_mutex_);
    drained_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }

 protected:
  // Checks a read from the caller (a bad one is a bug in the caller) and counts it as pending.
  void accept(const BlockRead& r) {
    STRATA_CHECK(r.file >= 0 && size_t(r.file) < files_.size(), "block read of a file the reader does not have");
    STRATA_CHECK(r.bytes > 0 && r.dest != nullptr, "empty block read");
    if (check_alignment_) {
      STRATA_CHECK(r.offset % kDirectAlign == 0 && r.bytes % kDirectAlign == 0 &&
                       reinterpret_cast<uintptr_t>(r.dest) % kDirectAlign == 0,
                   "O_DIRECT block read not aligned to 4 KiB");
    }
    pending_.fetch_add(1, std::memory_order_acq_rel);
  }

  int fd(const Progress& p) const { return files_[size_t(p.read.file)].fd.fd; }

  // The outcome of one attempt of `bytes` at p.position(), as tests want it to be: `res` is what
  // the read returned (bytes, or -errno).
  int64_t inject_faults(Progress& p, size_t bytes, int64_t res) {
    if (!faults_) return res;
    const FaultInjection& f = *faults_;
    const uint32_t attempt = p.attempts++;
    const uint64_t pos = p.position();
    if (p.read.file == f.fail_file && pos < f.fail_offset + f.fail_bytes && f.fail_offset < pos + bytes) return -EIO;
    if (res < 0) return res;
    // Drawn from the read and the attempt number rather than from one shared stream: the faults a
    // read meets do not depend on how threads interleave, so a test run is repeatable.
    const uint64_t h =
        splitmix64(f.seed + splitmix64(p.read.offset + splitmix64(uint64_t(p.read.file) + splitmix64(attempt))));
    const double u = double(h >> 11) * 0x1p-53;
    if (u < f.eio_rate) return -EIO;
    if (u < f.eio_rate + f.eagain_rate) return -EAGAIN;
    if (u < f.eio_rate + f.eagain_rate + f.short_read_rate && res > int64_t(kDirectAlign)) {
      // Whole blocks only, so an O_DIRECT continuation stays aligned.
      const uint64_t max_blocks = uint64_t(res - 1) / kDirectAlign;
      return int64_t((1 + splitmix64(h) % max_blocks) * kDirectAlign);
    }
    return res;
  }

  // Sleeps as the faults ask before an attempt's outcome is handled.
  void inject_latency() const {
    if (faults_ && faults_->latency_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(faults_->latency_us));
  }

  // Takes the outcome `res` of an attempt (after the faults): the read's final status, or nullopt
  // when another attempt is due (from p.position(), which may have moved).
  std::optional<Status> advance(Progress& p, int64_t res) const {
    const OpenFile& file = files_[size_t(p.read.file)];
    if (res > 0) {
      p.done += std::min(size_t(res), p.read.bytes - p.done);
      p.io_retries = 0;  // a device error is retried per position, not per read
      if (p.done == p.read.bytes) return Status::success();
      if (p.position() < file.size) return std::nullopt;
      // The file ends here: no read from this unaligned end (O_DIRECT may refuse it), the answer
      // is the same as the end of file that read would meet.
    }
    const auto offset = static_cast<unsigned long long>(p.read.offset);
    if (res >= 0) {
      // A range may run past the end of the file within its last aligned block (the header); that
      // tail is left as it was.
      if (p.position() >= file.size && p.read.offset + p.read.bytes <= align_up(file.size)) return Status::success();
      return Error{strfmt("%s: read of %zu bytes at offset %llu: unexpected end of file at byte %llu (file is %llu "
                          "bytes)",
                          file.path.c_str(), p.read.bytes, offset, static_cast<unsigned long long>(p.position()),
                          static_cast<unsigned long long>(file.size))};
    }
    const int err = int(-res);
    const bool again = err == EINTR || err == EAGAIN;
    if (again ? ++p.again_retries <= kAgainRetries : ++p.io_retries <= kIoRetries) return std::nullopt;
    return Error{strfmt("%s: read of %zu bytes at offset %llu failed: %s (after %d retries)", file.path.c_str(),
                        p.read.bytes, offset, std::strerror(err), again ? kAgainRetries : kIoRetries)};
  }

  // Hands the read's outcome to the caller, then stops counting it as pending.
  void finish(uint64_t tag, const Status& status) {
    done_(tag, status);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Under the lock: drain() checks pending_ under it, so the wake-up cannot fall between its
      // check and its wait.
      std::lock_guard lock(drain_mutex_);
      drained_.notify_all();
    }
  }

 private:
  std::vector<OpenFile> files_;  // fixed for the reader's life
  Done done_;
  std::string method_;
  bool check_alignment_;
  std::optional<FaultInjection> faults_;
  std::atomic<size_t> pending_{0};  // submitted, Done not yet returned
  std::mutex drain_mutex_;          // pairs with drained_
  std::condition_variable drained_;
};

// ---- io_uring: reads in `queue_depth` slots, one reaper thread ----

class IoUringReader final : public ReaderBase {
 public:
  // `ring` is set up with at least queue_depth entries; `iovecs` are the registered buffers (empty
  // when none are).
  IoUringReader(std::unique_ptr<io_uring> ring, std::vector<iovec> iovecs, std::vector<OpenFile> files,
                const BlockReaderOptions& options, Done done, std::string method)
      : ReaderBase(std::move(files), options, std::move(done), std::move(method)),
        ring_(std::move(ring)),
        iovecs_(std::move(iovecs)),
        slots_(size_t(options.queue_depth)),
        attempt_bytes_(size_t(options.queue_depth)) {
    for (size_t s = slots_.size(); s-- > 0;) free_slots_.push_back(uint32_t(s));
    reaper_ = std::thread([this] { reap(); });
  }

  ~IoUringReader() override {
    drain();
    {
      std::lock_guard lock(sq_mutex_);
      io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
      STRATA_CHECK(sqe != nullptr, "io_uring submission queue full with nothing in flight");
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data64(sqe, kStopTag);
      submit_locked();
    }
    reaper_.join();
    // Nothing in flight: the registered buffers are released with the ring.
    io_uring_queue_exit(ring_.get());
  }

  void submit(const BlockRead& read) override {
    accept(read);
    std::lock_guard lock(sq_mutex_);
    if (free_slots_.empty()) {
      waiting_.push_back(read);  // started by the reaper as a slot frees
      return;
    }
    start_locked(read);
    submit_locked();
  }

 private:
  // Takes a free slot for `read` and prepares its first attempt. Needs sq_mutex_.
  void start_locked(const BlockRead& read) {
    const uint32_t s = free_slots_.back();
    free_slots_.pop_back();
    slots_[s] = Progress{.read = read};
    prepare_locked(s);
  }

  // Prepares the next attempt of slot s (from where it stopped). Needs sq_mutex_.
  void prepare_locked(uint32_t s) {
    Progress& p = slots_[s];
    io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
    // at most queue_depth reads in flight, the ring has at least that many entries, and each
    // batch is submitted before the lock is released
    STRATA_CHECK(sqe != nullptr, "io_uring submission queue full");
    uint8_t* dest = p.target();
    size_t bytes = p.attempt_bytes();
    const int index = registered_index(dest, &bytes);
    if (index >= 0) {
      io_uring_prep_read_fixed(sqe, fd(p), dest, unsigned(bytes), p.position(), index);
    } else {
      io_uring_prep_read(sqe, fd(p), dest, unsigned(bytes), p.position());
    }
    io_uring_sqe_set_data64(sqe, s);
    attempt_bytes_[s] = bytes;
  }

  // The registered iovec holding [dest, dest + *bytes), or -1 (a plain read). Trims *bytes to end
  // at the iovec's end when that keeps it aligned, so a read across two iovecs stays fixed.
  int registered_index(uint8_t* dest, size_t* bytes) const {
    if (iovecs_.empty()) return -1;
    const auto base = reinterpret_cast<uintptr_t>(iovecs_[0].iov_base);
    const auto at = reinterpret_cast<uintptr_t>(dest);
    if (at < base) return -1;
    const size_t i = (at - base) / kMaxAttempt;  // every iovec but the last is kMaxAttempt long
    if (i >= iovecs_.size()) return -1;
    const uintptr_t iov_end = reinterpret_cast<uintptr_t>(iovecs_[i].iov_base) + iovecs_[i].iov_len;
    if (at >= iov_end) return -1;
    const size_t room = iov_end - at;
    if (*bytes > room) {
      if (room % kDirectAlign != 0) return -1;
      *bytes = room;
    }
    return int(i);
  }

  // Hands what was prepared to the kernel. Needs sq_mutex_.
  void submit_locked() {
    for (int tries = 0;; ++tries) {
      const int rc = io_uring_submit(ring_.get());
      if (rc >= 0) return;
      // The ring never holds more than it has room to complete, so a refusal is transient (or a
      // bug, which the check reports).
      STRATA_CHECK((rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) && tries < kAgainRetries,
                   "io_uring_submit failed");
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // The reaper: waits for completions, retries or finishes each read, starts waiting ones.
  void reap() {
    struct Finished {
      uint64_t tag;
      Status status;
    };
    std::vector<std::pair<uint64_t, int>> batch;  // (user_data, res)
    std::vector<Finished> finished;
    bool stop = false;
    while (!stop) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(ring_.get(), &cqe);
      if (rc == -EINTR || rc == -EAGAIN || rc == -ETIME) continue;
      STRATA_CHECK(rc == 0, "io_uring_wait_cqe failed");
      batch.clear();
      unsigned head = 0, seen = 0;
      io_uring_for_each_cqe(ring_.get(), head, cqe) {
        batch.emplace_back(io_uring_cqe_get_data64(cqe), cqe->res);
        ++seen;
      }
      io_uring_cq_advance(ring_.get(), seen);
      inject_latency();

      finished.clear();
      {
        // The slots are read and written under the lock that submit() fills them under.
        std::lock_guard lock(sq_mutex_);
        for (const auto& [data, res] : batch) {
          if (data == kStopTag) {
            stop = true;
            continue;
          }
          const auto s = uint32_t(data);
          Progress& p = slots_[s];
          const int64_t outcome = inject_faults(p, attempt_bytes_[s], res);
          std::optional<Status> status = advance(p, outcome);
          if (!status) {
            prepare_locked(s);
            continue;
          }
          finished.push_back({p.read.tag, std::move(*status)});
          free_slots_.push_back(s);
          if (!waiting_.empty()) {
            start_locked(waiting_.front());
            waiting_.pop_front();
          }
        }
        submit_locked();
      }
      // Outside the lock: Done may submit().
      for (const Finished& f : finished) finish(f.tag, f.status);
    }
  }

  std::unique_ptr<io_uring> ring_;  // at a fixed address for the reader's life
  // The caller's buffer, registered in pieces of at most kMaxAttempt; it must outlive the reader.
  const std::vector<iovec> iovecs_;
  std::thread reaper_;

  // sq_mutex_ guards the submission side of the ring and the fields below.
  std::mutex sq_mutex_;
  std::vector<Progress> slots_;           // [queue_depth]: reads in flight (or free)
  std::vector<size_t> attempt_bytes_;     // [queue_depth]: length of each slot's attempt in flight
  std::vector<uint32_t> free_slots_;
  std::deque<BlockRead> waiting_;  // submitted while every slot was taken, first come first started
};

// ---- pread thread pool: `queue_depth` threads, one blocking read each ----

class PreadPool final : public ReaderBase {
 public:
  PreadPool(std::vector<OpenFile> files, const BlockReaderOptions& options, Done done, std::string method)
      : ReaderBase(std::move(files), options, std::move(done), std::move(method)) {
    for (int i = 0; i < options.queue_depth; ++i) workers_.emplace_back([this] { work(); });
  }

  ~PreadPool() override {
    drain();
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    ready_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void submit(const BlockRead& read) override {
    accept(read);
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(read);
    }
    ready_.notify_one();
  }

 private:
  void work() {
    for (;;) {
      Progress p;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and the destructor drained first
        p.read = queue_.front();
        queue_.pop_front();
      }
      std::optional<Status> status;
      while (!status) {
        const size_t bytes = p.attempt_bytes();
        const ssize_t got = ::pread(fd(p), p.target(), bytes, off_t(p.position()));
        const int64_t res = got < 0 ? -int64_t(errno) : int64_t(got);
        inject_latency();
        status = advance(p, inject_faults(p, bytes, res));
      }
      finish(p.read.tag, *status);
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;  // guards queue_ and stop_
  std::condition_variable ready_;
  std::deque<BlockRead> queue_;  // reads not yet taken by a worker, first come first started
  bool stop_ = false;
};

Status check_options(const BlockReaderOptions& o, const BlockReader::Done& done) {
  if (o.queue_depth < 1 || o.queue_depth > 1024) {
    return Error{strfmt("block reader: queue depth %d is not between 1 and 1024", o.queue_depth)};
  }
  if (!done) return Error{"block reader: no completion callback"};
  return Status::success();
}

}  // namespace

Result<std::unique_ptr<BlockReader>> make_block_reader(const std::vector<std::string>& paths,
                                                       const BlockReaderOptions& options,
                                                       BlockReader::Done done) {
  STRATA_TRY(check_options(options, done));
  std::vector<OpenFile> files;
  files.reserve(paths.size());
  for (const std::string& path : paths) {
    Result<OpenFile> f = open_file(path, options.direct);
    if (!f) return f.error();
    files.push_back(std::move(*f));
  }
  const std::string mode = access_mode(files, options.direct);

  std::string pread_note;
  if (options.use_io_uring) {
    auto ring = std::make_unique<io_uring>();
    const int rc = io_uring_queue_init(unsigned(options.queue_depth), ring.get(), 0);
    if (rc == 0) {
      std::vector<iovec> iovecs;
      std::string note;
      if (!options.buffer.empty()) {
        for (size_t off = 0; off < options.buffer.size(); off += kMaxAttempt) {
          iovecs.push_back({options.buffer.data() + off, std::min(kMaxAttempt, options.buffer.size() - off)});
        }
        // Pinned once for the reader's life, so reads into it skip the per-read page pinning. The
        // memlock limit may refuse it; plain reads then do the same job a little slower.
        const int reg = io_uring_register_buffers(ring.get(), iovecs.data(), unsigned(iovecs.size()));
        if (reg == 0) {
          note = " (registered buffers)";
        } else {
          iovecs.clear();
          note = strfmt(" (buffers not registered: %s)", std::strerror(-reg));
        }
      }
      return std::unique_ptr<BlockReader>(std::make_unique<IoUringReader>(
          std::move(ring), std::move(iovecs), std::move(files), options, std::move(done), "io_uring " + mode + note));
    }
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      std::fprintf(stderr, "strata: io_uring unavailable (%s): reading with a pread thread pool\n", std::strerror(-rc));
    }
    pread_note = strfmt(" (io_uring unavailable: %s)", std::strerror(-rc));
  }
  return std::unique_ptr<BlockReader>(
      std::make_unique<PreadPool>(std::move(files), options, std::move(done), "pread " + mode + pread_note));
}

}  // namespace strata::storage
