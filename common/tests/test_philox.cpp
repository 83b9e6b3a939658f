#include <doctest/doctest.h>

#include <initializer_list>

#include "philox.hpp"

using namespace fa;

TEST_CASE("Philox4x32-10 matches the published known-answer vectors (Random123 kat_vectors)") {
  struct Kat { Philox4 ctr; uint32_t k0, k1; Philox4 want; };
  const Kat kats[] = {
      {{0, 0, 0, 0}, 0, 0, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, 0xffffffff, 0xffffffff,
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, 0xa4093822, 0x299f31d0,
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    const Philox4 r = philox4x32_10(k.ctr, k.k0, k.k1);
    CHECK(r.x == k.want.x);
    CHECK(r.y == k.want.y);
    CHECK(r.z == k.want.z);
    CHECK(r.w == k.want.w);
  }
}

TEST_CASE("dropout_keep: keeps a fraction 1-p, depends on every coordinate, p = 0 keeps all") {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const uint32_t thr = dropout_threshold(p);
    int kept = 0, n = 0;
    for (int i = 0; i < 100; ++i)
      for (int j = 0; j < 200; ++j, ++n) kept += dropout_keep(42, 0, 1, 2, i, j, thr);
    CHECK(double(kept) / n == doctest::Approx(1 - p).epsilon(0.03));  // 20000 draws: sd <= 0.0035
  }
  const uint32_t thr = dropout_threshold(0.5f);
  auto differs = [&](auto f) {
    int diff = 0;
    for (int j = 0; j < 256; ++j) diff += f(j);
    return diff > 64;  // two independent fair masks differ in ~128 of 256 places
  };
  CHECK(differs([&](int j) { return dropout_keep(1, 0, 0, 0, 3, j, thr) != dropout_keep(2, 0, 0, 0, 3, j, thr); }));
  CHECK(differs([&](int j) { return dropout_keep(1, 0, 0, 0, 3, j, thr) != dropout_keep(1, 1, 0, 0, 3, j, thr); }));
  CHECK(differs([&](int j) { return dropout_keep(1, 0, 0, 0, 3, j, thr) != dropout_keep(1, 0, 1, 0, 3, j, thr); }));
  CHECK(differs([&](int j) { return dropout_keep(1, 0, 0, 0, 3, j, thr) != dropout_keep(1, 0, 0, 1, 3, j, thr); }));
  CHECK(differs([&](int j) { return dropout_keep(1, 0, 0, 0, 3, j, thr) != dropout_keep(1, 0, 0, 0, 4, j, thr); }));
  for (int j = 0; j < 1000; ++j) CHECK(dropout_keep(5, 0, 0, 0, 0, j, dropout_threshold(0.f)));
}
