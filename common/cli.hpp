// The one command line every chapter program shares:
//   --batch --heads --kv-heads --q-len --kv-len --head-dim --causal --scale --dropout --seed
//   --iters --warmup --csv FILE --in DIR --out DIR --help (-h)
// plus the flags a chapter adds (add_flag / add_option). Defaults: scale = 1/sqrt(head_dim),
// kv-heads = heads, kv-len = q-len (the help shows these as "auto"). Bad usage throws UsageError
// (the program exits 2). The chapter's own limits (head_dim, dropout, ...) are checked by the
// program itself once the shape is known, from the flags or from the --in files.
#pragma once
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
};

class Cli {
 public:
  // defaults: the chapter's choice of problem and timing defaults.
  Cli(std::string program, std::string description, Options defaults);
  void add_flag(const std::string& name, bool* target, const std::string& help);
  void add_option(const std::string& name, std::string* target, const std::string& help);
  // An integer option; a value below `min` is a UsageError. With zero_is_auto the default 0 means
  // "the program chooses" (shown as [auto] in the help) and an explicit 0 asks for the same.
  void add_option(const std::string& name, int* target, const std::string& help, int min, bool zero_is_auto = false);
  // Appends a sentence to a flag's help, e.g. the chapter's head_dim values to --head-dim's.
  void extend_help(const std::string& name, const std::string& more);
  // Replaces a flag's help, where a chapter accepts less than the shared flag does (e.g. no dropout).
  void set_help(const std::string& name, const std::string& help);
  Options parse(int argc, const char* const* argv);
  std::string usage() const;
  int print_usage() const;  // prints usage() to stdout; returns 0, main's exit code for --help

 private:
  enum class Kind { Flag, Int, Uint64, Float, String };
  struct Entry {
    std::string name, help;
    Kind kind;
    void* target;
    int min = 0;
    bool automatic = false;  // the default is chosen by the program: help shows [auto]
  };
  Entry& add(std::string name, Kind kind, void* target, std::string help);
  std::string program_, description_;
  Options opts_;
  std::vector<Entry> entries_;
};

}  // namespace fa
