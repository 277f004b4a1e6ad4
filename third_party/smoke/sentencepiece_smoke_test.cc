// Smoke test for @sentencepiece: the headers resolve, both libraries link,
// and loading a model that does not exist reports an error status.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <string>

#include "gtest/gtest.h"

TEST(SentencePieceSmoke, MissingModelIsAnError) {
  sentencepiece::SentencePieceProcessor sp;
  const auto status = sp.Load("/nonexistent/tessera_smoke.model");
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(sp.GetPieceSize(), 0);
}

TEST(SentencePieceSmoke, EmptyModelProtoIsAnError) {
  sentencepiece::SentencePieceProcessor sp;
  EXPECT_FALSE(sp.LoadFromSerializedProto(std::string()).ok());
}

TEST(SentencePieceSmoke, TrainerRejectsMissingInput) {
  // Links libsentencepiece_train: training from a file that does not exist
  // must fail rather than write a model.
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=/nonexistent/tessera_smoke.txt --model_prefix=/nonexistent/m "
      "--vocab_size=8");
  EXPECT_FALSE(status.ok());
}
