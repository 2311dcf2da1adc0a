// GGUF writer (v3) and the small GgufValue helpers shared with the reader.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <thread>

#include "model/gguf.h"

namespace strata {

std::string_view gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::u8: return "u8";
    case GgufType::i8: return "i8";
    case GgufType::u16: return "u16";
    case GgufType::i16: return "i16";
    case GgufType::u32: return "u32";
    case GgufType::i32: return "i32";
    case GgufType::f32: return "f32";
    case GgufType::boolean: return "bool";
    case GgufType::string: return "string";
    case GgufType::array: return "array";
    case GgufType::u64: return "u64";
    case GgufType::i64: return "i64";
    case GgufType::f64: return "f64";
  }
  return "?";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::u8: case GgufType::i8: case GgufType::u16: case GgufType::i16:
    case GgufType::u32: case GgufType::i32: case GgufType::u64: case GgufType::i64:
      return true;
    default:
      return false;
  }
}

GgufValue GgufValue::make_string_array(const std::vector<std::string>& v) {
  std::vector<GgufValue> e;
  e.reserve(v.size());
  for (const auto& s : v) e.push_back(make_string(s));
  return make_array(GgufType::string, std::move(e));
}

GgufValue GgufValue::make_f32_array(const std::vector<float>& v) {
  std::vector<GgufValue> e;
  e.reserve(v.size());
  for (float x : v) e.push_back(make_f32(x));
  return make_array(GgufType::f32, std::move(e));
}

GgufValue GgufValue::make_i32_array(const std::vector<int32_t>& v) {
  std::vector<GgufValue> e;
  e.reserve(v.size());
  for (int32_t x : v) e.push_back(make_i32(x));
  return make_array(GgufType::i32, std::move(e));
}

std::string GgufValue::to_display_string(size_t max_chars) const {
  std::string s;
  switch (type) {
    case GgufType::u8: case GgufType::u16: case GgufType::u32: case GgufType::u64:
      return strfmt("%" PRIu64, u);
    case GgufType::i8: case GgufType::i16: case GgufType::i32: case GgufType::i64:
      return strfmt("%" PRId64, i);
    case GgufType::f32: case GgufType::f64:
      return strfmt("%g", f);
    case GgufType::boolean:
      return u ? "true" : "false";
    case GgufType::string: {
      std::string body;
      for (char ch : str) {
        if (body.size() >= max_chars) {
          body += "...";
          break;
        }
        if (ch == '\n') body += "\\n";
        else if (static_cast<unsigned char>(ch) < 0x20) body += strfmt("\\x%02x", ch);
        else body += ch;
      }
      return "\"" + body + "\"";
    }
    case GgufType::array: {
      s = strfmt("[%s x %zu]", gguf_type_name(elem_type).data(), elems.size());
      if (!elems.empty()) {
        s += " ";
        for (size_t k = 0; k < elems.size(); ++k) {
          std::string e = elems[k].to_display_string(16);
          if (s.size() + e.size() > max_chars) {
            s += "...";
            break;
          }
          s += (k ? ", " : "") + e;
        }
      }
      return s;
    }
  }
  return "?";
}

std::string GgufTensorInfo::shape_string() const {
  std::string s = "[";
  for (int d = 0; d < n_dims; ++d) s += strfmt(d ? ", %" PRIu64 : "%" PRIu64, ne[d]);
  return s + "]";
}

// ---- writer ----

namespace {

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  const size_t at = out.size();
  out.resize(at + n);
  if (n > 0) std::memcpy(out.data() + at, p, n);
}
template <class T>
void put(std::vector<uint8_t>& out, T v) {
  put_bytes(out, &v, sizeof(v));
}
void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

void put_value(std::vector<uint8_t>& out, const GgufValue& v) {
  switch (v.type) {
    case GgufType::u8: put<uint8_t>(out, uint8_t(v.u)); break;
    case GgufType::i8: put<int8_t>(out, int8_t(v.i)); break;
    case GgufType::u16: put<uint16_t>(out, uint16_t(v.u)); break;
    case GgufType::i16: put<int16_t>(out, int16_t(v.i)); break;
    case GgufType::u32: put<uint32_t>(out, uint32_t(v.u)); break;
    case GgufType::i32: put<int32_t>(out, int32_t(v.i)); break;
    case GgufType::u64: put<uint64_t>(out, v.u); break;
    case GgufType::i64: put<int64_t>(out, v.i); break;
    case GgufType::f32: put<float>(out, float(v.f)); break;
    case GgufType::f64: put<double>(out, v.f); break;
    case GgufType::boolean: put<uint8_t>(out, v.u ? 1 : 0); break;
    case GgufType::string: put_string(out, v.str); break;
    case GgufType::array:
      put<uint32_t>(out, uint32_t(v.elem_type));
      put<uint64_t>(out, v.elems.size());
      for (const GgufValue& e : v.elems) {
        STRATA_CHECK(e.type == v.elem_type, "array element of another type than the array's");
        put_value(out, e);
      }
      break;
  }
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

void GgufWriter::set(std::string key, GgufValue value) {
  if (key == "general.alignment") {
    STRATA_CHECK(value.type == GgufType::u32 && value.u > 0 && (value.u & (value.u - 1)) == 0,
                 "general.alignment must be a u32 power of two");
    STRATA_CHECK(tensors_.empty(), "set the alignment before adding tensors");
    alignment_ = uint32_t(value.u);
  }
  for (auto& kv : kvs_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  kvs_.push_back({std::move(key), std::move(value)});
}

void GgufWriter::set_alignment(uint32_t alignment) {
  set("general.alignment", GgufValue::make_u32(alignment));
}

size_t GgufWriter::add_tensor(std::string name, GgmlType type, std::vector<uint64_t> ne) {
  STRATA_CHECK(!ne.empty() && ne.size() <= kGgufMaxDims, "1 to 4 dimensions");
  GgufTensorInfo t;
  t.name = std::move(name);
  t.type = type;
  t.n_dims = int(ne.size());
  for (size_t d = 0; d < ne.size(); ++d) t.ne[d] = ne[d];
  const GgmlTypeTraits& tr = ggml_traits(type);
  STRATA_CHECK(t.ne[0] % tr.block_size == 0, "row length must be a multiple of the block size");
  t.n_bytes = t.n_elements() / tr.block_size * tr.type_size;
  t.offset = tensors_.empty() ? 0 : align_up(tensors_.back().offset + tensors_.back().n_bytes, alignment_);
  tensors_.push_back(std::move(t));
  return tensors_.size() - 1;
}

std::vector<uint8_t> GgufWriter::header_bytes() const {
  std::vector<uint8_t> out;
  put_bytes(out, "GGUF", 4);
  put<uint32_t>(out, 3);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kvs_.size());
  for (const GgufKv& kv : kvs_) {
    put_string(out, kv.key);
    put<uint32_t>(out, uint32_t(kv.value.type));
    put_value(out, kv.value);
  }
  for (const GgufTensorInfo& t : tensors_) {
    put_string(out, t.name);
    put<uint32_t>(out, uint32_t(t.n_dims));
    for (int d = 0; d < t.n_dims; ++d) put<uint64_t>(out, t.ne[d]);
    put<uint32_t>(out, uint32_t(t.type));
    put<uint64_t>(out, t.offset);
  }
  out.resize(align_up(out.size(), alignment_), 0);
  return out;
}

// Like ggml's writer, every tensor's data is padded to the alignment, the last one included.
uint64_t GgufWriter::data_size() const {
  return tensors_.empty() ? 0 : align_up(tensors_.back().offset + tensors_.back().n_bytes, alignment_);
}

uint64_t GgufWriter::file_size() const { return header_bytes().size() + data_size(); }

namespace {

// Walks the data section in chunks of at most `chunk` bytes, calling `emit(bytes)` for each chunk
// after `fill` produced it; padding between tensors is zeros.
template <class Emit>
void produce_data(const std::vector<GgufTensorInfo>& tensors, uint64_t data_size,
                  const GgufWriter::FillFn& fill, size_t chunk, std::vector<uint8_t>& buf,
                  Emit&& emit) {
  uint64_t pos = 0;  // offset within the data section
  for (size_t k = 0; k < tensors.size(); ++k) {
    const GgufTensorInfo& t = tensors[k];
    if (t.offset > pos) {
      buf.assign(t.offset - pos, 0);
      if (!emit(buf)) return;
      pos = t.offset;
    }
    for (uint64_t off = 0; off < t.n_bytes; off += chunk) {
      size_t n = size_t(std::min<uint64_t>(chunk, t.n_bytes - off));
      buf.resize(n);
      fill(k, off, std::span<uint8_t>(buf.data(), n));
      if (!emit(buf)) return;
    }
    pos += t.n_bytes;
  }
  if (data_size > pos) {
    buf.assign(data_size - pos, 0);
    emit(buf);
  }
}

}  // namespace

std::vector<uint8_t> GgufWriter::write_memory(const FillFn& fill) const {
  std::vector<uint8_t> out = header_bytes();
  out.reserve(out.size() + data_size());
  std::vector<uint8_t> buf;
  produce_data(tensors_, data_size(), fill, 1 << 20, buf, [&](const std::vector<uint8_t>& b) {
    out.insert(out.end(), b.begin(), b.end());
    return true;
  });
  return out;
}

std::vector<uint8_t> GgufWriter::write_memory(const std::vector<std::vector<uint8_t>>& data) const {
  STRATA_CHECK(data.size() == tensors_.size(), "one buffer per tensor");
  for (size_t k = 0; k < data.size(); ++k) {
    STRATA_CHECK(data[k].size() == tensors_[k].n_bytes, "buffer size must match the tensor's bytes");
  }
  return write_memory([&](size_t k, uint64_t off, std::span<uint8_t> out) {
    std::memcpy(out.data(), data[k].data() + off, out.size());
  });
}

Status GgufWriter::write_file(const std::string& path, const FillFn& fill,
                              const ProgressFn& progress) const {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Error{strfmt("%s: cannot create: %s", path.c_str(), std::strerror(errno))};

  uint64_t written = 0;
  const uint64_t total = file_size();
  std::string error;  // first write error; guarded by being touched only by the writer thread
  auto write_all = [&](const uint8_t* p, size_t n) {
    while (n > 0) {
      ssize_t w = ::write(fd, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        error = strfmt("%s: write failed at offset %" PRIu64 ": %s", path.c_str(), written,
                       std::strerror(errno));
        return false;
      }
      p += w;
      n -= size_t(w);
      written += uint64_t(w);
    }
    return true;
  };

  std::vector<uint8_t> header = header_bytes();
  bool ok = write_all(header.data(), header.size());

  // Double buffering: this thread fills one buffer while a writer thread writes the other.
  // `ok`, `error` and `written` are touched by the writer thread only between its start and the
  // join that precedes every read of them here.
  constexpr size_t kChunk = 64 << 20;
  std::vector<uint8_t> fill_buf, write_buf;
  std::thread writer;
  uint64_t last_report = 0;
  if (ok) {
    produce_data(tensors_, data_size(), fill, kChunk, fill_buf, [&](std::vector<uint8_t>& filled) {
      if (writer.joinable()) writer.join();
      if (!ok) return false;
      if (progress && written - last_report >= (256u << 20)) {
        last_report = written;
        progress(written, total);
      }
      std::swap(filled, write_buf);
      writer = std::thread([&] { ok = write_all(write_buf.data(), write_buf.size()); });
      return true;
    });
  }
  if (writer.joinable()) writer.join();
  if (::close(fd) != 0 && error.empty()) {
    error = strfmt("%s: close failed: %s", path.c_str(), std::strerror(errno));
  }
  if (!error.empty() || !ok) {
    ::unlink(path.c_str());  // never leave a half-written model behind
    return Error{error.empty() ? path + ": write failed" : error};
  }
  if (progress) progress(written, total);
  return Status::success();
}

}  // namespace strata
