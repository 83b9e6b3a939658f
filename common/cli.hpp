// The one command line every chapter program shares:
//   --batch --heads --kv-heads --q-len --kv-len --head-dim --causal --scale --dropout --seed
//   --iters --warmup --csv FILE --in DIR --out DIR --help
// plus the flags a chapter adds (add_flag / add_option). Defaults: scale = 1/sqrt(head_dim),
// kv-heads = heads, kv-len = q-len. Bad usage throws UsageError (the program exits 2).
#pragma once
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "problem.hpp"

namespace fa {

struct Options {
  Problem problem;
  int iters = 20;  // timed repetitions (the median is reported)
  int warmup = 3;
  std::string csv, in_dir, out_dir;
  bool help = false;
  std::set<std::string> given;  // the flags that appeared on the command line, e.g. "--q-len"
  // The chapter's own limits (supported head_dim, no dropout, ...), each throwing UsageError: run by
  // Cli::parse on the flags' problem, and by load_inputs on the shape read from --in files, so bad
  // usage exits 2 before any device work (and on a machine without a GPU too).
  std::vector<std::function<void(const Problem&)>> checks;
};

class Cli {
 public:
  // defaults: the chapter's choice of problem and timing defaults.
  Cli(std::string program, std::string description, Options defaults);
  void add_flag(const std::string& name, bool* target, const std::string& help);
  void add_option(const std::string& name, std::string* target, const std::string& help);
  void add_option(const std::string& name, int* target, const std::string& help);
  void add_check(std::function<void(const Problem&)> check);
  Options parse(int argc, const char* const* argv);
  std::string usage() const;

 private:
  enum class Kind { Flag, Int, Uint64, Float, String };
  struct Entry {
    std::string name, help;
    Kind kind;
    void* target;
  };
  void add(std::string name, Kind kind, void* target, std::string help);
  std::string program_, description_;
  Options opts_;
  std::vector<Entry> entries_;
};

}  // namespace fa
