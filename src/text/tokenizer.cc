// Byte-level BPE tokenizer. Algorithms follow the behaviour of Hugging Face `tokenizers`
// (added-vocabulary splitting, normalizers, pre-tokenizers, BPE merge loop, ByteLevel decoder),
// re-implemented here from their documented semantics and checked against its output by
// tests/unit/tokenizer_test.cc.
#include "text/tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <shared_mutex>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "text/tokenizer_steps.h"
#include "text/unicode.h"

namespace moefold {
namespace {

using json = nlohmann::json;
namespace uc = unicode;
using tokenizer_steps::apply_normalizer;
using tokenizer_steps::apply_pre_tokenizer;
using tokenizer_steps::NormStep;
using tokenizer_steps::parse_normalizer;
using tokenizer_steps::parse_pre_tokenizer;
using tokenizer_steps::PreStep;

// ------------------------------------------------------------------------------------------
// GPT-2 byte alphabet: a reversible map from the 256 byte values to printable code points.
// Bytes that are printable Latin-1 ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) map to
// themselves; the other 68 bytes map to U+0100, U+0101, ... in increasing byte order.
// ------------------------------------------------------------------------------------------
struct ByteAlphabet {
  std::array<char32_t, 256> byte_to_cp{};
  std::array<std::string, 256> byte_to_utf8{};
  std::unordered_map<char32_t, uint8_t> cp_to_byte;

  ByteAlphabet() {
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      byte_to_cp[b] = keep ? static_cast<char32_t>(b) : next++;
      uc::append_utf8(byte_to_utf8[b], byte_to_cp[b]);
      cp_to_byte.emplace(byte_to_cp[b], static_cast<uint8_t>(b));
    }
  }
};

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

// Byte string -> byte-level symbol string (what the ByteLevel pre-tokenizer produces).
std::string to_byte_symbols(std::string_view bytes) {
  const auto& ba = byte_alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += ba.byte_to_utf8[static_cast<uint8_t>(c)];
  return out;
}

// ByteLevel decoder for one token: its symbols mapped back to bytes when every symbol belongs
// to the byte alphabet, else the token's own UTF-8 text.
std::string token_to_bytes(std::string_view token) {
  const auto& ba = byte_alphabet();
  std::string out;
  out.reserve(token.size());
  if (uc::valid_prefix_length(token) != token.size()) return std::string(token);
  size_t i = 0;
  while (i < token.size()) {
    const auto it = ba.cp_to_byte.find(uc::next_code_point(token, i));
    if (it == ba.cp_to_byte.end()) return std::string(token);
    out.push_back(static_cast<char>(it->second));
  }
  return out;
}

// ------------------------------------------------------------------------------------------
// Added-token matcher: leftmost-longest matching over a byte trie.
// ------------------------------------------------------------------------------------------
class TokenMatcher {
 public:
  void add(std::string_view pattern, int32_t token_index) {
    if (pattern.empty()) return;
    int32_t node = 0;
    for (char c : pattern) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        terminal_.push_back(-1);
        it = edges_.emplace(key, static_cast<int32_t>(terminal_.size() - 1)).first;
      }
      node = it->second;
    }
    if (terminal_[node] < 0) terminal_[node] = token_index;  // first definition wins
    first_byte_[static_cast<uint8_t>(pattern[0])] = true;
    empty_ = false;
  }

  bool empty() const { return empty_; }

  struct Match {
    size_t b, e;
    int32_t token_index;
  };

  // Non-overlapping matches, each the longest pattern at the leftmost possible start.
  std::vector<Match> find_all(std::string_view s) const {
    std::vector<Match> out;
    if (empty_) return out;
    size_t i = 0;
    while (i < s.size()) {
      if (!first_byte_[static_cast<uint8_t>(s[i])]) {
        ++i;
        continue;
      }
      int32_t node = 0, best = -1;
      size_t best_end = 0;
      for (size_t j = i; j < s.size(); ++j) {
        const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(s[j]);
        const auto it = edges_.find(key);
        if (it == edges_.end()) break;
        node = it->second;
        if (terminal_[node] >= 0) {
          best = terminal_[node];
          best_end = j + 1;
        }
      }
      if (best >= 0) {
        out.push_back({i, best_end, best});
        i = best_end;
      } else {
        ++i;
      }
    }
    return out;
  }

 private:
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child node
  std::vector<int32_t> terminal_{-1};            // node -> token index or -1; node 0 = root
  std::array<bool, 256> first_byte_{};
  bool empty_ = true;
};

// A piece of input: either text still to tokenize or an added token's id.
struct Piece {
  size_t b, e;
  int32_t id;  // -1 for text
};

// Splits `s` around the added tokens found by `m`, applying the single_word, lstrip and rstrip
// rules the way `tokenizers`' AddedVocabulary does.
std::vector<Piece> split_added(std::string_view s, const TokenMatcher& m,
                               const std::vector<AddedToken>& tokens) {
  std::vector<Piece> out;
  size_t start_offset = 0;
  for (const auto& mt : m.find_all(s)) {
    size_t start = mt.b, stop = mt.e;
    const AddedToken& tok = tokens[mt.token_index];
    if (tok.single_word) {
      bool word_before = false, word_after = false;
      if (start > 0) {
        size_t k = start - 1;
        while (k > 0 && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
        word_before = uc::is_word_char(uc::next_code_point(s, k));
      }
      if (stop < s.size()) {
        size_t k = stop;
        word_after = uc::is_word_char(uc::next_code_point(s, k));
      }
      if (word_before || word_after) continue;
    }
    if (tok.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t k = new_start - 1;
        while (k > 0 && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
        size_t tmp = k;
        if (!uc::is_white_space(uc::next_code_point(s, tmp))) break;
        new_start = k;
      }
      start = std::max(new_start, start_offset);
    }
    if (tok.rstrip) {
      while (stop < s.size()) {
        size_t k = stop;
        if (!uc::is_white_space(uc::next_code_point(s, k))) break;
        stop = k;
      }
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({start_offset, s.size(), -1});
  return out;
}

// ------------------------------------------------------------------------------------------
// BPE
// ------------------------------------------------------------------------------------------
struct MergeInfo {
  int32_t rank;
  int32_t new_id;
};

inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

// ------------------------------------------------------------------------------------------
// Impl
// ------------------------------------------------------------------------------------------
struct Tokenizer::Impl {
  // Model
  std::unordered_map<std::string, int32_t> vocab;  // model vocabulary (byte-level spellings)
  std::unordered_map<uint64_t, MergeInfo> merges;
  std::array<int32_t, 256> byte_id{};              // id of each byte's symbol, -1 if none
  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool ignore_merges = false;

  // Whole id space
  std::vector<std::string> id_token;  // spelling per id ("" for holes)
  std::vector<std::string> id_bytes;  // decoded bytes per id
  std::vector<uint8_t> id_valid, id_special;
  std::unordered_map<std::string, int32_t> added_by_content;

  std::vector<AddedToken> added;
  TokenMatcher raw_matcher, norm_matcher;
  std::vector<NormStep> normalizer;
  std::vector<PreStep> pre_tokenizer;
  std::vector<int32_t> post_prefix, post_suffix;

  // Per-pre-token cache of BPE output, keyed by the pre-token's bytes.
  static constexpr size_t kCacheMaxEntries = 1 << 18;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::shared_mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  void bpe_word(std::string_view bytes, std::vector<int32_t>& out) const;
  void tokenize_text(std::string_view normalized, std::vector<int32_t>& out) const;
};

void Tokenizer::Impl::bpe_word(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.size() <= kCacheMaxWordBytes) {
    std::shared_lock lock(cache_mu);
    const auto it = cache.find(std::string(bytes));
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> result;
  if (ignore_merges) {
    const auto it = vocab.find(to_byte_symbols(bytes));
    if (it != vocab.end()) result.push_back(it->second);
  }
  if (result.empty()) {
    // Symbols as a doubly linked list over the word's bytes.
    struct Sym {
      int32_t id;
      int32_t prev, next;
      bool alive;
    };
    std::vector<Sym> sym;
    sym.reserve(bytes.size());
    for (char c : bytes) {
      int32_t id = byte_id[static_cast<uint8_t>(c)];
      if (id < 0) {
        if (unk_id < 0) continue;  // no unk token: the symbol is dropped, as in `tokenizers`
        if (fuse_unk && !sym.empty() && sym.back().id == unk_id) continue;
        id = unk_id;
      }
      const auto n = static_cast<int32_t>(sym.size());
      sym.push_back({id, n - 1, n + 1, true});
    }
    if (!sym.empty()) sym.back().next = -1;

    // Min-heap on (rank, position): the lowest-ranked merge first, leftmost among equals.
    struct Cand {
      int32_t rank, pos, new_id;
      bool operator>(const Cand& o) const {
        return rank != o.rank ? rank > o.rank : pos > o.pos;
      }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push_pair = [&](int32_t pos) {
      if (pos < 0) return;
      const int32_t nx = sym[pos].next;
      if (nx < 0) return;
      const auto it = merges.find(pair_key(sym[pos].id, sym[nx].id));
      if (it != merges.end()) heap.push({it->second.rank, pos, it->second.new_id});
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) push_pair(i);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      Sym& left = sym[c.pos];
      if (!left.alive || left.next < 0) continue;
      const auto it = merges.find(pair_key(left.id, sym[left.next].id));
      if (it == merges.end() || it->second.new_id != c.new_id) continue;  // stale entry
      Sym& right = sym[left.next];
      left.id = c.new_id;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) sym[right.next].prev = c.pos;
      push_pair(left.prev);
      push_pair(c.pos);
    }
    for (const auto& s : sym) {
      if (s.alive) result.push_back(s.id);
    }
  }
  out.insert(out.end(), result.begin(), result.end());
  if (bytes.size() <= kCacheMaxWordBytes) {
    std::unique_lock lock(cache_mu);
    if (cache.size() >= kCacheMaxEntries) cache.clear();
    cache.emplace(std::string(bytes), std::move(result));
  }
}

void Tokenizer::Impl::tokenize_text(std::string_view normalized, std::vector<int32_t>& out) const {
  std::vector<std::string> pieces{std::string(normalized)};
  apply_pre_tokenizer(pre_tokenizer, pieces);
  for (const auto& p : pieces) bpe_word(p, out);
}

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) file = path / "tokenizer.json";
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("cannot open tokenizer file {}", file.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return from_json(ss.str());
  } catch (const Error& e) {
    fail("{}: {}", file.string(), e.what());
  }
}

namespace {
/// A token id from tokenizer.json: a JSON integer in [0, INT32_MAX]. (nlohmann's get<int32_t> would
/// truncate large integers and convert floats such as 1.2e43 with undefined behaviour.)
int32_t token_id(const json& v, const char* what) {
  if (!v.is_number_integer()) fail("{}: token id must be an integer, not {}", what, v.dump());
  if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(INT32_MAX) : v.get<int64_t>() > INT32_MAX)
    fail("{}: token id {} is too large", what, v.dump());
  return int32_t(v.get<int64_t>());
}
}  // namespace

Tokenizer Tokenizer::from_json(std::string_view json_text) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    fail("tokenizer.json is not valid JSON: {}", e.what());
  }
  auto impl = std::make_shared<Impl>();
  try {
    // --- model -----------------------------------------------------------------------------
    const json& model = j.at("model");
    const std::string mtype = model.value("type", "BPE");
    if (mtype != "BPE") fail("unsupported model type {:?} (only byte-level BPE)", mtype);
    if (model.contains("dropout") && !model["dropout"].is_null()) {
      fail("BPE dropout is not supported");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.contains(key) && !model[key].is_null() && !model[key].get<std::string>().empty()) {
        fail("BPE {} is not supported", key);
      }
    }
    if (model.value("byte_fallback", false)) fail("BPE byte_fallback is not supported");
    impl->fuse_unk = model.value("fuse_unk", false);
    impl->ignore_merges = model.value("ignore_merges", false);

    int32_t max_id = -1;
    for (const auto& [tok, idj] : model.at("vocab").items()) {
      const auto id = token_id(idj, "model.vocab");
      if (id < 0) fail("negative id {} for token {:?}", id, tok);
      impl->vocab.emplace(tok, id);
      max_id = std::max(max_id, id);
    }
    for (const auto& a : j.value("added_tokens", json::array())) {
      AddedToken t;
      t.id = token_id(a.at("id"), "added_tokens");
      t.content = a.at("content").get<std::string>();
      t.single_word = a.value("single_word", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.normalized = a.value("normalized", true);
      t.special = a.value("special", false);
      if (t.id < 0) fail("negative id {} for added token {:?}", t.id, t.content);
      uc::require_valid(t.content, "added token content");
      max_id = std::max(max_id, t.id);
      impl->added.push_back(std::move(t));
    }
    const size_t n_ids = static_cast<size_t>(max_id + 1);
    impl->id_token.assign(n_ids, {});
    impl->id_valid.assign(n_ids, 0);
    impl->id_special.assign(n_ids, 0);
    for (const auto& [tok, id] : impl->vocab) {
      impl->id_token[id] = tok;
      impl->id_valid[id] = 1;
    }
    for (const auto& t : impl->added) {
      impl->id_token[t.id] = t.content;
      impl->id_valid[t.id] = 1;
      impl->id_special[t.id] = t.special ? 1 : 0;
      impl->added_by_content.emplace(t.content, t.id);
    }

    const auto& ba = byte_alphabet();
    for (int b = 0; b < 256; ++b) {
      const auto it = impl->vocab.find(ba.byte_to_utf8[b]);
      impl->byte_id[b] = it == impl->vocab.end() ? -1 : it->second;
    }
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      const auto unk = model["unk_token"].get<std::string>();
      const auto it = impl->vocab.find(unk);
      if (it == impl->vocab.end()) fail("unk_token {:?} is not in the vocabulary", unk);
      impl->unk_id = it->second;
    }

    int32_t rank = 0;
    for (const auto& m : model.at("merges")) {
      std::string a, b;
      if (m.is_string()) {
        const auto s = m.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          fail("merge {:?} is not of the form \"left right\"", s);
        }
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        fail("merge #{} is neither a string nor a pair", rank);
      }
      const auto ia = impl->vocab.find(a), ib = impl->vocab.find(b), in = impl->vocab.find(a + b);
      if (ia == impl->vocab.end() || ib == impl->vocab.end() || in == impl->vocab.end()) {
        fail("merge #{} ({:?}, {:?}) uses a token missing from the vocabulary", rank, a, b);
      }
      // A repeated pair keeps its first (lowest) rank.
      impl->merges.emplace(pair_key(ia->second, ib->second), MergeInfo{rank, in->second});
      ++rank;
    }

    // --- normalizer, pre-tokenizer ---------------------------------------------------------
    if (j.contains("normalizer")) parse_normalizer(j["normalizer"], impl->normalizer);
    if (j.contains("pre_tokenizer")) parse_pre_tokenizer(j["pre_tokenizer"], impl->pre_tokenizer);
    if (impl->pre_tokenizer.empty() || impl->pre_tokenizer.back().kind != PreStep::kByteLevel) {
      fail("pre_tokenizer must be ByteLevel or a Sequence ending in ByteLevel (byte-level BPE)");
    }
    for (size_t i = 0; i + 1 < impl->pre_tokenizer.size(); ++i) {
      if (impl->pre_tokenizer[i].kind == PreStep::kByteLevel) {
        fail("ByteLevel must be the last pre-tokenizer of the sequence");
      }
    }

    // --- added-token matchers: raw text for normalized=false, normalised text otherwise -------
    for (size_t i = 0; i < impl->added.size(); ++i) {
      const auto& t = impl->added[i];
      if (t.normalized) {
        impl->norm_matcher.add(apply_normalizer(impl->normalizer, t.content),
                               static_cast<int32_t>(i));
      } else {
        impl->raw_matcher.add(t.content, static_cast<int32_t>(i));
      }
    }

    // --- decoder ---------------------------------------------------------------------------
    auto check_decoder = [](const json& d, auto&& self) -> void {
      if (d.is_null()) fail("a ByteLevel decoder is required, the file has none");
      const std::string type = d.value("type", "");
      if (type == "Sequence") {
        for (const auto& s : d.at("decoders")) self(s, self);
      } else if (type != "ByteLevel") {
        fail("unsupported decoder type {:?} (only ByteLevel)", type);
      }
    };
    check_decoder(j.value("decoder", json()), check_decoder);
    impl->id_bytes.resize(n_ids);
    for (size_t id = 0; id < n_ids; ++id) {
      if (impl->id_valid[id]) impl->id_bytes[id] = token_to_bytes(impl->id_token[id]);
    }

    // --- post-processor (only used with add_special_tokens) ----------------------------------
    auto parse_post = [&](const json& p, auto&& self) -> void {
      if (p.is_null()) return;
      const std::string type = p.value("type", "");
      auto id_of = [&](const std::string& tok) {
        const auto it = impl->added_by_content.find(tok);
        if (it != impl->added_by_content.end()) return it->second;
        const auto v = impl->vocab.find(tok);
        if (v == impl->vocab.end()) fail("post_processor token {:?} is unknown", tok);
        return v->second;
      };
      if (type == "Sequence") {
        for (const auto& s : p.at("processors")) self(s, self);
      } else if (type == "ByteLevel") {
        // Only adjusts offsets; adds no tokens.
      } else if (type == "TemplateProcessing") {
        bool seen_a = false;
        for (const auto& item : p.at("single")) {
          if (item.contains("Sequence")) {
            seen_a = true;
          } else if (item.contains("SpecialToken")) {
            const auto name = item["SpecialToken"].at("id").get<std::string>();
            const auto& ids = p.at("special_tokens").at(name).at("ids");
            auto& dst = seen_a ? impl->post_suffix : impl->post_prefix;
            for (const auto& id : ids) dst.push_back(token_id(id, "post_processor"));
          }
        }
      } else if (type == "RobertaProcessing" || type == "BertProcessing") {
        impl->post_prefix.push_back(id_of(p.at("cls").at(0).get<std::string>()));
        impl->post_suffix.push_back(id_of(p.at("sep").at(0).get<std::string>()));
      } else {
        fail("unsupported post_processor type {:?}", type);
      }
    };
    parse_post(j.value("post_processor", json()), parse_post);
  } catch (const json::exception& e) {
    fail("malformed tokenizer.json: {}", e.what());
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  uc::require_valid(text, "text to encode");
  const Impl& m = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), m.post_prefix.begin(), m.post_prefix.end());
  for (const Piece& raw : split_added(text, m.raw_matcher, m.added)) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    const std::string norm =
        apply_normalizer(m.normalizer, std::string(text.substr(raw.b, raw.e - raw.b)));
    if (m.norm_matcher.empty()) {
      if (!norm.empty()) m.tokenize_text(norm, ids);
      continue;
    }
    for (const Piece& p : split_added(norm, m.norm_matcher, m.added)) {
      if (p.id >= 0) {
        ids.push_back(p.id);
      } else {
        m.tokenize_text(std::string_view(norm).substr(p.b, p.e - p.b), ids);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), m.post_suffix.begin(), m.post_suffix.end());
  return ids;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  const Impl& m = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= m.id_valid.size() || !m.id_valid[id]) {
    fail("token id {} is not in the vocabulary (size {})", id, m.id_valid.size());
  }
  return m.id_bytes[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (const int32_t id : ids) {
    const std::string_view b = token_bytes(id);
    if (skip_special_tokens && impl_->id_special[id]) continue;
    bytes.append(b);
  }
  return uc::decode_lossy(bytes);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  if (const auto it = impl_->added_by_content.find(key); it != impl_->added_by_content.end()) {
    return it->second;
  }
  if (const auto it = impl_->vocab.find(key); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  token_bytes(id);  // validates
  return impl_->id_token[id];
}

size_t Tokenizer::vocab_size() const { return impl_->id_valid.size(); }

std::vector<int32_t> Tokenizer::unknown_ids(int64_t model_vocab_size) const {
  std::vector<int32_t> out;
  for (int64_t v = 0; v < model_vocab_size; ++v)
    if (!contains(int32_t(v))) out.push_back(int32_t(v));
  return out;
}

bool Tokenizer::contains(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_valid.size() && impl_->id_valid[size_t(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_special.size() && impl_->id_special[id];
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }

size_t Tokenizer::cache_size() const {
  std::shared_lock lock(impl_->cache_mu);
  return impl_->cache.size();
}

}  // namespace moefold
