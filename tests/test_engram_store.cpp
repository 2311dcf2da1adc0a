// deepseek41's Engram tables on the NVMe tier: the row cache policy (storage/row_cache.h) on
// traces, the row store (storage/row_store.h) against the file's bytes with the reader misbehaving
// or failing, and a model whose Engram rows and experts are streamed computing exactly what the
// all-in-RAM model computes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <unordered_map>

#include "engine/engine.h"
#include "engine/engram_tier.h"
#include "engine/session.h"
#include "model/engram.h"
#include "model/synth.h"
#include "storage/expert_store.h"
#include "storage/row_cache.h"
#include "storage/row_store.h"

namespace strata {
namespace {

// ---- the policy ----

// Random inserts, finds, pins and erases against a reference map: the index always agrees with the
// slots, capacity is never exceeded, a pinned slot is never evicted.
TEST(RowCache, IndexAgreesWithAReferenceUnderRandomOperations) {
  RowCache c(64);
  std::unordered_map<uint64_t, int64_t> ref;  // key -> slot
  std::mt19937_64 rng(5);
  std::vector<int64_t> pinned;
  for (int step = 0; step < 20000; ++step) {
    const uint64_t key = rng() % 300;
    const int op = int(rng() % 10);
    if (op < 6) {
      const int64_t s = c.find(key);
      auto it = ref.find(key);
      ASSERT_EQ(s, it == ref.end() ? -1 : it->second) << step;
      if (s < 0) {
        uint64_t evicted = 0;
        const int64_t slot = c.insert(key, &evicted);
        if (slot < 0) {
          ASSERT_EQ(int64_t(std::set<int64_t>(pinned.begin(), pinned.end()).size()), c.capacity());
          continue;
        }
        if (evicted != RowCache::kNone) {
          ASSERT_EQ(ref.at(evicted), slot);
          ASSERT_EQ(c.pins(slot), 0) << "a pinned slot was evicted";
          ref.erase(evicted);
        }
        ref[key] = slot;
      }
    } else if (op < 8 && !ref.empty()) {
      auto it = ref.begin();
      std::advance(it, long(rng() % ref.size()));
      c.pin(it->second);
      pinned.push_back(it->second);
    } else if (op < 9 && !pinned.empty()) {
      const size_t i = rng() % pinned.size();
      c.unpin(pinned[i]);
      pinned.erase(pinned.begin() + long(i));
    } else if (!ref.empty()) {
      auto it = ref.begin();
      std::advance(it, long(rng() % ref.size()));
      if (c.pins(it->second) == 0) {
        c.erase_slot(it->second);
        ref.erase(it);
      }
    }
    ASSERT_EQ(c.size(), int64_t(ref.size()));
    ASSERT_LE(c.size(), c.capacity());
  }
  for (const auto& [key, slot] : ref) EXPECT_EQ(c.key_of(slot), key);
}

// Hot n-grams recur: on a Zipf-distributed trace (s = 1, 100k distinct rows) a cache of 5% of the
// rows hits far more often than its share.
TEST(RowCache, KeepsRecurringRowsOnAZipfTrace) {
  const int N = 100000, C = N / 20;
  std::vector<double> cdf(N);
  double sum = 0;
  for (int i = 0; i < N; ++i) cdf[size_t(i)] = sum += 1.0 / (i + 1);
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> u(0, sum);
  auto draw = [&] { return uint64_t(std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin()); };
  RowCache c(C);
  int64_t hits = 0, n = 0;
  for (int i = 0; i < 400000; ++i) {
    const uint64_t key = draw();
    uint64_t ev = 0;
    if (c.find(key) >= 0) hits += i >= 100000;
    else c.insert(key, &ev);
    n += i >= 100000;
  }
  const double rate = double(hits) / double(n);
  // the hottest 5% of the rows carry ~ln(5000)/ln(100000) = 74% of the uses; CLOCK gets most of it
  std::printf("  CLOCK, 5%% of 100k Zipf rows: hit rate %.3f\n", rate);
  EXPECT_GT(rate, 0.60);
}

// ---- the store ----

class RowFile {
 public:
  RowFile(size_t bytes, uint64_t seed) : path_(::testing::TempDir() + "strata-rows-" + std::to_string(::getpid()) +
                                              "-" + std::to_string(seed)) {
    data_.resize(bytes);
    std::mt19937_64 rng(seed);
    for (uint8_t& b : data_) b = uint8_t(rng());
    std::ofstream(path_, std::ios::binary).write(reinterpret_cast<const char*>(data_.data()), long(bytes));
  }
  ~RowFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }
  const uint8_t* at(uint64_t off) const { return data_.data() + off; }

 private:
  std::string path_;
  std::vector<uint8_t> data_;
};

// Two tables of 272-byte rows (Q8_0 rows of 256) at unaligned offsets.
const std::vector<RowTable> kTables = {{1000, 20000, 272}, {1000 + 20000 * 272 + 77, 9000, 272}};
constexpr size_t kFileBytes = 1000 + 20000 * 272 + 77 + 9000 * 272 + 5;

std::vector<int64_t> random_rows(std::mt19937& rng, int n, int64_t n_rows) {
  std::vector<int64_t> r;
  for (int i = 0; i < n; ++i) r.push_back(int64_t(rng() % uint64_t(n_rows)));
  r.push_back(r.front());  // a repeat
  return r;
}

void expect_rows(const RowFile& f, const RowTable& t, std::span<const int64_t> rows, const std::vector<uint8_t>& got) {
  for (size_t i = 0; i < rows.size(); ++i)
    ASSERT_EQ(std::memcmp(got.data() + i * t.row_bytes, f.at(t.offset + uint64_t(rows[i]) * t.row_bytes), t.row_bytes), 0)
        << "row " << rows[i];
}

TEST(RowStore, GathersTheFilesBytesPrefetchedOrNot) {
  RowFile f(kFileBytes, 1);
  for (bool io_uring : {true, false}) {
    SCOPED_TRACE(io_uring ? "io_uring" : "pread");
    RowStoreOptions o;
    o.cache_bytes = 8192 * 272;
    o.use_io_uring = io_uring;
    auto s = RowStore::open(kTables, f.path(), o);
    ASSERT_TRUE(s.ok()) << s.error().message;
    std::mt19937 rng(2);
    for (int step = 0; step < 30; ++step) {
      const int t = step % 2;
      const std::vector<int64_t> rows = random_rows(rng, 48, int64_t(kTables[size_t(t)].n_rows));
      if (step % 3 != 2) (*s)->prefetch(t, rows);  // every third step without: demand reads
      std::vector<uint8_t> out(rows.size() * 272);
      ASSERT_TRUE((*s)->gather(t, rows, out.data()));
      expect_rows(f, kTables[size_t(t)], rows, out);
    }
    const RowStoreStats st = (*s)->stats();
    EXPECT_EQ(st.rows, 30 * 49);
    EXPECT_GT(st.prefetched, 0);
    EXPECT_GT(st.demand, 0);
    EXPECT_GT(st.cached, 0);  // repeats across steps
    EXPECT_LT(st.reads, st.prefetched + st.demand);  // neighbours merged into one read
    EXPECT_EQ(st.bytes_read % storage::kDirectAlign, 0u);
    EXPECT_TRUE((*s)->take_error().ok());
  }
}

// Adjacent rows are one read of their covering blocks; rows far apart are one read each.
TEST(RowStore, MergesAdjacentRowsIntoOneRead) {
  RowFile f(kFileBytes, 3);
  RowStoreOptions o;
  o.cache_bytes = 8192 * 272;
  auto s = RowStore::open(kTables, f.path(), o);
  ASSERT_TRUE(s.ok()) << s.error().message;
  std::vector<int64_t> run;
  for (int64_t r = 100; r < 160; ++r) run.push_back(r);  // 60 rows = 16 KB
  (*s)->prefetch(0, run);
  std::vector<uint8_t> out(run.size() * 272);
  ASSERT_TRUE((*s)->gather(0, run, out.data()));
  expect_rows(f, kTables[0], run, out);
  EXPECT_EQ((*s)->stats().reads, 1);
  (*s)->reset_stats();
  const std::vector<int64_t> apart = {1000, 5000, 9000, 13000};
  (*s)->prefetch(0, apart);
  out.resize(apart.size() * 272);
  ASSERT_TRUE((*s)->gather(0, apart, out.data()));
  EXPECT_EQ((*s)->stats().reads, 4);
  EXPECT_EQ((*s)->stats().bytes_read, 4 * storage::kDirectAlign);  // each row inside one block
}

// Short reads, EIO and EAGAIN are retried to the right bytes; a range that always fails fails the
// gather with an error naming the file and offset, never zeros, and the row is read again later.
TEST(RowStore, FaultsAreRetriedOrReported) {
  RowFile f(kFileBytes, 4);
  storage::FaultInjection noisy;
  noisy.short_read_rate = 0.3;
  noisy.eio_rate = 0.1;
  noisy.eagain_rate = 0.1;
  RowStoreOptions o;
  o.cache_bytes = 8192 * 272;
  o.faults = &noisy;
  {
    auto s = RowStore::open(kTables, f.path(), o);
    ASSERT_TRUE(s.ok()) << s.error().message;
    std::mt19937 rng(6);
    for (int step = 0; step < 10; ++step) {
      const std::vector<int64_t> rows = random_rows(rng, 64, 9000);
      (*s)->prefetch(1, rows);
      std::vector<uint8_t> out(rows.size() * 272);
      ASSERT_TRUE((*s)->gather(1, rows, out.data()));
      expect_rows(f, kTables[1], rows, out);
    }
  }
  storage::FaultInjection broken;
  broken.fail_file = 0;
  broken.fail_offset = kTables[1].offset + 700 * 272;
  broken.fail_bytes = 1;
  o.faults = &broken;
  auto s = RowStore::open(kTables, f.path(), o);
  ASSERT_TRUE(s.ok());
  const std::vector<int64_t> rows = {5, 700, 8000};
  std::vector<uint8_t> out(rows.size() * 272, 0xAB);
  (*s)->prefetch(1, rows);
  EXPECT_FALSE((*s)->gather(1, rows, out.data()));
  const Status e = (*s)->take_error();
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find(f.path()), std::string::npos) << e.error().message;
  EXPECT_NE(e.error().message.find("offset"), std::string::npos) << e.error().message;
  EXPECT_FALSE((*s)->gather(1, rows, out.data())) << "read again, failing again";
  EXPECT_FALSE((*s)->take_error().ok());
  const std::vector<int64_t> fine = {5, 8000};
  ASSERT_TRUE((*s)->gather(1, fine, out.data()));
  expect_rows(f, kTables[1], fine, out);
}

TEST(RowStore, BadTablesAndCachesAreErrors) {
  RowFile f(kFileBytes, 5);
  RowStoreOptions o;
  o.cache_bytes = 100 * 272;
  auto small = RowStore::open(kTables, f.path(), o);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.error().message.find("storage.engram_cache"), std::string::npos) << small.error().message;
  o.cache_bytes = 8192 * 272;
  auto past = RowStore::open({{kFileBytes - 100, 1, 272}}, f.path(), o);
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.error().message.find("past the end"), std::string::npos) << past.error().message;
  EXPECT_FALSE(RowStore::open({}, f.path(), o).ok());
  EXPECT_FALSE(RowStore::open(kTables, f.path() + ".missing", o).ok());
}

// ---- the model ----

// tiny-deepseek41 with tables of ~20k rows, written to a file: streamed through an expert cache of
// the fewest slots and a row cache of 4096 rows (a fifth of one table), the logits of a prompt and
// 24 greedy steps are bit-identical to the all-in-RAM model's; every Engram row a step reads was
// prefetched before its layer (no demand reads); a failed row read is an error naming the file.
TEST(EngramStore, StreamedEqualsInRam) {
  const SynthShape* shape = find_synth_shape("tiny-deepseek41");
  ASSERT_NE(shape, nullptr);
  auto plan = build_synth_plan(*shape, SynthQuant::q8_0, {.seed = 11, .engram_rows = 20000});
  ASSERT_TRUE(plan.ok());
  const std::string path = ::testing::TempDir() + "strata-engram-" + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(plan->write_file(path).ok());
  struct Remove {
    std::string p;
    ~Remove() { std::remove(p.c_str()); }
  } remove{path};

  auto run = [&](Session& s) {
    std::vector<int32_t> prompt;
    std::mt19937 rng(3);
    for (int i = 0; i < 40; ++i) prompt.push_back(int32_t(rng() % 1024));
    std::vector<std::vector<float>> out;
    auto l = s.eval(prompt);
    if (!l) return Result<std::vector<std::vector<float>>>(l.error());
    out.push_back(*l);
    for (int i = 0; i < 24; ++i) {
      const int32_t next = argmax(out.back());
      auto n = s.eval(std::span<const int32_t>(&next, 1));
      if (!n) return Result<std::vector<std::vector<float>>>(n.error());
      out.push_back(*n);
    }
    return Result<std::vector<std::vector<float>>>(std::move(out));
  };
  auto ram = Model::load(path, MappedFile::Mode::ram, true);
  ASSERT_TRUE(ram.ok()) << ram.error().message;
  Session rs(**ram, 128);
  auto want = run(rs);
  ASSERT_TRUE(want.ok());

  auto streamed = [&](const storage::FaultInjection* faults) -> std::unique_ptr<Engine> {
    auto loaded = Model::load(path, MappedFile::Mode::mmap, true, /*stream_experts=*/true);
    STRATA_CHECK(loaded.ok());
    auto e = std::make_unique<Engine>(std::move(*loaded));
    ExpertStoreOptions eo;
    eo.cache_bytes = uint64_t(1) << 30;
    eo.queue_depth = 4;
    auto store = ExpertStore::open(expert_layout(e->model()), path, eo);
    STRATA_CHECK(store.ok());
    e->set_expert_store(std::move(*store));
    RowStoreOptions ro;
    ro.cache_bytes = RowStore::kMinRows * 68;  // Q8_0 rows of 64
    ro.faults = faults;
    auto rows = RowStore::open(engram_tables(e->model()), path, ro);
    STRATA_CHECK(rows.ok());
    e->set_engram_store(std::move(*rows));
    return e;
  };
  auto e = streamed(nullptr);
  EXPECT_EQ(e->model().layers[0].engram_embd.data - e->model().file().bytes_.data(),
            int64_t(engram_tables(e->model())[0].offset));
  Session ss(*e, 128);
  auto got = run(ss);
  ASSERT_TRUE(got.ok()) << got.error().message;
  ASSERT_EQ(got->size(), want->size());
  for (size_t i = 0; i < got->size(); ++i)
    EXPECT_EQ(std::memcmp((*got)[i].data(), (*want)[i].data(), (*got)[i].size() * sizeof(float)), 0) << "step " << i;
  const RowStoreStats st = e->engram_store()->stats();
  EXPECT_EQ(st.rows, 2 * 64 * 6);  // two Engram layers, 64 tokens, 6 rows each
  EXPECT_EQ(st.demand, 0);
  EXPECT_GT(st.prefetched, 0);
  std::printf("  streamed Engram: %lld rows gathered, %lld distinct, %lld cached, %lld reads of %llu bytes\n",
              static_cast<long long>(st.rows), static_cast<long long>(st.lookups), static_cast<long long>(st.cached),
              static_cast<long long>(st.reads), static_cast<unsigned long long>(st.bytes_read));

  // a table whose every read fails: the step is an error naming the file, not zeros
  storage::FaultInjection broken;
  broken.fail_file = 0;
  broken.fail_offset = engram_tables(e->model())[1].offset;
  broken.fail_bytes = engram_tables(e->model())[1].n_rows * 68;
  auto bad = streamed(&broken);
  Session bs(*bad, 128);
  auto r = run(bs);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(path), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace strata
