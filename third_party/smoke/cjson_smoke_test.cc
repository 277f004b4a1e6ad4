// Smoke test for @cjson: <cjson/cJSON.h> resolves and libcjson links.
#include <cjson/cJSON.h>

#include "gtest/gtest.h"

TEST(CjsonSmoke, ParsesNumberAndString) {
  cJSON *root = cJSON_Parse("{\"hidden_size\": 768, \"model_type\": \"llama\"}");
  ASSERT_NE(root, nullptr);
  const cJSON *hidden = cJSON_GetObjectItemCaseSensitive(root, "hidden_size");
  ASSERT_TRUE(cJSON_IsNumber(hidden));
  EXPECT_EQ(hidden->valueint, 768);
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  ASSERT_TRUE(cJSON_IsString(type));
  EXPECT_STREQ(type->valuestring, "llama");
  cJSON_Delete(root);
}

TEST(CjsonSmoke, RejectsMalformedJson) {
  cJSON *root = cJSON_Parse("{\"hidden_size\": }");
  EXPECT_EQ(root, nullptr);
  cJSON_Delete(root);
}
