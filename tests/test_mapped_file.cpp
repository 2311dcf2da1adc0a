// MappedFile's two ways in: mapped and read into RAM (several reader threads, huge pages), and the
// automatic choice; the bytes are the file's either way, the mode survives moves, and a missing
// file is an error naming it.
#include <gtest/gtest.h>

#include <cstring>
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

TEST(MappedFile, MissingFileIsAnErrorNamingIt) {
  for (MappedFile::Mode mode : {MappedFile::Mode::mmap, MappedFile::Mode::ram}) {
    auto f = MappedFile::open("/nonexistent/strata-model.gguf", mode);
    ASSERT_FALSE(f);
    EXPECT_NE(f.error().message.find("/nonexistent/strata-model.gguf"), std::string::npos);
  }
}

}  // namespace
}  // namespace strata
