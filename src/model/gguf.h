// GGUF reading (validated, zero-copy over a memory map) and writing (streamed, for files of any
// size). Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md, versions 2 and 3.
//
// Everything in a GgufFile has been validated when open()/parse() returns: every string and array
// lies inside the file, every tensor's type is known, its shape product does not overflow, its rows
// are whole blocks, its data is aligned and lies inside the file, no two tensors overlap, no name or
// key appears twice. Callers may index tensor data without further bounds checks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "base/mapped_file.h"
#include "cpu/ggml_type.h"

namespace strata {

// On-disk value type ids of GGUF metadata.
enum class GgufType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
std::string_view gguf_type_name(GgufType type);

// One metadata value. Scalars are widened into one of three slots by signedness; arrays own their
// elements (arrays may nest). `type` is the type stored on disk, so a writer can reproduce it.
struct GgufValue {
  GgufType type = GgufType::u32;
  uint64_t u = 0;       // u8, u16, u32, u64, bool
  int64_t i = 0;        // i8, i16, i32, i64
  double f = 0;         // f32, f64
  std::string str;      // string
  GgufType elem_type = GgufType::u8;  // array
  std::vector<GgufValue> elems;       // array

  static GgufValue make_u32(uint32_t v) { return scalar_u(GgufType::u32, v); }
  static GgufValue make_u64(uint64_t v) { return scalar_u(GgufType::u64, v); }
  static GgufValue make_bool(bool v) { return scalar_u(GgufType::boolean, v ? 1 : 0); }
  static GgufValue make_i32(int32_t v) {
    GgufValue x;
    x.type = GgufType::i32;
    x.i = v;
    return x;
  }
  static GgufValue make_f32(float v) {
    GgufValue x;
    x.type = GgufType::f32;
    x.f = v;
    return x;
  }
  static GgufValue make_string(std::string v) {
    GgufValue x;
    x.type = GgufType::string;
    x.str = std::move(v);
    return x;
  }
  // An array of `elem_type`; `elems` must all have that type.
  static GgufValue make_array(GgufType elem_type, std::vector<GgufValue> elems) {
    GgufValue x;
    x.type = GgufType::array;
    x.elem_type = elem_type;
    x.elems = std::move(elems);
    return x;
  }
  static GgufValue make_string_array(const std::vector<std::string>& v);
  static GgufValue make_f32_array(const std::vector<float>& v);
  static GgufValue make_i32_array(const std::vector<int32_t>& v);

  bool is_integer() const;
  bool is_float() const { return type == GgufType::f32 || type == GgufType::f64; }
  // A short rendering for `strata info`: scalars in full, strings quoted and cut, arrays as
  // "[type x n]" with their first few elements.
  std::string to_display_string(size_t max_chars = 60) const;

 private:
  static GgufValue scalar_u(GgufType t, uint64_t v) {
    GgufValue x;
    x.type = t;
    x.u = v;
    return x;
  }
};

struct GgufKv {
  std::string key;
  GgufValue value;
};

constexpr int kGgufMaxDims = 4;

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::f32;
  int n_dims = 0;
  uint64_t ne[kGgufMaxDims] = {1, 1, 1, 1};  // ne[0] is the contiguous (row) dimension
  uint64_t offset = 0;  // from the start of the data section
  uint64_t n_bytes = 0;

  uint64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  uint64_t row_bytes() const { return ggml_row_bytes(type, ne[0]); }
  std::string shape_string() const;  // "[2048, 768, 128]"
};

class GgufFile {
 public:
  // Maps and validates `path`.
  static Result<GgufFile> open(const std::string& path, MappedFile::Mode mode = MappedFile::Mode::mmap);
  // Validates bytes held by the caller, who keeps them alive as long as the GgufFile. `name` is
  // used in messages.
  static Result<GgufFile> parse(std::span<const uint8_t> bytes, std::string name = "<memory>");
  // Validates only the header, metadata and tensor infos of a file of `file_size` bytes whose data
  // section is not at hand (planning for a model described by its header, e.g. a synthetic shape).
  // Everything but tensor_data() works; tensor_data() is a programming error (checked).
  static Result<GgufFile> parse_header(std::span<const uint8_t> header, uint64_t file_size,
                                       std::string name);

  const std::string& name() const { return name_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section
  uint64_t file_size() const { return header_only_ ? declared_size_ : bytes_.size(); }

  const std::vector<GgufKv>& kvs() const { return kvs_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  const GgufValue* find(std::string_view key) const;
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  // The tensor's bytes, inside the file by construction.
  std::span<const uint8_t> tensor_data(const GgufTensorInfo& t) const {
    STRATA_CHECK(!header_only_, "tensor_data() of a header-only GgufFile");
    return bytes_.subspan(data_offset_ + t.offset, t.n_bytes);
  }

  // Typed metadata access. Missing keys give nullopt (get_*) or an Error naming the key
  // (require_*); a present key of the wrong type is always an Error naming both types.
  Result<std::optional<uint64_t>> get_uint(std::string_view key) const;
  Result<std::optional<int64_t>> get_int(std::string_view key) const;
  Result<std::optional<double>> get_float(std::string_view key) const;  // accepts integers too
  Result<std::optional<bool>> get_bool(std::string_view key) const;
  Result<std::optional<std::string>> get_string(std::string_view key) const;
  Result<uint64_t> require_uint(std::string_view key) const;
  Result<double> require_float(std::string_view key) const;
  Result<std::string> require_string(std::string_view key) const;
  // An array of numbers (ints or floats) as doubles; an error if an element is not a number.
  Result<std::optional<std::vector<double>>> get_number_array(std::string_view key) const;
  // An array of non-negative integers, exactly (64-bit hash multipliers do not fit a double);
  // an error if an element is not an integer or is negative.
  Result<std::optional<std::vector<uint64_t>>> get_uint_array(std::string_view key) const;

 private:
  static Result<GgufFile> parse_impl(std::span<const uint8_t> bytes, uint64_t file_size, std::string name);
  std::shared_ptr<MappedFile> map_;  // null when parsing caller-owned bytes
  bool header_only_ = false;
  uint64_t declared_size_ = 0;

 public:
  // How the file's bytes came into memory (mmap for caller-owned bytes).
  MappedFile::Mode load_mode() const { return map_ ? map_->mode() : MappedFile::Mode::mmap; }
  // The bytes, writable, where they were read into RAM (null otherwise): for the loader's in-place
  // repacking (cpu/repack.h).
  uint8_t* mutable_bytes() const { return map_ ? map_->mutable_data() : nullptr; }
  // A mapped file: its pages read into memory on a background thread (MappedFile::
  // populate_in_background); false for bytes read into RAM or owned by the caller.
  bool populate_in_background() const { return map_ && map_->populate_in_background(); }
  std::span<const uint8_t> bytes_;
  std::string name_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKv> kvs_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

// Limits that bound what a hostile file can make the reader allocate or recurse into.
constexpr int kGgufMaxArrayDepth = 8;
constexpr uint32_t kGgufDefaultAlignment = 32;

// Writes a GGUF v3 file. Metadata and tensor infos are set first; tensor data is then produced
// chunk by chunk by a callback, so files far larger than RAM can be written.
class GgufWriter {
 public:
  void set(std::string key, GgufValue value);  // replaces an existing key of that name
  // Adds a tensor; its offset is assigned in order of addition. Shape as ne (row dimension first).
  // Returns the tensor's index.
  size_t add_tensor(std::string name, GgmlType type, std::vector<uint64_t> ne);
  void set_alignment(uint32_t alignment);

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // Bytes of the whole file as it will be written.
  uint64_t file_size() const;

  // Fills `out` with the bytes [offset, offset + out.size()) of tensor `index`. Called on the
  // writing thread, in file order; may use OpenMP inside.
  using FillFn = std::function<void(size_t index, uint64_t offset, std::span<uint8_t> out)>;
  // Progress: bytes written so far and total; called now and then.
  using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

  // Writes to `path` (truncating). Data is filled into one buffer while the previous one is being
  // written by a second thread. Errors (disk full, permission) name the path and the offset.
  Status write_file(const std::string& path, const FillFn& fill,
                    const ProgressFn& progress = nullptr) const;
  // Writes the whole file into memory (tests, small files).
  std::vector<uint8_t> write_memory(const FillFn& fill) const;
  // Convenience: tensors whose bytes are held in memory, in order of add_tensor.
  std::vector<uint8_t> write_memory(const std::vector<std::vector<uint8_t>>& data) const;

  // The header, metadata and tensor infos, padded to the data section.
  std::vector<uint8_t> header_bytes() const;

 private:
  uint64_t data_size() const;
  std::vector<GgufKv> kvs_;
  std::vector<GgufTensorInfo> tensors_;
  uint32_t alignment_ = kGgufDefaultAlignment;
};

}  // namespace strata
