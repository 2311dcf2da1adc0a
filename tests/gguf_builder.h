// Raw GGUF byte builder for tests: writes exactly the fields it is told, so a test can put any
// value (valid or hostile) in any field.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace strata::test {

class RawGguf {
 public:
  std::vector<uint8_t> bytes;

  RawGguf& raw(const void* p, size_t n) {
    const size_t at = bytes.size();
    bytes.resize(at + n);
    std::memcpy(bytes.data() + at, p, n);
    return *this;
  }
  template <class T>
  RawGguf& put(T v) {
    return raw(&v, sizeof v);
  }
  RawGguf& str(const std::string& s) {
    put<uint64_t>(s.size());
    return raw(s.data(), s.size());
  }
  RawGguf& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    raw("GGUF", 4);
    put<uint32_t>(version);
    put<uint64_t>(n_tensors);
    return put<uint64_t>(n_kv);
  }
  RawGguf& kv_u32(const std::string& key, uint32_t v) {
    str(key);
    put<uint32_t>(4);
    return put<uint32_t>(v);
  }
  RawGguf& kv_str(const std::string& key, const std::string& v) {
    str(key);
    put<uint32_t>(8);
    return str(v);
  }
  // One tensor info: name, dims (ne), ggml type id, offset.
  RawGguf& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name);
    put<uint32_t>(uint32_t(ne.size()));
    for (uint64_t n : ne) put<uint64_t>(n);
    put<uint32_t>(type);
    return put<uint64_t>(offset);
  }
  // Zero padding up to the next multiple of `a`, then `n` data bytes (a repeating pattern).
  RawGguf& data(uint64_t n, uint64_t a = 32) {
    while (bytes.size() % a) bytes.push_back(0);
    for (uint64_t k = 0; k < n; ++k) bytes.push_back(uint8_t(k * 7 + 1));
    return *this;
  }
};

}  // namespace strata::test
