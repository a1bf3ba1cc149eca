#include "router/tokenizer/tokenizer.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/tokenizer/llama2c_tokenizer.h"

namespace ringlane::router {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr char kModelDir[] = RINGLANE_SOURCE_DIR "/deploy/models/stories260K";
constexpr char kTestdata[] = RINGLANE_SOURCE_DIR "/router/tokenizer/testdata";

// A fresh, empty directory under the test's temp dir.
fs::path ScratchDir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("tokenizer_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void Copy(const fs::path& from, const fs::path& to) {
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
}

std::string FormatOf(const std::string& path) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizer(path);
  EXPECT_TRUE(tok.ok()) << path << ": " << tok.status();
  return tok.ok() ? std::string((*tok)->format()) : "";
}

TEST(LoadTokenizerTest, PicksFormatFromFileName) {
  EXPECT_EQ(FormatOf(std::string(kModelDir) + "/tok512.bin"), "llama2c");
  EXPECT_EQ(FormatOf(std::string(kModelDir) + "/tok512.model"), "sentencepiece");
  EXPECT_EQ(FormatOf(std::string(kTestdata) + "/gpt2/tokenizer.json"), "tokenizer.json");
}

TEST(LoadTokenizerTest, PicksFileInDirectory) {
  // The bundled model's directory has tok512.bin and tok512.model; run.c's
  // export wins.
  EXPECT_EQ(FormatOf(kModelDir), "llama2c");
  EXPECT_EQ(FormatOf(std::string(kTestdata) + "/byte_level"), "tokenizer.json");

  const fs::path dir = ScratchDir("preference");
  Copy(fs::path(kModelDir) / "tok512.model", dir / "spm.model");
  EXPECT_EQ(FormatOf(dir.string()), "sentencepiece");
  Copy(fs::path(kModelDir) / "tok512.bin", dir / "tokenizer.bin");
  EXPECT_EQ(FormatOf(dir.string()), "llama2c");
  Copy(fs::path(kModelDir) / "tok512.model", dir / "tokenizer.model");
  EXPECT_EQ(FormatOf(dir.string()), "sentencepiece");
  Copy(fs::path(kTestdata) / "gpt2/tokenizer.json", dir / "tokenizer.json");
  EXPECT_EQ(FormatOf(dir.string()), "tokenizer.json");
}

TEST(LoadTokenizerTest, ReadsTokenizerConfigBesideTokenizerJson) {
  const fs::path dir = ScratchDir("config");
  Copy(fs::path(kTestdata) / "sp_bpe/tokenizer.json", dir / "tokenizer.json");
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizer(dir.string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("a", true).value(), ElementsAre(1, 261));

  std::ofstream(dir / "tokenizer_config.json") << R"({"add_bos_token": false, "bos_token": "<s>"})";
  tok = LoadTokenizer(dir.string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("a", true).value(), ElementsAre(261));
  tok = LoadTokenizer((dir / "tokenizer.json").string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("a", true).value(), ElementsAre(261));

  std::ofstream(dir / "tokenizer_config.json") << "not json";
  tok = LoadTokenizer(dir.string());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << tok.status();
  EXPECT_THAT(tok.status().message(), HasSubstr("tokenizer_config.json"));
}

TEST(LoadTokenizerTest, Errors) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizer("/nonexistent/tokenizer");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound) << tok.status();
  EXPECT_THAT(tok.status().message(), HasSubstr("/nonexistent/tokenizer"));

  const fs::path empty = ScratchDir("empty");
  tok = LoadTokenizer(empty.string());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound) << tok.status();
  EXPECT_THAT(tok.status().message(), HasSubstr(empty.string()));

  const fs::path two = ScratchDir("two");
  Copy(fs::path(kModelDir) / "tok512.bin", two / "tok_a.bin");
  Copy(fs::path(kModelDir) / "tok512.bin", two / "tok_b.bin");
  tok = LoadTokenizer(two.string());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << tok.status();
  EXPECT_THAT(tok.status().message(), HasSubstr("tok_a.bin, tok_b.bin"));

  std::ofstream(two / "vocab.txt") << "a\n";
  tok = LoadTokenizer((two / "vocab.txt").string());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << tok.status();
  EXPECT_THAT(tok.status().message(), HasSubstr("vocab.txt"));

  tok = LoadTokenizer(std::string(kTestdata) + "/sp_bpe/tokenizer_config.json");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << tok.status();

  // A broken file keeps its loader's error, naming the file.
  std::ofstream(two / "broken.model") << "\x0A\xFF";
  tok = LoadTokenizer((two / "broken.model").string());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << tok.status();
  EXPECT_THAT(tok.status().message(), HasSubstr("broken.model"));
}

// The adapter must behave exactly like the llama2.c tokenizer it wraps.
class Llama2cAdapterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Llama2cTokenizer>> raw =
        Llama2cTokenizer::Load(std::string(kModelDir) + "/tok512.bin");
    ASSERT_TRUE(raw.ok()) << raw.status();
    raw_ = std::move(*raw);
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
        LoadTokenizer(std::string(kModelDir) + "/tok512.bin");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(*tok);
  }

  std::unique_ptr<Llama2cTokenizer> raw_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(Llama2cAdapterTest, EncodeAndDecodeMatchTheWrappedTokenizer) {
  for (const std::string text : {"Once upon a time", "", "  two  spaces ", "ж中😀 café\n"}) {
    SCOPED_TRACE(text);
    EXPECT_THAT(tok_->Encode(text, true).value(), ElementsAreArray(raw_->Encode(text, true)));
    EXPECT_THAT(tok_->Encode(text, false).value(), ElementsAreArray(raw_->Encode(text, false)));
    const std::vector<int32_t> ids = raw_->Encode(text, true, true);
    EXPECT_EQ(tok_->Decode(ids).value(), raw_->Decode(ids).value());
  }
  // Unskipped, BOS shows as its piece and still strips the next space.
  EXPECT_EQ(tok_->Decode({1, 403, 2}, /*skip_special_tokens=*/false).value(),
            "\n<s>\nOnce\n</s>\n");
  EXPECT_EQ(tok_->Decode({12345}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(Llama2cAdapterTest, Metadata) {
  EXPECT_EQ(tok_->format(), "llama2c");
  EXPECT_EQ(tok_->vocab_size(), 512);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_THAT(tok_->StopIds(), ElementsAre(1));
  EXPECT_TRUE(tok_->IsSpecial(1));
  EXPECT_TRUE(tok_->IsSpecial(2));
  EXPECT_FALSE(tok_->IsSpecial(0));
  EXPECT_EQ(tok_->IdToToken(403), " Once");
  EXPECT_EQ(tok_->TokenToId(" Once"), 403);
  EXPECT_EQ(tok_->TokenToId("Once"), std::nullopt);
  EXPECT_EQ(tok_->TokenBytes(403).value(), " Once");
  EXPECT_EQ(tok_->TokenBytes(13).value(), "\n");
}

}  // namespace
}  // namespace ringlane::router
