#include "cli.hpp"

#include <cerrno>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace fa {
namespace {

std::string value_str(int kind, const void* t) {
  switch (kind) {
    case 0: return *static_cast<const bool*>(t) ? "on" : "off";
    case 1: return std::to_string(*static_cast<const int*>(t));
    case 2: return std::to_string(*static_cast<const uint64_t*>(t));
    case 3: {
      std::ostringstream s;
      s << *static_cast<const float*>(t);
      return s.str();
    }
    default: {
      const auto& v = *static_cast<const std::string*>(t);
      return v.empty() ? "none" : v;
    }
  }
}

// A float flag: finite, and representable in fp32 (the kernels' type) without becoming 0 or inf.
float parse_float(const std::string& value, const std::string& flag) {
  const std::string bad = "bad value '" + value + "' for " + flag;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(value.c_str(), &end);
  if (value.empty() || *end || !std::isfinite(v)) throw UsageError(bad + ": expected a finite number");
  if (std::fabs(v) > FLT_MAX) throw UsageError(bad + ": beyond the fp32 range (|x| <= 3.4e38)");
  if (v != 0 && std::fabs(v) < FLT_MIN)
    throw UsageError(bad + ": too small for fp32 (smallest normal 1.2e-38); it would round to 0");
  return float(v);
}

}  // namespace

Cli::Cli(std::string program, std::string description, Options defaults)
    : program_(std::move(program)), description_(std::move(description)), opts_(std::move(defaults)) {
  Problem& p = opts_.problem;
  // A shape is at least 1 in every dimension; kv-heads and kv-len take 0 for "auto".
  add("--batch", Kind::Int, &p.batch, "batch size B").min = 1;
  add("--heads", Kind::Int, &p.heads, "query heads H").min = 1;
  add("--kv-heads", Kind::Int, &p.kv_heads, "key/value heads Hkv (divides H; auto = H)").automatic = true;
  add("--q-len", Kind::Int, &p.q_len, "query length Nq").min = 1;
  add("--kv-len", Kind::Int, &p.kv_len, "key/value length Nk (auto = Nq)").automatic = true;
  add("--head-dim", Kind::Int, &p.head_dim, "head dimension d").min = 1;
  add("--causal", Kind::Flag, &p.causal, "causal mask, bottom-right aligned (key j <= i + Nk - Nq)");
  add("--scale", Kind::Float, &p.scale, "softmax scale (auto = 1/sqrt(d))").automatic = true;
  add("--dropout", Kind::Float, &p.dropout_p, "dropout probability p in [0, 1)");
  add("--seed", Kind::Uint64, &p.seed, "seed of the random inputs and of the dropout mask");
  add("--iters", Kind::Int, &opts_.iters, "timed repetitions (median reported; 0 = no timing)");
  add("--warmup", Kind::Int, &opts_.warmup, "untimed repetitions before timing");
  add("--csv", Kind::String, &opts_.csv, "append result rows to file S (CSV; JSON Lines if S ends in .jsonl)");
  add("--in", Kind::String, &opts_.in_dir, "read q.npy, k.npy, v.npy (do.npy) from folder S; the shape comes from them");
  add("--out", Kind::String, &opts_.out_dir, "write o.npy, lse.npy (dq/dk/dv.npy) to folder S");
  add("--help", Kind::Flag, &opts_.help, "print this help and exit (also -h)");
}

Cli::Entry& Cli::add(std::string name, Kind kind, void* target, std::string help) {
  entries_.push_back({std::move(name), std::move(help), kind, target});
  return entries_.back();
}
void Cli::add_flag(const std::string& name, bool* target, const std::string& help) {
  add(name, Kind::Flag, target, help);
}
void Cli::add_option(const std::string& name, std::string* target, const std::string& help) {
  add(name, Kind::String, target, help);
}
void Cli::add_option(const std::string& name, int* target, const std::string& help, int min, bool zero_is_auto) {
  Entry& e = add(name, Kind::Int, target, help);
  e.min = min;
  e.automatic = zero_is_auto;
}
void Cli::extend_help(const std::string& name, const std::string& more) {
  for (auto& e : entries_)
    if (e.name == name) e.help += "; " + more;
}
void Cli::set_help(const std::string& name, const std::string& help) {
  for (auto& e : entries_)
    if (e.name == name) e.help = help;
}

std::string Cli::usage() const {
  std::ostringstream s;
  s << "usage: " << program_ << " [options]\n" << description_ << "\n\noptions (default in brackets):\n";
  for (const auto& e : entries_) {
    const char* metavar[] = {"", " N", " N", " X", " S"};  // Flag, Int, Uint64, Float, String
    std::string flag = e.name + metavar[int(e.kind)];
    flag.resize(std::max<size_t>(flag.size() + 1, 16), ' ');
    s << "  " << flag << e.help;
    if (e.name != "--help") s << " [" << (e.automatic ? "auto" : value_str(int(e.kind), e.target)) << "]";
    s << "\n";
  }
  s << "\nexit codes: 0 ok, 1 failed check or runtime error (or no CUDA device), 2 bad usage or bad input\n";
  return s.str();
}

int Cli::print_usage() const {
  std::printf("%s", usage().c_str());
  return 0;
}

Options Cli::parse(int argc, const char* const* argv) {
  for (int a = 1; a < argc; ++a) {
    std::string arg = argv[a], value;
    if (arg == "-h") arg = "--help";
    const size_t eq = arg.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    Entry* e = nullptr;
    for (auto& x : entries_)
      if (x.name == arg) e = &x;
    if (!e) throw UsageError("unknown option '" + arg + "' (see --help)");
    opts_.given.insert(arg);
    if (e->kind == Kind::Flag) {
      if (inline_value) throw UsageError(arg + " takes no value");
      *static_cast<bool*>(e->target) = true;
      continue;
    }
    if (!inline_value) {
      if (a + 1 >= argc) throw UsageError(arg + " needs a value (see --help)");
      value = argv[++a];
    }
    const std::string bad = "bad value '" + value + "' for " + arg;
    char* end = nullptr;
    errno = 0;
    switch (e->kind) {
      case Kind::Int: {
        const long v = std::strtol(value.c_str(), &end, 10);
        if (value.empty() || *end || errno || v < INT_MIN || v > INT_MAX) throw UsageError(bad + ": expected an integer");
        if (v < e->min)
          throw UsageError(bad + ": must be >= " + std::to_string(e->min) + (e->automatic ? " (0 = auto)" : ""));
        *static_cast<int*>(e->target) = int(v);
        break;
      }
      case Kind::Uint64: {
        const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
        if (value.empty() || *end || errno || value[0] == '-') throw UsageError(bad + ": expected a non-negative integer");
        *static_cast<uint64_t*>(e->target) = v;
        break;
      }
      case Kind::Float: *static_cast<float*>(e->target) = parse_float(value, arg); break;
      case Kind::String:
        if (value.empty()) throw UsageError(arg + " needs a non-empty value");
        *static_cast<std::string*>(e->target) = value;
        break;
      case Kind::Flag: break;
    }
  }
  if (opts_.help) return opts_;
  Problem& p = opts_.problem;
  if (!opts_.given.count("--kv-heads")) p.kv_heads = p.heads;
  if (!opts_.given.count("--kv-len")) p.kv_len = p.q_len;
  if (opts_.given.count("--scale") && p.scale == 0.f)
    throw UsageError("--scale must be nonzero (leave it out for 1/sqrt(head_dim))");
  if (opts_.iters < 0 || opts_.warmup < 0) throw UsageError("--iters and --warmup must be >= 0");
  if (opts_.in_dir.empty()) p.validate();  // with --in the shape comes from the files (input_problem checks it)
  return opts_;
}

}  // namespace fa
