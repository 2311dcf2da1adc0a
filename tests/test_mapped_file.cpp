// MappedFile's two ways in: mapped and read into RAM (several reader threads, huge pages), and the
// automatic choice; the bytes are the file's either way, the mode survives moves, and a missing
// file is an error naming it; a mapping populated in the background ends up resident.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "test_support.h"

namespace strata {
namespace {

TEST(MappedFile, RamAndMmapHoldTheSameBytes) {
  const auto path = test::scratch_dir("mapped_file") / "data.bin";
  // a few 64 MiB reader chunks plus a tail, random bytes
  std::vector<char> bytes((size_t(130) << 20) + 12345);
  std::mt19937_64 rng(7);
  for (size_t i = 0; i < bytes.size(); i += 8) {
    const uint64_t v = rng();
    for (size_t j = 0; j < 8 && i + j < bytes.size(); ++j) bytes[i + j] = char(v >> (8 * j));
  }
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));

  for (MappedFile::Mode mode : {MappedFile::Mode::mmap, MappedFile::Mode::ram, MappedFile::Mode::automatic}) {
    auto f = MappedFile::open(path.string(), mode);
    ASSERT_TRUE(f) << f.error().message;
    MappedFile moved = std::move(*f);  // the mode and the bytes survive a move
    EXPECT_NE(moved.mode(), MappedFile::Mode::automatic);
    if (mode != MappedFile::Mode::automatic) {
      EXPECT_EQ(moved.mode(), mode);
    }
    ASSERT_EQ(moved.size(), bytes.size());
    EXPECT_EQ(0, std::memcmp(moved.bytes().data(), bytes.data(), bytes.size()));
  }
}

// Pages of the mapping that are in memory (mincore).
size_t resident_pages(const MappedFile& f) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v((f.size() + page - 1) / page);
  if (mincore(const_cast<uint8_t*>(f.bytes().data()), f.size(), v.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

TEST(MappedFile, PopulatedInTheBackground) {
  const auto path = test::scratch_dir("mapped_file") / "populate.bin";
  std::vector<char> bytes((size_t(150) << 20) + 777);
  std::mt19937_64 rng(9);
  for (char& c : bytes) c = char(rng());
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  auto ram = MappedFile::open(path.string(), MappedFile::Mode::ram);
  ASSERT_TRUE(ram) << ram.error().message;
  EXPECT_FALSE(ram->populate_in_background());  // nothing to populate
  EXPECT_EQ(ram->populated_bytes(), 0u);
  ram = MappedFile();
  {  // out of the page cache where the file system allows it (tmpfs does not)
    const int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }

  auto f = MappedFile::open(path.string(), MappedFile::Mode::mmap);
  ASSERT_TRUE(f) << f.error().message;
  const size_t page = size_t(sysconf(_SC_PAGESIZE)), pages = (f->size() + page - 1) / page;
  const size_t before = resident_pages(*f);
  ASSERT_TRUE(f->populate_in_background());
  EXPECT_FALSE(f->populate_in_background());  // once
  MappedFile moved = std::move(*f);           // the thread reads the mapping, not the object
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (moved.populated_bytes() < moved.size() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(moved.populated_bytes(), moved.size());
  const size_t after = resident_pages(moved);
  std::printf("resident pages of %zu: %zu before, %zu after the background population\n", pages, before, after);
  EXPECT_EQ(after, pages);
  if (before == pages) std::printf("(the page cache kept the file: residency before proves nothing here)\n");
  EXPECT_EQ(0, std::memcmp(moved.bytes().data(), bytes.data(), bytes.size()));

  // closed while the thread is still at work: the destructor stops and joins it before unmapping
  for (int i = 0; i < 3; ++i) {
    auto g = MappedFile::open(path.string(), MappedFile::Mode::mmap);
    ASSERT_TRUE(g) << g.error().message;
    ASSERT_TRUE(g->populate_in_background());
  }
}

TEST(MappedFile, MissingFileIsAnErrorNamingIt) {
  for (MappedFile::Mode mode : {MappedFile::Mode::mmap, MappedFile::Mode::ram}) {
    auto f = MappedFile::open("/nonexistent/strata-model.gguf", mode);
    ASSERT_FALSE(f);
    EXPECT_NE(f.error().message.find("/nonexistent/strata-model.gguf"), std::string::npos);
  }
}

}  // namespace
}  // namespace strata
