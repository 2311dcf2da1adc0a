// The NVMe tier's block reader (storage/block_reader.h), both engines: concurrent aligned reads
// land the file's bytes, injected short reads / EIO / EAGAIN / latency are recovered, a range that
// always fails and reads past the end of the file complete with errors naming file and offset,
// open and option errors, and destruction with reads in flight.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/hash.h"
#include "storage/block_reader.h"
#include "test_support.h"

namespace fs = std::filesystem;

namespace strata {
namespace {

using storage::BlockRead;
using storage::BlockReaderOptions;
using storage::FaultInjection;
using storage::kDirectAlign;

uint64_t align_up(uint64_t x) { return (x + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }

// A fresh directory holding one file of `bytes` seeded random non-zero bytes (a read that leaves
// zeros shows); removed with the object. 4 MiB + 3000: a partial last block, and a buffer small
// enough for the default 8 MiB memlock limit, so io_uring can register it.
struct TestFile {
  static constexpr size_t kBytes = (size_t(4) << 20) + 3000;
  fs::path dir;
  std::string path;
  std::vector<uint8_t> bytes;

  TestFile() {
    std::string tmpl = ::testing::TempDir() + "strata-block-reader-XXXXXX";
    STRATA_CHECK(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed");
    dir = tmpl;
    path = (dir / "experts.bin").string();
    bytes.resize(kBytes);
    for (size_t i = 0; i < kBytes; ++i) bytes[i] = uint8_t(1 + splitmix64(i) % 255);
    test::write_file(path, bytes);
  }
  ~TestFile() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};

// Zeroed aligned memory covering the file's last block.
std::unique_ptr<uint8_t, FreeDeleter> alloc_buffer(size_t bytes) {
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(kDirectAlign, bytes));
  std::memset(p, 0, bytes);
  return std::unique_ptr<uint8_t, FreeDeleter>(p);
}

// Every Done call, by tag.
struct Completions {
  std::mutex mutex;
  std::map<uint64_t, std::vector<Status>> by_tag;  // guarded by mutex

  storage::BlockReader::Done callback() {
    return [this](uint64_t tag, const Status& status) {
      std::lock_guard lock(mutex);
      by_tag[tag].push_back(status);
    };
  }
  // Checks that each of tags 0 .. n-1 completed exactly once, returns how many failed.
  int check_once(size_t n) {
    std::lock_guard lock(mutex);
    EXPECT_EQ(by_tag.size(), n);
    int failed = 0;
    for (const auto& [tag, statuses] : by_tag) {
      EXPECT_LT(tag, n);
      EXPECT_EQ(statuses.size(), 1u) << "tag " << tag;
      for (const Status& s : statuses) failed += s.ok() ? 0 : 1;
    }
    return failed;
  }
};

// Aligned ranges of assorted sizes covering [0, align_up(file_bytes)) without overlap, so each
// read lands at its own file offset in the buffer; the last one runs past the end of the file.
std::vector<BlockRead> cover(uint64_t file_bytes, uint8_t* buffer) {
  static constexpr size_t kSizes[] = {4096, 8192, 12288, 65536, 131072, 266240, 1 << 20};
  std::vector<BlockRead> reads;
  const uint64_t end = align_up(file_bytes);
  for (uint64_t off = 0; off < end;) {
    const size_t bytes = size_t(std::min<uint64_t>(kSizes[splitmix64(off) % std::size(kSizes)], end - off));
    reads.push_back({.file = 0, .offset = off, .bytes = bytes, .dest = buffer + off, .tag = reads.size()});
    off += bytes;
  }
  return reads;
}

// Submits `reads` from `n_threads` threads at once.
void submit_concurrently(storage::BlockReader& reader, const std::vector<BlockRead>& reads, int n_threads) {
  std::vector<std::thread> threads;
  for (int t = 0; t < n_threads; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = size_t(t); i < reads.size(); i += size_t(n_threads)) reader.submit(reads[i]);
    });
  }
  for (std::thread& th : threads) th.join();
}

constexpr bool kEngines[] = {true, false};  // use_io_uring

const char* engine_name(bool io_uring) { return io_uring ? "io_uring" : "pread"; }

// Reads the whole file in assorted ranges from four threads at queue depth 4, with and without
// `faults`, into a registered buffer and into an unregistered one; checks every byte.
void read_whole_file(const FaultInjection* faults) {
  TestFile file;
  const size_t buffer_bytes = align_up(TestFile::kBytes);
  for (bool io_uring : kEngines) {
    for (bool registered : {true, false}) {
      SCOPED_TRACE(std::string(engine_name(io_uring)) + (registered ? ", buffer given" : ", no buffer given"));
      auto buffer = alloc_buffer(buffer_bytes);
      Completions completions;
      BlockReaderOptions options{.queue_depth = 4, .use_io_uring = io_uring, .faults = faults};
      if (registered) options.buffer = {buffer.get(), buffer_bytes};
      auto reader = storage::make_block_reader({file.path}, options, completions.callback());
      ASSERT_TRUE(reader.ok()) << reader.error().message;
      std::printf("[   info   ] %s\n", std::string((*reader)->method()).c_str());
      if (!io_uring) {
        EXPECT_EQ((*reader)->method().substr(0, 5), "pread");
      }

      const std::vector<BlockRead> reads = cover(TestFile::kBytes, buffer.get());
      submit_concurrently(**reader, reads, 4);
      (*reader)->drain();
      EXPECT_EQ((*reader)->pending(), 0u);
      EXPECT_EQ(completions.check_once(reads.size()), 0);
      for (const auto& [tag, statuses] : completions.by_tag) {
        for (const Status& s : statuses) EXPECT_TRUE(s.ok()) << s.error().message;
      }
      EXPECT_EQ(std::memcmp(buffer.get(), file.bytes.data(), TestFile::kBytes), 0);
    }
  }
}

TEST(BlockReader, ReadsAlignedRangesConcurrently) { read_whole_file(nullptr); }

TEST(BlockReader, RecoversFromShortReadsErrorsAndLatency) {
  const FaultInjection faults{
      .seed = 7, .short_read_rate = 0.3, .eio_rate = 0.1, .eagain_rate = 0.2, .latency_us = 200};
  read_whole_file(&faults);
}

// Each fault at rate 1: the reads fail as the retry limits say, or (short reads) still land.
TEST(BlockReader, InjectedFaultsTakeEffect) {
  TestFile file;
  struct Case {
    FaultInjection faults;
    const char* error;  // in every read's error, or nullptr: every read succeeds
  };
  const Case cases[] = {{{.eio_rate = 1}, "Input/output error (after 3 retries)"},
                        {{.eagain_rate = 1}, "(after 1000 retries)"},
                        {{.short_read_rate = 1}, nullptr}};
  // few and small: the EAGAIN case reads 1001 times each
  constexpr uint64_t kReads = 2;
  constexpr size_t kRead = 8 * kDirectAlign;
  for (bool io_uring : kEngines) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(engine_name(io_uring)) + ", " + (c.error ? c.error : "short reads"));
      auto buffer = alloc_buffer(kReads * kRead);
      Completions completions;
      auto reader = storage::make_block_reader(
          {file.path}, {.queue_depth = 2, .use_io_uring = io_uring, .faults = &c.faults}, completions.callback());
      ASSERT_TRUE(reader.ok()) << reader.error().message;
      for (uint64_t i = 0; i < kReads; ++i) {
        (*reader)->submit({.offset = i * kRead, .bytes = kRead, .dest = buffer.get() + i * kRead, .tag = i});
      }
      (*reader)->drain();
      EXPECT_EQ(completions.check_once(kReads), c.error ? int(kReads) : 0);
      for (const auto& [tag, statuses] : completions.by_tag) {
        for (const Status& s : statuses) {
          if (c.error) {
            ASSERT_FALSE(s.ok());
            EXPECT_NE(s.error().message.find(c.error), std::string::npos) << s.error().message;
          }
        }
      }
      if (!c.error) {
        EXPECT_EQ(std::memcmp(buffer.get(), file.bytes.data(), kReads * kRead), 0);
      }
    }
  }
}

TEST(BlockReader, FailingRangeFailsOnlyItsRead) {
  TestFile file;
  constexpr size_t kRead = 65536;
  constexpr uint64_t kBadRead = 16;  // the read at 1 MiB
  const FaultInjection faults{.short_read_rate = 0.3, .fail_file = 0, .fail_offset = kBadRead * kRead + 8192,
                              .fail_bytes = 100};
  for (bool io_uring : kEngines) {
    SCOPED_TRACE(engine_name(io_uring));
    auto buffer = alloc_buffer(32 * kRead);
    Completions completions;
    auto reader = storage::make_block_reader(
        {file.path}, {.queue_depth = 4, .use_io_uring = io_uring, .faults = &faults}, completions.callback());
    ASSERT_TRUE(reader.ok()) << reader.error().message;
    std::vector<BlockRead> reads;
    for (uint64_t i = 0; i < 32; ++i) {
      reads.push_back({.file = 0, .offset = i * kRead, .bytes = kRead, .dest = buffer.get() + i * kRead, .tag = i});
    }
    submit_concurrently(**reader, reads, 2);
    reader->reset();  // drains; any late second Done would have run by now
    EXPECT_EQ(completions.check_once(reads.size()), 1);
    for (const auto& [tag, statuses] : completions.by_tag) {
      for (const Status& s : statuses) {
        if (tag != kBadRead) {
          EXPECT_TRUE(s.ok()) << s.error().message;
          continue;
        }
        ASSERT_FALSE(s.ok());
        EXPECT_NE(s.error().message.find(file.path), std::string::npos) << s.error().message;
        EXPECT_NE(s.error().message.find(std::to_string(kBadRead * kRead)), std::string::npos) << s.error().message;
        EXPECT_NE(s.error().message.find("after 3 retries"), std::string::npos) << s.error().message;
      }
    }
    for (uint64_t i = 0; i < 32; ++i) {
      if (i == kBadRead) continue;
      EXPECT_EQ(std::memcmp(buffer.get() + i * kRead, file.bytes.data() + i * kRead, kRead), 0) << "read " << i;
    }
  }
}

// Also buffered (direct = false), where the last block's read returns the file's last bytes.
TEST(BlockReader, ReadPastEndOfFileFails) {
  TestFile file;
  const uint64_t last_block = align_up(TestFile::kBytes) - kDirectAlign;
  for (bool io_uring : kEngines) {
    for (bool direct : {true, false}) {
      SCOPED_TRACE(std::string(engine_name(io_uring)) + (direct ? " O_DIRECT" : " buffered"));
      auto buffer = alloc_buffer(4 * kDirectAlign);
      Completions completions;
      auto reader = storage::make_block_reader(
          {file.path}, {.queue_depth = 4, .use_io_uring = io_uring, .direct = direct}, completions.callback());
      ASSERT_TRUE(reader.ok()) << reader.error().message;
      if (!direct) {
        EXPECT_NE((*reader)->method().find("buffered"), std::string::npos) << (*reader)->method();
      }
      // 0: wholly past the end; 1: the last block and one past it; 2: the last block alone (fine)
      uint8_t* dest = buffer.get();
      (*reader)->submit({.offset = last_block + kDirectAlign, .bytes = kDirectAlign, .dest = dest, .tag = 0});
      (*reader)->submit({.offset = last_block, .bytes = 2 * kDirectAlign, .dest = dest + kDirectAlign, .tag = 1});
      (*reader)->submit({.offset = last_block, .bytes = kDirectAlign, .dest = dest + 3 * kDirectAlign, .tag = 2});
      (*reader)->drain();
      EXPECT_EQ(completions.check_once(3), 2);
      for (uint64_t tag : {0, 1}) {
        const Status& s = completions.by_tag[tag].at(0);
        ASSERT_FALSE(s.ok()) << "tag " << tag;
        EXPECT_NE(s.error().message.find("end of file"), std::string::npos) << s.error().message;
        EXPECT_NE(s.error().message.find(file.path), std::string::npos) << s.error().message;
      }
      const size_t tail = TestFile::kBytes - last_block;
      EXPECT_EQ(std::memcmp(dest + 3 * kDirectAlign, file.bytes.data() + last_block, tail), 0);
    }
  }
}

TEST(BlockReader, RejectsMissingFileAndBadOptions) {
  TestFile file;
  const std::string missing = (file.dir / "no-such-file.bin").string();
  auto done = [](uint64_t, const Status&) {};
  for (bool io_uring : kEngines) {
    SCOPED_TRACE(engine_name(io_uring));
    auto r = storage::make_block_reader({file.path, missing}, {.use_io_uring = io_uring}, done);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find(missing), std::string::npos) << r.error().message;
    for (int depth : {0, -1, 1025}) {
      r = storage::make_block_reader({file.path}, {.queue_depth = depth, .use_io_uring = io_uring}, done);
      ASSERT_FALSE(r.ok()) << "queue depth " << depth;
      EXPECT_NE(r.error().message.find("queue depth"), std::string::npos) << r.error().message;
    }
    r = storage::make_block_reader({file.path}, {.use_io_uring = io_uring}, nullptr);
    EXPECT_FALSE(r.ok());
  }
}

TEST(BlockReader, DestroyWithReadsInFlightRunsEveryDone) {
  TestFile file;
  const FaultInjection faults{.latency_us = 100};
  constexpr uint64_t kReads = 64;
  for (bool io_uring : kEngines) {
    SCOPED_TRACE(engine_name(io_uring));
    auto buffer = alloc_buffer(kReads * kDirectAlign);
    Completions completions;
    auto reader = storage::make_block_reader(
        {file.path}, {.queue_depth = 4, .use_io_uring = io_uring, .faults = &faults}, completions.callback());
    ASSERT_TRUE(reader.ok()) << reader.error().message;
    for (uint64_t i = 0; i < kReads; ++i) {
      (*reader)->submit({.offset = i * 2 * kDirectAlign, .bytes = kDirectAlign, .dest = buffer.get() + i * kDirectAlign,
                         .tag = i});
    }
    reader->reset();
    EXPECT_EQ(completions.check_once(kReads), 0);
  }
}

// Done may submit: each of the first reads queues a follow-up from the reader's thread.
TEST(BlockReader, DoneMaySubmit) {
  TestFile file;
  constexpr uint64_t kFirst = 16;
  for (bool io_uring : kEngines) {
    SCOPED_TRACE(engine_name(io_uring));
    auto buffer = alloc_buffer(2 * kFirst * kDirectAlign);
    Completions completions;
    storage::BlockReader* self = nullptr;
    auto record = completions.callback();
    auto done = [&](uint64_t tag, const Status& status) {
      record(tag, status);
      if (tag < kFirst) {
        const uint64_t next = tag + kFirst;
        self->submit({.offset = next * kDirectAlign, .bytes = kDirectAlign, .dest = buffer.get() + next * kDirectAlign,
                      .tag = next});
      }
    };
    auto reader = storage::make_block_reader({file.path}, {.queue_depth = 2, .use_io_uring = io_uring}, done);
    ASSERT_TRUE(reader.ok()) << reader.error().message;
    self = reader->get();
    for (uint64_t i = 0; i < kFirst; ++i) {
      self->submit(
          {.offset = i * kDirectAlign, .bytes = kDirectAlign, .dest = buffer.get() + i * kDirectAlign, .tag = i});
    }
    self->drain();
    EXPECT_EQ(completions.check_once(2 * kFirst), 0);
    EXPECT_EQ(std::memcmp(buffer.get(), file.bytes.data(), 2 * kFirst * kDirectAlign), 0);
  }
}

}  // namespace
}  // namespace strata
