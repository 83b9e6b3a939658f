#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>

#include "npy.hpp"
#include "problem.hpp"
#include "random.hpp"

using namespace fa;

TEST_CASE("npy: float32 and float16 round trip with shape") {
  const std::string path = "test_npy_roundtrip.npy";
  const auto x = random_normal<float>(2 * 3 * 5 * 7, 1);
  npy_write(path, {2, 3, 5, 7}, x.data());
  NpyArray a = npy_read(path);
  CHECK(a.shape == std::vector<size_t>{2, 3, 5, 7});
  CHECK(a.data == x);

  const auto h = random_normal<half_t>(11, 2);
  npy_write(path, {11}, h.data());
  a = npy_read(path);
  CHECK(a.shape == std::vector<size_t>{11});
  for (size_t i = 0; i < h.size(); ++i) CHECK(a.data[i] == to_float(h[i]));
  std::remove(path.c_str());
}

TEST_CASE("npy: the header is NumPy's (64-byte aligned, version 1.0)") {
  const std::string path = "test_npy_header.npy";
  const float x[3] = {1, 2, 3};
  npy_write(path, {3}, x);
  std::ifstream f(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), {});
  CHECK(all.substr(1, 5) == "NUMPY");
  const size_t hlen = (unsigned char)all[8] | ((unsigned char)all[9] << 8);
  CHECK((10 + hlen) % 64 == 0);
  CHECK(all.find("'descr': '<f4', 'fortran_order': False, 'shape': (3,)") != std::string::npos);
  CHECK(all.size() == 10 + hlen + 12);
  std::remove(path.c_str());
}

TEST_CASE("npy: clear errors for a missing file, a wrong dtype and a short file") {
  CHECK_THROWS_WITH_AS(npy_read("no_such_file.npy"), "cannot open no_such_file.npy (missing or unreadable)", UsageError);
  const std::string path = "test_npy_bad.npy";
  {
    std::ofstream f(path, std::ios::binary);
    std::string h = "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }";
    h.resize(64 - 10 - 1, ' ');
    f << "\x93NUMPY" << char(1) << char(0) << char(h.size() + 1) << char(0) << h << "\n";
  }
  CHECK_THROWS_AS(npy_read(path), std::runtime_error);
  std::vector<float> y(8, 1.f);
  npy_write(path, {8}, y.data());
  {
    std::ifstream in(path, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), {});
    std::ofstream out(path, std::ios::binary);
    out << all.substr(0, all.size() - 8);  // drop two floats
  }
  CHECK_THROWS_AS(npy_read(path), std::runtime_error);
  std::remove(path.c_str());
}

TEST_CASE("fp16/bf16 conversions round to nearest even") {
  CHECK(to_float(from_float<half_t>(1.0f)) == 1.0f);
  CHECK(from_float<half_t>(1.0f).bits == 0x3C00);
  CHECK(from_float<half_t>(65504.f).bits == 0x7BFF);
  CHECK(from_float<half_t>(1e6f).bits == 0x7C00);                    // overflow -> inf
  CHECK(from_float<half_t>(1.0f + 1.0f / 2048).bits == 0x3C00);      // tie -> even
  CHECK(from_float<half_t>(1.0f + 3.0f / 2048).bits == 0x3C02);      // tie -> even (up)
  CHECK(to_float(from_float<half_t>(5.96046448e-8f)) == 5.96046448e-8f);  // smallest subnormal
  CHECK(from_float<bfloat16_t>(1.0f).bits == 0x3F80);
  CHECK(to_float(from_float<bfloat16_t>(3.14159f)) == 3.140625f);
}

namespace {
// A .npy file with the given header dictionary and `data_bytes` zero bytes of data.
void write_raw(const std::string& path, const std::string& dict, size_t data_bytes) {
  std::string h = dict;
  h.resize(128 - 10 - 1, ' ');
  std::ofstream f(path, std::ios::binary);
  f << "\x93NUMPY" << char(1) << char(0) << char(h.size() + 1) << char(0) << h << "\n";
  f << std::string(data_bytes, '\0');
}
}  // namespace

TEST_CASE("npy: crafted headers are UsageErrors that name the problem, before any allocation") {
  const std::string path = "test_npy_crafted.npy";
  auto header = [](const std::string& shape) {
    return "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  };
  write_raw(path, header("(-1, 2, 3, 4)"), 0);
  CHECK_THROWS_WITH_AS(npy_read(path), (path + ": shape entry '-1' is not a non-negative integer").c_str(), UsageError);
  write_raw(path, header("(1, 2, 1e11, 16)"), 0);
  CHECK_THROWS_AS(npy_read(path), UsageError);
  write_raw(path, header("(4611686018427387905, 1, 1, 4)"), 16);  // 2^62 + 1: must not wrap to 1
  CHECK_THROWS_AS(npy_read(path), UsageError);
  write_raw(path, header("(1, 2, 100000000, 16)"), 64);  // 12.8 GB promised, 64 bytes present
  CHECK_THROWS_AS(npy_read_header(path), UsageError);
  write_raw(path, header("(1073741824, 1073741824, 2, 2)"), 16);  // 2^64 bytes promised: said as they are, not as 0
  CHECK_THROWS_WITH_AS(npy_read_header(path),
                       (path + ": shape [1073741824, 1073741824, 2, 2] needs 18446744073709551616 bytes of data, the "
                               "file holds 16").c_str(),
                       UsageError);
  write_raw(path, header("(2, 2)"), 20);  // 4 bytes too many
  CHECK_THROWS_AS(npy_read_header(path), UsageError);
  write_raw(path, header("(2, 2)"), 16);
  CHECK(npy_read(path).shape == std::vector<size_t>{2, 2});
  write_raw(path, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16);
  CHECK_THROWS_AS(npy_read(path), UsageError);
  std::remove(path.c_str());
}

TEST_CASE("npy: a write goes through a temporary file; a failed write leaves nothing behind") {
  const float x[2] = {1, 2};
  CHECK_THROWS_AS(npy_write("no_such_dir/o.npy", {2}, x), std::runtime_error);
  std::ifstream tmp("no_such_dir/o.npy.tmp");
  CHECK(!tmp);
  npy_write("test_npy_atomic.npy", {2}, x);
  CHECK(!std::ifstream("test_npy_atomic.npy.tmp"));
  CHECK(npy_read("test_npy_atomic.npy").data == std::vector<float>{1, 2});
  std::remove("test_npy_atomic.npy");
}
