// GGUF reader: parses and validates a whole file before anything is used (see gguf.h).
#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <limits>

#include "model/gguf.h"

namespace strata {
namespace {

constexpr uint64_t kMinKvBytes = 8 + 4;          // key length + value type (empty key)
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // name length, n_dims, type, offset

// Bounds-checked little-endian reads over the file. Every failure becomes an Error whose text says
// what was being read (`what`) and where.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, const std::string& file) : bytes_(bytes), file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  template <class T>
  Result<T> read(const std::string& what) {
    if (remaining() < sizeof(T)) return truncated(what, sizeof(T));
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  Result<std::string> read_string(const std::string& what) {
    auto len = read<uint64_t>(what + " (string length)");
    if (!len) return len.error();
    if (*len > remaining()) {
      return Error{strfmt("%s: %s: string length %" PRIu64 " at offset %" PRIu64
                          " exceeds the %" PRIu64 " bytes left in the file",
                          file_.c_str(), what.c_str(), *len, pos_ - 8, remaining())};
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), *len);
    pos_ += *len;
    return s;
  }

  Error truncated(const std::string& what, uint64_t need) const {
    return Error{strfmt("%s: truncated while reading %s at offset %" PRIu64 " (need %" PRIu64
                        " bytes, %" PRIu64 " left)",
                        file_.c_str(), what.c_str(), pos_, need, remaining())};
  }

  const std::string& file() const { return file_; }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& file_;
  uint64_t pos_ = 0;
};

// Smallest encoded size of one element of `t` inside an array (used to bound counts).
uint64_t min_encoded_size(GgufType t) {
  switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean:
      return 1;
    case GgufType::u16:
    case GgufType::i16:
      return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32:
      return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
    case GgufType::string:
      return 8;
    case GgufType::array:
      return 12;
  }
  return 1;
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::f64); }

Result<GgufValue> read_value(Cursor& c, GgufType type, const std::string& what, int depth) {
  GgufValue v;
  v.type = type;
  auto scalar = [&](auto tag, auto store) -> Result<GgufValue> {
    auto r = c.read<decltype(tag)>(what);
    if (!r) return r.error();
    store(*r);
    return v;
  };
  switch (type) {
    case GgufType::u8:
      return scalar(uint8_t{}, [&](uint8_t x) { v.u = x; });
    case GgufType::i8:
      return scalar(int8_t{}, [&](int8_t x) { v.i = x; });
    case GgufType::u16:
      return scalar(uint16_t{}, [&](uint16_t x) { v.u = x; });
    case GgufType::i16:
      return scalar(int16_t{}, [&](int16_t x) { v.i = x; });
    case GgufType::u32:
      return scalar(uint32_t{}, [&](uint32_t x) { v.u = x; });
    case GgufType::i32:
      return scalar(int32_t{}, [&](int32_t x) { v.i = x; });
    case GgufType::u64:
      return scalar(uint64_t{}, [&](uint64_t x) { v.u = x; });
    case GgufType::i64:
      return scalar(int64_t{}, [&](int64_t x) { v.i = x; });
    case GgufType::f32:
      return scalar(float{}, [&](float x) { v.f = x; });
    case GgufType::f64:
      return scalar(double{}, [&](double x) { v.f = x; });
    case GgufType::boolean: {
      auto r = c.read<uint8_t>(what);
      if (!r) return r.error();
      if (*r > 1) {
        return Error{strfmt("%s: %s: boolean byte is %u (must be 0 or 1)", c.file().c_str(),
                            what.c_str(), *r)};
      }
      v.u = *r;
      return v;
    }
    case GgufType::string: {
      auto s = c.read_string(what);
      if (!s) return s.error();
      v.str = std::move(*s);
      return v;
    }
    case GgufType::array: {
      if (depth >= kGgufMaxArrayDepth) {
        return Error{strfmt("%s: %s: arrays nested deeper than %d levels", c.file().c_str(),
                            what.c_str(), kGgufMaxArrayDepth)};
      }
      auto et = c.read<uint32_t>(what + " (array element type)");
      if (!et) return et.error();
      if (!valid_value_type(*et)) {
        return Error{strfmt("%s: %s: unknown array element type %u", c.file().c_str(),
                            what.c_str(), *et)};
      }
      auto n = c.read<uint64_t>(what + " (array length)");
      if (!n) return n.error();
      const GgufType elem = static_cast<GgufType>(*et);
      if (*n > c.remaining() / min_encoded_size(elem)) {
        return Error{strfmt("%s: %s: array of %" PRIu64 " %s elements needs at least %s but only %" PRIu64
                            " bytes are left in the file",
                            c.file().c_str(), what.c_str(), *n, gguf_type_name(elem).data(),
                            format_bytes(double(*n) * double(min_encoded_size(elem))).c_str(),
                            c.remaining())};
      }
      v.elem_type = elem;
      v.elems.reserve(*n);
      for (uint64_t k = 0; k < *n; ++k) {
        auto e = read_value(c, elem, what + strfmt("[%" PRIu64 "]", k), depth + 1);
        if (!e) return e.error();
        v.elems.push_back(std::move(*e));
      }
      return v;
    }
  }
  return Error{strfmt("%s: %s: unknown value type %u", c.file().c_str(), what.c_str(),
                      static_cast<unsigned>(type))};
}

}  // namespace

Result<GgufFile> GgufFile::open(const std::string& path, MappedFile::Mode mode) {
  auto map = MappedFile::open(path, mode);
  if (!map) return map.error();
  auto shared = std::make_shared<MappedFile>(std::move(*map));
  auto f = parse(shared->bytes(), path);
  if (!f) return f.error();
  f->map_ = std::move(shared);
  return f;
}

Result<GgufFile> GgufFile::parse(std::span<const uint8_t> bytes, std::string name) {
  return parse_impl(bytes, bytes.size(), std::move(name));
}

Result<GgufFile> GgufFile::parse_header(std::span<const uint8_t> header, uint64_t file_size, std::string name) {
  auto f = parse_impl(header, std::max<uint64_t>(file_size, header.size()), std::move(name));
  if (f) {
    f->header_only_ = true;
    f->declared_size_ = std::max<uint64_t>(file_size, header.size());
  }
  return f;
}

Result<GgufFile> GgufFile::parse_impl(std::span<const uint8_t> bytes, uint64_t file_size, std::string name) {
  GgufFile f;
  f.bytes_ = bytes;
  f.name_ = std::move(name);
  const std::string& file = f.name_;
  Cursor c(bytes, file);

  // header
  if (bytes.size() < 4) {
    return Error{strfmt("%s: not a GGUF file: only %zu bytes, too short for the magic", file.c_str(),
                        bytes.size())};
  }
  if (std::memcmp(bytes.data(), "GGUF", 4) != 0) {
    return Error{strfmt("%s: not a GGUF file: magic is %02x %02x %02x %02x, expected \"GGUF\"",
                        file.c_str(), bytes[0], bytes[1], bytes[2], bytes[3])};
  }
  (void)c.read<uint32_t>("magic");
  auto version = c.read<uint32_t>("header version");
  if (!version) return version.error();
  if (*version != 2 && *version != 3) {
    return Error{strfmt("%s: unsupported GGUF version %u (strata reads versions 2 and 3)",
                        file.c_str(), *version)};
  }
  f.version_ = *version;
  auto n_tensors = c.read<uint64_t>("header tensor count");
  if (!n_tensors) return n_tensors.error();
  auto n_kv = c.read<uint64_t>("header metadata count");
  if (!n_kv) return n_kv.error();
  if (*n_kv > c.remaining() / kMinKvBytes) {
    return Error{strfmt("%s: header claims %" PRIu64 " metadata entries but the %" PRIu64
                        " bytes after the header can hold at most %" PRIu64,
                        file.c_str(), *n_kv, c.remaining(), c.remaining() / kMinKvBytes)};
  }
  if (*n_tensors > c.remaining() / kMinTensorInfoBytes) {
    return Error{strfmt("%s: header claims %" PRIu64 " tensors but the %" PRIu64
                        " bytes after the header can hold at most %" PRIu64,
                        file.c_str(), *n_tensors, c.remaining(), c.remaining() / kMinTensorInfoBytes)};
  }

  // metadata
  f.kvs_.reserve(*n_kv);
  for (uint64_t k = 0; k < *n_kv; ++k) {
    auto key = c.read_string(strfmt("metadata entry %" PRIu64 " key", k));
    if (!key) return key.error();
    const std::string what = strfmt("metadata key '%s'", key->c_str());
    if (f.kv_index_.count(*key)) {
      return Error{strfmt("%s: duplicate %s (entries %zu and %" PRIu64 ")", file.c_str(),
                          what.c_str(), f.kv_index_[*key], k)};
    }
    auto type = c.read<uint32_t>(what + " value type");
    if (!type) return type.error();
    if (!valid_value_type(*type)) {
      return Error{strfmt("%s: %s: unknown value type %u", file.c_str(), what.c_str(), *type)};
    }
    auto value = read_value(c, static_cast<GgufType>(*type), what, 0);
    if (!value) return value.error();
    f.kv_index_[*key] = f.kvs_.size();
    f.kvs_.push_back({std::move(*key), std::move(*value)});
  }

  if (const GgufValue* a = f.find("general.alignment")) {
    if (a->type != GgufType::u32) {
      return Error{strfmt("%s: metadata key 'general.alignment' has type %s, expected u32",
                          file.c_str(), gguf_type_name(a->type).data())};
    }
    if (a->u == 0 || (a->u & (a->u - 1)) != 0) {
      return Error{strfmt("%s: metadata key 'general.alignment' is %" PRIu64
                          ", not a power of two",
                          file.c_str(), a->u)};
    }
    f.alignment_ = static_cast<uint32_t>(a->u);
  }

  // tensor infos
  f.tensors_.reserve(*n_tensors);
  for (uint64_t k = 0; k < *n_tensors; ++k) {
    auto tname = c.read_string(strfmt("tensor info %" PRIu64 " name", k));
    if (!tname) return tname.error();
    const std::string what = strfmt("tensor '%s'", tname->c_str());
    if (f.tensor_index_.count(*tname)) {
      return Error{strfmt("%s: duplicate %s (tensors %zu and %" PRIu64 ")", file.c_str(),
                          what.c_str(), f.tensor_index_[*tname], k)};
    }
    GgufTensorInfo t;
    t.name = std::move(*tname);
    auto n_dims = c.read<uint32_t>(what + " dimension count");
    if (!n_dims) return n_dims.error();
    if (*n_dims == 0 || *n_dims > kGgufMaxDims) {
      return Error{strfmt("%s: %s has %u dimensions (must be 1 to %d)", file.c_str(), what.c_str(),
                          *n_dims, kGgufMaxDims)};
    }
    t.n_dims = static_cast<int>(*n_dims);
    for (int d = 0; d < t.n_dims; ++d) {
      auto ne = c.read<uint64_t>(what + strfmt(" dimension %d", d));
      if (!ne) return ne.error();
      t.ne[d] = *ne;
    }
    auto type = c.read<uint32_t>(what + " type");
    if (!type) return type.error();
    auto traits = ggml_type_traits(*type);
    if (!traits) {
      return Error{strfmt("%s: %s has unknown ggml type id %u", file.c_str(), what.c_str(), *type)};
    }
    t.type = traits->type;
    auto offset = c.read<uint64_t>(what + " offset");
    if (!offset) return offset.error();
    t.offset = *offset;

    // ggml keeps element counts in int64_t: the product must fit there.
    uint64_t n = 1;
    for (int d = 0; d < kGgufMaxDims; ++d) {
      if (__builtin_mul_overflow(n, t.ne[d], &n) || n > uint64_t(std::numeric_limits<int64_t>::max())) {
        return Error{strfmt("%s: %s: shape %s overflows the element count", file.c_str(),
                            what.c_str(), t.shape_string().c_str())};
      }
    }
    if (t.ne[0] % traits->block_size != 0) {
      return Error{strfmt("%s: %s: row length %" PRIu64 " is not a multiple of the %s block size %u",
                          file.c_str(), what.c_str(), t.ne[0], traits->name.data(),
                          traits->block_size)};
    }
    // n / block_size * type_size cannot overflow: type_size / block_size <= 8 and n < 2^63 ... but
    // it can for 8-byte types, so check.
    if (__builtin_mul_overflow(n / traits->block_size, uint64_t(traits->type_size), &t.n_bytes)) {
      return Error{strfmt("%s: %s: shape %s overflows the byte size", file.c_str(), what.c_str(),
                          t.shape_string().c_str())};
    }
    if (t.offset % f.alignment_ != 0) {
      return Error{strfmt("%s: %s: data offset %" PRIu64 " is not a multiple of the alignment %u",
                          file.c_str(), what.c_str(), t.offset, f.alignment_)};
    }
    f.tensor_index_[t.name] = f.tensors_.size();
    f.tensors_.push_back(std::move(t));
  }

  // data section: starts at the next multiple of the alignment
  const uint64_t end_of_infos = c.pos();
  f.data_offset_ = (end_of_infos + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  if (f.data_offset_ > file_size && !f.tensors_.empty()) {
    return Error{strfmt("%s: truncated: data section would start at offset %" PRIu64
                        " but the file has %" PRIu64 " bytes",
                        file.c_str(), f.data_offset_, file_size)};
  }
  const uint64_t data_size = file_size > f.data_offset_ ? file_size - f.data_offset_ : 0;
  for (const GgufTensorInfo& t : f.tensors_) {
    uint64_t end;
    if (__builtin_add_overflow(t.offset, t.n_bytes, &end) || end > data_size) {
      return Error{strfmt("%s: tensor '%s': data [%" PRIu64 ", +%" PRIu64
                          ") ends past the end of the file (%s > %s of tensor data)",
                          file.c_str(), t.name.c_str(), t.offset, t.n_bytes,
                          format_bytes(double(t.offset) + double(t.n_bytes)).c_str(),
                          format_bytes(double(data_size)).c_str())};
    }
  }
  // no two tensors may share bytes
  std::vector<const GgufTensorInfo*> by_offset;
  for (const auto& t : f.tensors_) {
    if (t.n_bytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const GgufTensorInfo* a = by_offset[k - 1];
    const GgufTensorInfo* b = by_offset[k];
    if (a->offset + a->n_bytes > b->offset) {
      return Error{strfmt("%s: tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64
                          ", %" PRIu64 ") overlap",
                          file.c_str(), a->name.c_str(), a->offset, a->offset + a->n_bytes,
                          b->name.c_str(), b->offset, b->offset + b->n_bytes)};
    }
  }
  return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
Error wrong_type(const std::string& file, std::string_view key, GgufType got, const char* want) {
  return Error{strfmt("%s: metadata key '%.*s' has type %s, expected %s", file.c_str(),
                      int(key.size()), key.data(), gguf_type_name(got).data(), want)};
}
}  // namespace

Result<std::optional<uint64_t>> GgufFile::get_uint(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<uint64_t>{};
  if (v->type == GgufType::u8 || v->type == GgufType::u16 || v->type == GgufType::u32 ||
      v->type == GgufType::u64)
    return std::optional<uint64_t>{v->u};
  if ((v->type == GgufType::i8 || v->type == GgufType::i16 || v->type == GgufType::i32 ||
       v->type == GgufType::i64) && v->i >= 0)
    return std::optional<uint64_t>{uint64_t(v->i)};
  return wrong_type(name_, key, v->type, "a non-negative integer");
}

Result<std::optional<int64_t>> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<int64_t>{};
  if (v->type == GgufType::i8 || v->type == GgufType::i16 || v->type == GgufType::i32 ||
      v->type == GgufType::i64)
    return std::optional<int64_t>{v->i};
  if (v->is_integer() && v->u <= uint64_t(std::numeric_limits<int64_t>::max()))
    return std::optional<int64_t>{int64_t(v->u)};
  return wrong_type(name_, key, v->type, "an integer");
}

Result<std::optional<double>> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<double>{};
  if (v->is_float()) return std::optional<double>{v->f};
  if (v->is_integer()) {
    bool is_signed = v->type == GgufType::i8 || v->type == GgufType::i16 ||
                     v->type == GgufType::i32 || v->type == GgufType::i64;
    return std::optional<double>{is_signed ? double(v->i) : double(v->u)};
  }
  return wrong_type(name_, key, v->type, "a number");
}

Result<std::optional<bool>> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<bool>{};
  if (v->type == GgufType::boolean) return std::optional<bool>{v->u != 0};
  return wrong_type(name_, key, v->type, "bool");
}

Result<std::optional<std::string>> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<std::string>{};
  if (v->type == GgufType::string) return std::optional<std::string>{v->str};
  return wrong_type(name_, key, v->type, "string");
}

namespace {
template <class T>
Result<T> required(Result<std::optional<T>> r, const std::string& file, std::string_view key) {
  if (!r) return r.error();
  if (!r->has_value()) {
    return Error{strfmt("%s: required metadata key '%.*s' is missing", file.c_str(), int(key.size()),
                        key.data())};
  }
  return **r;
}
}  // namespace

Result<uint64_t> GgufFile::require_uint(std::string_view key) const {
  return required(get_uint(key), name_, key);
}
Result<double> GgufFile::require_float(std::string_view key) const {
  return required(get_float(key), name_, key);
}
Result<std::string> GgufFile::require_string(std::string_view key) const {
  return required(get_string(key), name_, key);
}

Result<std::optional<std::vector<double>>> GgufFile::get_number_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<std::vector<double>>{};
  if (v->type != GgufType::array) return wrong_type(name_, key, v->type, "an array of numbers");
  std::vector<double> out;
  out.reserve(v->elems.size());
  for (const GgufValue& e : v->elems) {
    if (e.is_float()) {
      out.push_back(e.f);
    } else if (e.is_integer()) {
      bool is_signed = e.type == GgufType::i8 || e.type == GgufType::i16 ||
                       e.type == GgufType::i32 || e.type == GgufType::i64;
      out.push_back(is_signed ? double(e.i) : double(e.u));
    } else {
      return wrong_type(name_, key, e.type, "an array of numbers");
    }
  }
  return std::optional<std::vector<double>>{std::move(out)};
}

Result<std::optional<std::vector<uint64_t>>> GgufFile::get_uint_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<std::vector<uint64_t>>{};
  if (v->type != GgufType::array) return wrong_type(name_, key, v->type, "an array of integers");
  std::vector<uint64_t> out;
  out.reserve(v->elems.size());
  for (const GgufValue& e : v->elems) {
    if (!e.is_integer()) return wrong_type(name_, key, e.type, "an array of integers");
    const bool is_signed = e.type == GgufType::i8 || e.type == GgufType::i16 || e.type == GgufType::i32 ||
                           e.type == GgufType::i64;
    if (is_signed && e.i < 0)
      return Error{strfmt("%s: metadata key '%s' holds %lld (a non-negative integer is expected)", name_.c_str(),
                          std::string(key).c_str(), static_cast<long long>(e.i))};
    out.push_back(is_signed ? uint64_t(e.i) : e.u);
  }
  return std::optional<std::vector<uint64_t>>{std::move(out)};
}

}  // namespace strata
