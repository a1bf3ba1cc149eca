#include "worker/model/safetensors.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringlane::worker {
namespace {

using ::testing::HasSubstr;

std::string TestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string dir =
      ::testing::TempDir() + "/safetensors_test_" + std::to_string(::getpid()) + "_" + info->name();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A file made by hand: length field (the true one unless overridden), header, data.
std::string RawFile(const std::string& header, const std::string& data, int64_t len = -1) {
  uint64_t n = len >= 0 ? static_cast<uint64_t>(len) : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

template <typename T>
absl::Span<const uint8_t> Bytes(const std::vector<T>& v) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T));
}

TEST(SafetensorsTest, RoundTrip) {
  const std::string path = TestDir() + "/rt.safetensors";
  std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -7.0f};
  std::vector<uint16_t> bf16 = {FloatToBf16(1.0f), FloatToBf16(-0.5f), FloatToBf16(3.0f),
                                FloatToBf16(8.0f)};
  std::vector<uint8_t> fp8(15);
  for (size_t i = 0; i < fp8.size(); ++i) fp8[i] = FloatToFp8E4M3(0.25f * i);
  std::vector<SafetensorsTensorData> tensors = {
      {"b.fp8", DType::kFP8E4M3, {3, 5}, Bytes(fp8)},  // odd size, written first in the list
      {"a.f32", DType::kF32, {2, 3}, Bytes(f32)},
      {"c.bf16", DType::kBF16, {4}, Bytes(bf16)},
      {"empty", DType::kF32, {0, 4}, {}},
  };
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());

  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  for (const SafetensorsTensorData& want : tensors) {
    const SafetensorsTensor* t = f->Find(want.name);
    ASSERT_NE(t, nullptr) << want.name;
    EXPECT_EQ(t->dtype, want.dtype);
    EXPECT_EQ(t->shape, want.shape);
    ASSERT_EQ(t->size_bytes, want.bytes.size());
    if (!want.bytes.empty()) {
      EXPECT_EQ(std::memcmp(t->data, want.bytes.data(), want.bytes.size()), 0) << want.name;
    }
    // Each tensor is aligned to its element size, so kernels may read it typed.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % DTypeSize(t->dtype), 0u) << want.name;
  }
  EXPECT_EQ(f->Find("missing"), nullptr);

  // Header padded so that data start on an 8-byte boundary.
  std::string raw = ReadBytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(raw[i]);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(SafetensorsTest, StreamingWriterAcceptsAnyOrderAndChecksCompleteness) {
  const std::string dir = TestDir();
  std::vector<float> v = {1, 2, 3, 4};
  {
    auto w = SafetensorsWriter::Create(dir + "/s.safetensors", {{"x", DType::kF32, {4}}});
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->WriteAt(0, 8, Bytes(v).subspan(8)).ok());
    EXPECT_FALSE((*w)->Finish().ok());  // half written
    ASSERT_TRUE((*w)->WriteAt(0, 0, Bytes(v).subspan(0, 8)).ok());
    EXPECT_FALSE((*w)->WriteAt(0, 12, Bytes(v).subspan(0, 8)).ok());  // overruns the tensor
    ASSERT_TRUE((*w)->Finish().ok());
  }
  auto f = SafetensorsFile::Open(dir + "/s.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(std::memcmp(f->Find("x")->data, v.data(), 16), 0);
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  const std::string dir = TestDir();
  std::vector<float> v = {1, 2, 3};
  std::vector<SafetensorsTensorData> wrong_size = {{"x", DType::kF32, {4}, Bytes(v)}};
  absl::Status s = WriteSafetensors(dir + "/a.safetensors", wrong_size);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("'x'"));
  std::vector<SafetensorsTensorData> dup = {{"x", DType::kF32, {3}, Bytes(v)},
                                            {"x", DType::kF32, {3}, Bytes(v)}};
  EXPECT_EQ(WriteSafetensors(dir + "/b.safetensors", dup).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir + "/a.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/a.safetensors.tmp"));
}

TEST(SafetensorsTest, EmptyFileIsAnErrorNamingIt) {
  const std::string path = TestDir() + "/empty.safetensors";
  WriteBytes(path, "");
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr(path));
  EXPECT_THAT(f.status().message(), HasSubstr("empty"));
}

struct BadCase {
  const char* name;
  std::string bytes;
  const char* expect;  // besides the path
};

TEST(SafetensorsTest, BadInputIsInvalidArgumentNamingFileAndProblem) {
  const std::string dir = TestDir();
  // A valid file to damage: F32 [3] at [0, 12).
  const std::string good_header = R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";
  const std::string data(12, '\x01');
  const std::string good = RawFile(good_header, data);
  {
    WriteBytes(dir + "/good.safetensors", good);
    ASSERT_TRUE(SafetensorsFile::Open(dir + "/good.safetensors").ok());
  }
  const std::vector<BadCase> cases = {
      {"shorter_than_length", "abc", "shorter than the 8-byte header length"},
      {"truncated", good.substr(0, good.size() - 4), "'w'"},
      {"length_beyond_file", RawFile(good_header, data, 1 << 20), "header length 1048576"},
      {"huge_length", RawFile(good_header, data, INT64_MAX), "header length"},
      {"lies_about_size",
       RawFile(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data),
       "F32 [3] needs 12"},
      {"offsets_past_end",
       RawFile(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data), "past the end"},
      {"reversed_offsets",
       RawFile(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", data), "reversed"},
      {"overlapping",
       RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
               data),
       "overlap"},
      {"invalid_json", RawFile(R"({"w":{"dtype":"F32",)", data), "not valid JSON"},
      {"not_an_object", RawFile(R"([1,2,3])", data), "not a JSON object"},
      {"unknown_dtype",
       RawFile(R"({"w":{"dtype":"Q4_K","shape":[3],"data_offsets":[0,12]}})", data), "Q4_K"},
      {"negative_dim", RawFile(R"({"w":{"dtype":"F32","shape":[-3],"data_offsets":[0,12]}})", data),
       "'w'"},
      {"missing_offsets", RawFile(R"({"w":{"dtype":"F32","shape":[3]}})", data), "data_offsets"},
      {"overflowing_shape",
       RawFile(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,12]}})",
               data),
       "overflows"},
      {"metadata_not_strings",
       RawFile(R"({"__metadata__":{"n":1},"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})",
               data),
       "__metadata__"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir + "/" + c.name + ".safetensors";
    WriteBytes(path, c.bytes);
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
    EXPECT_THAT(f.status().message(), HasSubstr(path));
    EXPECT_THAT(f.status().message(), HasSubstr(c.expect));
  }
}

// Damaged files must give an error or a consistent parse, never a crash or a
// pointer outside the file (run under the sanitizer build to catch reads).
TEST(SafetensorsTest, RandomCorruptionNeverEscapesTheFile) {
  const std::string dir = TestDir();
  std::vector<float> a(6, 1.0f);
  std::vector<uint16_t> b(5, 0x3f80);
  const std::string path = dir + "/base.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"alpha", DType::kF32, {2, 3}, Bytes(a)},
                                      {"beta", DType::kBF16, {5}, Bytes(b)}})
                  .ok());
  const std::string base = ReadBytes(path);
  uint64_t rng = 12345;
  auto next = [&] {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(rng >> 33);
  };
  const std::string mutated = dir + "/m.safetensors";
  int ok = 0;
  for (int i = 0; i < 500; ++i) {
    std::string bytes = base;
    const int edits = 1 + next() % 3;
    for (int e = 0; e < edits; ++e) {
      size_t pos = next() % bytes.size();
      const char* alphabet = "0123456789[]{},:\" -";
      bytes[pos] = (next() % 2) ? alphabet[next() % 19] : static_cast<char>(next());
    }
    if (next() % 4 == 0) bytes.resize(1 + next() % bytes.size());
    WriteBytes(mutated, bytes);
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(mutated);
    if (!f.ok()) {
      EXPECT_THAT(f.status().message(), HasSubstr(mutated));
      continue;
    }
    ++ok;
    const uint8_t* begin = f->file()->data();
    const uint8_t* end = begin + f->file()->size();
    for (const SafetensorsTensor& t : f->tensors()) {
      ASSERT_GE(t.data, begin);
      ASSERT_LE(t.data + t.size_bytes, end);
      ASSERT_EQ(static_cast<uint64_t>(t.NumElements()) * DTypeSize(t.dtype), t.size_bytes);
    }
  }
  EXPECT_GT(ok, 0);  // some edits only touch data bytes
}

}  // namespace
}  // namespace ringlane::worker
