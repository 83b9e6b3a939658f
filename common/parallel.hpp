// Rows [0, n) cut into one contiguous range per hardware thread, fn(begin, end) called once for each range, each
// in its own thread, the first in the caller's. For CPU references and models whose rows are independent (each
// range writes only its own rows): the results are the same bits as one loop over all rows, in less time.
#pragma once
#include <algorithm>
#include <thread>
#include <vector>

namespace fa {

template <class Fn>
void parallel_rows(int n, Fn&& fn) {
  const int threads = std::max(1, std::min(n, int(std::thread::hardware_concurrency())));
  auto range = [&](int t, int& begin, int& end) {
    begin = int(long(n) * t / threads), end = int(long(n) * (t + 1) / threads);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t)
    pool.emplace_back([&, t] {
      int begin, end;
      range(t, begin, end);
      fn(begin, end);
    });
  int begin, end;
  range(0, begin, end);
  fn(begin, end);
  for (std::thread& th : pool) th.join();
}

}  // namespace fa
