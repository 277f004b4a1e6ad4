// tensorboard_testing.h — tests' reader of engine/tensorboard.h's event
// files: each TFRecord record's length and CRCs checked with a bitwise
// CRC-32C of its own (not ISA-L's, which the writer uses), the payloads
// returned; and every scalar as tag -> step -> value. Header-only, gtest.
#ifndef TS_ENGINE_TENSORBOARD_TESTING_H
#define TS_ENGINE_TENSORBOARD_TESTING_H

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "engine/tensorboard.pb-c.h"

namespace ts_test {

// CRC-32C bit by bit: reflected polynomial 0x82F63B78, init and final ~0.
inline uint32_t Crc32c(const uint8_t *p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}
inline uint32_t Mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }
inline uint32_t Le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// Every record of the file at path, each checked; the payloads.
inline std::vector<std::vector<uint8_t>> Records(const std::string &path) {
  std::vector<std::vector<uint8_t>> out;
  FILE *f = fopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  if (!f) return out;
  std::vector<uint8_t> all;
  uint8_t buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) all.insert(all.end(), buf, buf + n);
  fclose(f);
  size_t pos = 0;
  while (pos < all.size()) {
    EXPECT_GE(all.size() - pos, 12u) << "a cut header at byte " << pos;
    if (all.size() - pos < 12) break;
    uint64_t len = 0;
    for (int i = 0; i < 8; i++) len |= (uint64_t)all[pos + i] << (8 * i);
    EXPECT_EQ(Le32(&all[pos + 8]), Mask(Crc32c(&all[pos], 8))) << "length CRC at " << pos;
    EXPECT_LE(pos + 12 + len + 4, all.size()) << "a cut record at byte " << pos;
    if (pos + 12 + len + 4 > all.size()) break;
    const uint8_t *data = &all[pos + 12];
    EXPECT_EQ(Le32(data + len), Mask(Crc32c(data, len))) << "data CRC at " << pos;
    out.emplace_back(data, data + len);
    pos += 12 + len + 4;
  }
  return out;
}

// Every scalar of the file at path: tag -> step -> value (the first
// record, the file version, skipped).
inline std::map<std::string, std::map<int64_t, float>> Scalars(const std::string &path) {
  std::map<std::string, std::map<int64_t, float>> out;
  std::vector<std::vector<uint8_t>> recs = Records(path);
  for (size_t r = 1; r < recs.size(); r++) {
    Tessera__Tb__Event *ev = tessera__tb__event__unpack(nullptr, recs[r].size(), recs[r].data());
    EXPECT_NE(ev, nullptr) << "record " << r;
    if (!ev) continue;
    if (ev->summary)
      for (size_t i = 0; i < ev->summary->n_value; i++)
        out[ev->summary->value[i]->tag][ev->step] = ev->summary->value[i]->simple_value;
    tessera__tb__event__free_unpacked(ev, nullptr);
  }
  return out;
}

}  // namespace ts_test

#endif  // TS_ENGINE_TENSORBOARD_TESTING_H
