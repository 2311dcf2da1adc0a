// The measurement primitives of `strata calibrate`: the disk read probe (storage/disk_probe.h) on a
// temporary file and on an existing one, through io_uring and the pread fallback, the names it
// gives a buffered or memory-backed measurement, its errors; and the bf16 peak probe
// (cpu/calibrate.h); the interleave probe (cpu/kernel_probe.h) measures exactly where the running
// kernels interleave Q4_K. Figures are only checked to be positive: speeds are benchmarks, not tests.
#include <gtest/gtest.h>

#include <sys/statfs.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cpu/calibrate.h"
#include "cpu/kernel_probe.h"
#include "cpu/repack.h"
#include "cpu/thread_pool.h"
#include "storage/disk_probe.h"
#include "test_support.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using storage::DiskAccess;
using storage::DiskProbeOptions;
using storage::DiskProbeResult;
using storage::measure_disk_read;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The method string and the flags agree, and the figures are those of a measurement.
void expect_consistent(const DiskProbeResult& r, const DiskProbeOptions& o) {
  EXPECT_GT(r.gbps, 0);
  EXPECT_GT(r.bytes_read, 0u);
  EXPECT_EQ(r.bytes_read % o.block_bytes, 0u);
  EXPECT_GT(r.seconds, 0);
  EXPECT_EQ(r.queue_depth, o.queue_depth);
  EXPECT_EQ(r.block_bytes, o.block_bytes);
  EXPECT_EQ(contains(r.method, "io_uring"), r.io_uring) << r.method;
  EXPECT_EQ(contains(r.method, "pread"), !r.io_uring) << r.method;
  if (r.direct) {
    EXPECT_TRUE(contains(r.method, "O_DIRECT") && !contains(r.method, "buffered")) << r.method;
  } else {
    EXPECT_TRUE(contains(r.method, "buffered (O_DIRECT refused)")) << r.method;
    EXPECT_TRUE(contains(r.note, "not disk bandwidth")) << r.note;
  }
}

DiskProbeOptions small_probe(const fs::path& path) {
  return {.path = path.string(),
          .file_bytes = size_t(64) << 20,
          .block_bytes = size_t(1) << 20,
          .queue_depth = 4,
          .seconds = 0.2};
}

TEST(DiskProbe, ReadsATemporaryFileInADirectoryAndRemovesIt) {
  const fs::path dir = test::scratch_dir("disk_probe_dir");
  const DiskProbeOptions o = small_probe(dir);
  auto r = measure_disk_read(o);
  ASSERT_TRUE(r) << r.error().message;
  expect_consistent(*r, o);
  EXPECT_EQ(r->file_bytes, o.file_bytes);
  EXPECT_TRUE(r->io_uring || contains(r->note, "io_uring unavailable")) << r->note;
  EXPECT_FALSE(r->memory_backed && !contains(r->note, "memory-backed")) << r->note;
  EXPECT_TRUE(fs::is_empty(dir)) << "the test file is left behind";
}

TEST(DiskProbe, PreadFallbackWhenIoUringIsOff) {
  const fs::path dir = test::scratch_dir("disk_probe_pread");
  DiskProbeOptions o = small_probe(dir);
  o.use_io_uring = false;
  auto r = measure_disk_read(o);
  ASSERT_TRUE(r) << r.error().message;
  expect_consistent(*r, o);
  EXPECT_FALSE(r->io_uring);
  EXPECT_EQ(r->method.rfind("pread", 0), 0u) << r->method;
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(DiskProbe, ReadsAnExistingFileInWholeBlocksWithoutChangingIt) {
  const fs::path path = test::scratch_dir("disk_probe_file") / "data.bin";
  const size_t size = (size_t(5) << 20) + 1000;  // the tail past the last whole block is not read
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = uint8_t(i * 131 + (i >> 12));
  test::write_file(path, bytes);
  for (DiskAccess access : {DiskAccess::sequential, DiskAccess::random}) {
    for (bool use_io_uring : {true, false}) {
      DiskProbeOptions o = small_probe(path);
      o.queue_depth = 3;  // not a power of two: the ring rounds up, the probe keeps 3 in flight
      o.use_io_uring = use_io_uring;
      o.access = access;
      auto r = measure_disk_read(o);
      ASSERT_TRUE(r) << r.error().message;
      expect_consistent(*r, o);
      EXPECT_EQ(r->file_bytes, uint64_t(5) << 20);
    }
  }
  EXPECT_EQ(test::read_file(path), bytes);
}

// /dev/shm is tmpfs: O_DIRECT is refused (kernels before 6.6, then buffered) or accepted on RAM;
// either way the result says it is not a disk figure.
TEST(DiskProbe, MemoryBackedFilesystemIsNamed) {
  struct statfs st {};
  if (statfs("/dev/shm", &st) != 0 || st.f_type != 0x01021994 /* TMPFS_MAGIC */) {
    GTEST_SKIP() << "no tmpfs at /dev/shm";
  }
  DiskProbeOptions o = small_probe("/dev/shm");
  o.file_bytes = size_t(8) << 20;
  auto r = measure_disk_read(o);
  ASSERT_TRUE(r) << r.error().message;
  expect_consistent(*r, o);
  EXPECT_TRUE(r->memory_backed);
  EXPECT_TRUE(contains(r->note, "memory-backed")) << r->note;
}

TEST(DiskProbe, MissingPathIsAnErrorNamingIt) {
  DiskProbeOptions o = small_probe("/nonexistent/strata-disk-probe");
  for (bool use_io_uring : {true, false}) {
    o.use_io_uring = use_io_uring;
    auto r = measure_disk_read(o);
    ASSERT_FALSE(r);
    EXPECT_TRUE(contains(r.error().message, "/nonexistent/strata-disk-probe")) << r.error().message;
  }
}

TEST(DiskProbe, BadOptionsAndTooSmallFilesAreErrors) {
  const fs::path dir = test::scratch_dir("disk_probe_bad");
  const fs::path small = dir / "small.bin";
  test::write_file(small, std::vector<uint8_t>(100000, 7));
  {
    auto r = measure_disk_read(small_probe(small));  // 100 kB < one 1 MiB block
    ASSERT_FALSE(r);
    EXPECT_TRUE(contains(r.error().message, small.string())) << r.error().message;
    EXPECT_TRUE(contains(r.error().message, "smaller than one read block")) << r.error().message;
  }
  {
    DiskProbeOptions o = small_probe(dir);
    o.block_bytes = 1000;
    auto r = measure_disk_read(o);
    ASSERT_FALSE(r);
    EXPECT_TRUE(contains(r.error().message, "multiple of 4096")) << r.error().message;
  }
  {
    DiskProbeOptions o = small_probe(dir);
    o.queue_depth = 0;
    EXPECT_FALSE(measure_disk_read(o));
    o.queue_depth = 4;
    o.seconds = 0;
    EXPECT_FALSE(measure_disk_read(o));
  }
  fs::remove(small);
  EXPECT_TRUE(fs::is_empty(dir)) << "a failed probe leaves no test file behind";
}

TEST(Bf16Peak, MeasuresWhatItNames) {
  cpu::ThreadPool pool(2, /*pin=*/false);
  const std::string method(cpu::bf16_peak_method());
  ASSERT_FALSE(method.empty());
  const double gflops = cpu::measure_bf16_peak_gflops(pool);
  if (contains(method, "none")) {
    EXPECT_EQ(gflops, 0);
  } else {
    EXPECT_GT(gflops, 0) << method;
  }
}

// Q4_K where the kernels interleave it (AVX-512), else MXFP4 (AVX2 interleaves the 32-element
// formats only), else 0.
TEST(KernelProbe, InterleaveRateWhereTheKernelsInterleave) {
  cpu::ThreadPool& pool = cpu::compute_pool();
  GgmlType measured = GgmlType::f32;
  const double gbps = cpu::measure_interleave_gbps(pool, size_t(16) << 20, 0.03, &measured);
  auto interleaves = [](GgmlType type) {
    Weight w;  // a 2048 x 768 matrix, as the probe's
    w.data = reinterpret_cast<const uint8_t*>(&w);
    w.type = type;
    w.n_in = 2048;
    w.n_out = 768;
    w.row_bytes = ggml_row_bytes(type, 2048);
    return cpu::can_interleave(w);
  };
  if (interleaves(GgmlType::q4_k)) {
    EXPECT_GT(gbps, 0.0);
    EXPECT_EQ(measured, GgmlType::q4_k);
  } else if (interleaves(GgmlType::mxfp4)) {
    EXPECT_GT(gbps, 0.0);
    EXPECT_EQ(measured, GgmlType::mxfp4);
  } else {
    EXPECT_EQ(gbps, 0.0);
  }
}

}  // namespace
}  // namespace strata
