// Megatron-LM's indexed dataset (MMIDIDX version 1): <prefix>.bin holds the
// tokens of every sequence back to back; <prefix>.idx holds
//   b"MMIDIDX\x00\x00", u64 version = 1, u8 dtype code, u64 sequences N,
//   u64 document-index entries D, int32 lengths[N], int64 byte offsets[N]
//   into .bin, int64 document index[D] (sequence boundaries from 0: a
//   document is sequences [doc[i], doc[i + 1])),
// all little-endian. Files Megatron's preprocess_data.py writes read here
// unchanged, and IndexedDatasetWriter's read in Megatron's reader.
// IndexedDataset maps both files (only the pages a rank touches are read).
// Every error names the file and, where it applies, the offset or entry.
#pragma once

#include <smp/sdk/host.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace smp::sdk {

// Megatron's dtype codes (the ones token files use).
enum class TokenType : uint8_t { kUint8 = 1, kInt16 = 3, kInt32 = 4, kInt64 = 5, kUint16 = 8 };
inline int64_t token_bytes(TokenType t) {
  switch (t) {
    case TokenType::kUint8: return 1;
    case TokenType::kInt16:
    case TokenType::kUint16: return 2;
    case TokenType::kInt32: return 4;
    case TokenType::kInt64: return 8;
  }
  return 0;
}
// uint16 when every id fits, int32 otherwise (what preprocess_data.py picks).
inline TokenType token_type_for(int64_t vocab) { return vocab <= 65536 ? TokenType::kUint16 : TokenType::kInt32; }
// How many ids a dtype can hold (ids are >= 0).
inline int64_t token_type_ids(TokenType t) {
  switch (t) {
    case TokenType::kUint8: return 256;
    case TokenType::kInt16: return 32768;
    case TokenType::kUint16: return 65536;
    case TokenType::kInt32: return int64_t{1} << 31;
    case TokenType::kInt64: return INT64_MAX;
  }
  return 0;
}
inline const char* token_type_name(TokenType t) {
  switch (t) {
    case TokenType::kUint8: return "uint8";
    case TokenType::kInt16: return "int16";
    case TokenType::kUint16: return "uint16";
    case TokenType::kInt32: return "int32";
    case TokenType::kInt64: return "int64";
  }
  return "?";
}
// Refuses a dataset whose dtype cannot hold the ids of a vocabulary of `vocab`
// (prepared with another, smaller tokenizer), naming the file and both.
inline void check_dtype_fits(const std::string& idx_path, TokenType t, int64_t vocab, const std::string& tokenizer) {
  if (token_type_ids(t) < vocab)
    throw Error(idx_path + ": stores " + token_type_name(t) + " ids (" + std::to_string(token_type_ids(t)) +
                " of them), too few for the vocabulary of " + tokenizer + " (" + std::to_string(vocab) +
                "): was it prepared with another tokenizer?");
}

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

namespace detail {
// A read-only mapping of a whole file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw Error(path + ": cannot stat: " + std::strerror(errno));
    size_ = static_cast<int64_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd_, 0);
      if (p == MAP_FAILED) throw Error(path + ": cannot map: " + std::strerror(errno));
      data_ = static_cast<const uint8_t*>(p);
    }
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
    if (fd_ >= 0) ::close(fd_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
  const uint8_t* data_ = nullptr;
};
template <class T>
T read_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // x86-64 and aarch64 are little-endian
  return v;
}
}  // namespace detail

class IndexedDataset {
 public:
  // prefix: the path without .idx / .bin (a path ending in either is taken as its prefix).
  explicit IndexedDataset(std::string prefix) {
    for (const char* ext : {".idx", ".bin"})
      if (prefix.size() > 4 && prefix.compare(prefix.size() - 4, 4, ext) == 0) prefix.resize(prefix.size() - 4);
    prefix_ = prefix;
    idx_ = std::make_unique<detail::MappedFile>(prefix + ".idx");
    bin_ = std::make_unique<detail::MappedFile>(prefix + ".bin");
    const std::string& ip = idx_->path();
    const uint8_t* p = idx_->data();
    const int64_t n = idx_->size();
    constexpr int64_t kHeader = 9 + 8 + 1 + 8 + 8;
    if (n < 9 || std::memcmp(p, kIndexMagic, 9) != 0)
      throw Error(ip + ": not a Megatron indexed dataset (no MMIDIDX magic at offset 0)");
    if (n < kHeader) throw Error(ip + ": truncated: " + std::to_string(n) + " bytes, the header alone has " +
                                 std::to_string(kHeader));
    const uint64_t version = detail::read_le<uint64_t>(p + 9);
    if (version != 1) throw Error(ip + ": version " + std::to_string(version) + " at offset 9; only version 1 is known");
    const uint8_t code = p[17];
    type_ = static_cast<TokenType>(code);
    if (!token_bytes(type_) || code == 5)
      throw Error(ip + ": token dtype code " + std::to_string(code) +
                  " at offset 17 is not one of uint8 (1), int16 (3), int32 (4), uint16 (8)");
    // The counts are checked against the file before any arithmetic on
    // them: each below kMaxCount, the bytes they need fit 64 bits.
    const uint64_t seqs = detail::read_le<uint64_t>(p + 18), docs = detail::read_le<uint64_t>(p + 26);
    constexpr uint64_t kMaxCount = uint64_t{1} << 59;
    const bool counts_fit = seqs < kMaxCount && docs < kMaxCount;
    const uint64_t want = counts_fit ? kHeader + 12 * seqs + 8 * docs : UINT64_MAX;
    if (docs < 1 || !counts_fit || static_cast<uint64_t>(n) < want)
      throw Error(ip + ": truncated or corrupt: " + std::to_string(seqs) + " sequences and " + std::to_string(docs) +
                  " document entries (offsets 18 and 26) need " +
                  (counts_fit ? std::to_string(want) + " bytes" : std::string("more bytes than any file has")) +
                  ", the file has " + std::to_string(n));
    sequences_ = static_cast<int64_t>(seqs);
    doc_entries_ = static_cast<int64_t>(docs);
    lengths_ = p + kHeader;
    offsets_ = lengths_ + 4 * sequences_;
    docs_ = offsets_ + 8 * sequences_;
    // The .bin must hold every sequence the index points at, back to back
    // from byte 0 as Megatron's writer (and merge) lays them out: readers take
    // a document's sequences as one run of tokens, and each offset a whole
    // number of tokens.
    const int64_t elem = token_bytes(type_);
    int64_t expected = 0;
    for (int64_t i = 0; i < sequences_; ++i) {
      if (offset(i) != expected)
        throw Error(ip + ": sequence " + std::to_string(i) + " starts at byte " + std::to_string(offset(i)) +
                    " of the .bin, not at byte " + std::to_string(expected) +
                    " where the sequences before it end (Megatron's index lays them back to back)");
      if (length(i) < 0)
        throw Error(ip + ": sequence " + std::to_string(i) + " has length " + std::to_string(length(i)));
      const int64_t end = expected + length(i) * elem;  // below the file's size plus one sequence: no overflow
      if (end > bin_->size())
        throw Error(bin_->path() + ": truncated: sequence " + std::to_string(i) + " ends at byte " + std::to_string(end) +
                    ", the file has " + std::to_string(bin_->size()) + " (index " + ip + ")");
      expected = end;
    }
    for (int64_t d = 0; d < doc_entries_; ++d) {
      const int64_t s = document_start(d);
      if (s < 0 || s > sequences_ || (d > 0 && s < document_start(d - 1)) || (d == 0 && s != 0))
        throw Error(ip + ": document index entry " + std::to_string(d) + " is " + std::to_string(s) +
                    " (entries must rise from 0 to at most " + std::to_string(sequences_) + ")");
    }
  }

  const std::string& prefix() const { return prefix_; }
  TokenType type() const { return type_; }
  int64_t sequences() const { return sequences_; }
  int64_t documents() const { return doc_entries_ - 1; }
  int64_t length(int64_t i) const { return detail::read_le<int32_t>(lengths_ + 4 * i); }
  int64_t offset(int64_t i) const { return detail::read_le<int64_t>(offsets_ + 8 * i); }  // bytes into .bin
  int64_t document_start(int64_t d) const { return detail::read_le<int64_t>(docs_ + 8 * d); }  // a sequence index
  // Token j of the .bin, counted from its start.
  int64_t token_at(int64_t j) const {
    const uint8_t* q = bin_->data() + j * token_bytes(type_);
    switch (type_) {
      case TokenType::kUint8: return *q;
      case TokenType::kInt16: return detail::read_le<int16_t>(q);
      case TokenType::kUint16: return detail::read_le<uint16_t>(q);
      case TokenType::kInt32: return detail::read_le<int32_t>(q);
      case TokenType::kInt64: return detail::read_le<int64_t>(q);
    }
    return 0;
  }
  int64_t total_tokens() const { return bin_->size() / token_bytes(type_); }
  const std::string& bin_path() const { return bin_->path(); }

 private:
  std::string prefix_;
  std::unique_ptr<detail::MappedFile> idx_, bin_;
  TokenType type_ = TokenType::kUint16;
  int64_t sequences_ = 0, doc_entries_ = 0;
  const uint8_t *lengths_ = nullptr, *offsets_ = nullptr, *docs_ = nullptr;
};

// True when path names a prepared dataset: <path>.idx exists, or it ends in .idx / .bin.
inline bool is_indexed_dataset(const std::string& path) {
  auto ends = [&](const char* ext) { return path.size() > 4 && path.compare(path.size() - 4, 4, ext) == 0; };
  struct stat st {};
  return ends(".idx") || ends(".bin") || ::stat((path + ".idx").c_str(), &st) == 0;
}

// The prepared dataset an adapter's model.data names, its errors prefixed
// "model.data: "; with a tokenizer's vocabulary (vocab > 0), refused when its
// dtype cannot hold those ids (check_dtype_fits).
inline std::unique_ptr<IndexedDataset> open_model_dataset(const std::string& path, int64_t vocab = 0,
                                                          const std::string& tokenizer = "") {
  std::unique_ptr<IndexedDataset> d;
  try {
    d = std::make_unique<IndexedDataset>(path);
  } catch (const Error& e) {
    throw Error(std::string("model.data: ") + e.what());
  }
  if (vocab > 0) check_dtype_fits("model.data: " + d->prefix() + ".idx", d->type(), vocab, tokenizer);
  return d;
}

// The first document of the validation split: the last val_fraction of the documents.
inline int64_t first_validation_document(int64_t documents, double val_fraction) {
  return std::min(documents, static_cast<int64_t>(std::ceil(static_cast<double>(documents) * (1.0 - val_fraction))));
}

// Writes <prefix>.bin as sequences come and <prefix>.idx at finish(); each
// add_document call is one document of one sequence (Megatron's default
// without sentence splitting); add_sequence + end_document write documents of
// several (--split-sentences). Both files are written under temporary names
// and renamed at finish(), so a failed run leaves no half dataset behind.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, TokenType type) : prefix_(std::move(prefix)), type_(type) {
    bin_ = std::fopen((prefix_ + ".bin.tmp").c_str(), "wb");
    if (!bin_) throw Error(prefix_ + ".bin.tmp: cannot create: " + std::strerror(errno));
    docs_.push_back(0);
  }
  ~IndexedDatasetWriter() {
    if (bin_) {
      std::fclose(bin_);
      std::remove((prefix_ + ".bin.tmp").c_str());
    }
  }
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  void add_document(const std::vector<int64_t>& tokens) {
    add_sequence(tokens);
    end_document();
  }
  // One sequence of the current document; end_document() closes the document.
  void add_sequence(const std::vector<int64_t>& tokens) {
    const int64_t elem = token_bytes(type_);
    const int64_t limit = type_ == TokenType::kUint16 ? 65536 : type_ == TokenType::kUint8 ? 256 : (int64_t{1} << 31);
    buffer_.resize(tokens.size() * static_cast<size_t>(elem));
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= limit)
        throw Error(prefix_ + ".bin: token " + std::to_string(tokens[i]) + " of document " +
                    std::to_string(docs_.size() - 1) + " does not fit the dataset's dtype");
      const uint32_t v = static_cast<uint32_t>(tokens[i]);
      std::memcpy(buffer_.data() + i * static_cast<size_t>(elem), &v, static_cast<size_t>(elem));
    }
    if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), bin_) != buffer_.size())
      throw Error(prefix_ + ".bin.tmp: write failed: " + std::strerror(errno));
    lengths_.push_back(static_cast<int32_t>(tokens.size()));
    offsets_.push_back(bytes_);
    bytes_ += static_cast<int64_t>(buffer_.size());
  }
  void end_document() { docs_.push_back(static_cast<int64_t>(lengths_.size())); }
  int64_t documents() const { return static_cast<int64_t>(docs_.size()) - 1; }
  int64_t sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t tokens() const { return bytes_ / token_bytes(type_); }

  void finish() {
    if (std::fclose(bin_) != 0) throw Error(prefix_ + ".bin.tmp: close failed: " + std::strerror(errno));
    bin_ = nullptr;
    const std::string idx = prefix_ + ".idx.tmp";
    std::FILE* f = std::fopen(idx.c_str(), "wb");
    if (!f) throw Error(idx + ": cannot create: " + std::strerror(errno));
    auto put = [&](const void* p, size_t n) {
      if (std::fwrite(p, 1, n, f) != n) {
        std::fclose(f);
        throw Error(idx + ": write failed: " + std::strerror(errno));
      }
    };
    const uint64_t version = 1, n = lengths_.size(), d = docs_.size();
    const uint8_t code = static_cast<uint8_t>(type_);
    put(kIndexMagic, 9), put(&version, 8), put(&code, 1), put(&n, 8), put(&d, 8);
    put(lengths_.data(), 4 * lengths_.size());
    put(offsets_.data(), 8 * offsets_.size());
    put(docs_.data(), 8 * docs_.size());
    if (std::fclose(f) != 0) throw Error(idx + ": close failed: " + std::strerror(errno));
    for (const char* ext : {".bin", ".idx"})
      if (std::rename((prefix_ + ext + ".tmp").c_str(), (prefix_ + ext).c_str()) != 0)
        throw Error(prefix_ + ext + ": cannot rename into place: " + std::strerror(errno));
  }

 private:
  std::string prefix_;
  TokenType type_;
  std::FILE* bin_ = nullptr;
  std::vector<uint8_t> buffer_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> offsets_, docs_;
  int64_t bytes_ = 0;
};

}  // namespace smp::sdk
