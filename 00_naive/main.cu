// Chapter 00 program: standard attention on the GPU, checked against the fp64 reference, timed,
// with the memory it needs for S and P - the O(N^2) wall that FlashAttention removes.
//   ./naive                        B=1 H=16 N=1024 d=64, forward
//   ./naive --q-len 4096 --backward
//   ./naive --in DIR --out DIR     your own q/k/v(/do).npy; writes o/lse(/dq/dk/dv).npy
// Every chapter program reads the same way: parse -> inputs -> GPU -> run + check -> time -> print.
#include <cstdio>

#include "naive.cuh"
#include "program.cuh"

namespace {

constexpr int kMaxHeadDim = 256;  // the kernels take any d; larger d only makes the fp64 check slow

fa::Options defaults() {
  fa::Options o;
  o.problem.batch = 1, o.problem.heads = 16, o.problem.q_len = 1024, o.problem.head_dim = 64;
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  // 1. Parse the command line (bad usage: exit 2).
  bool backward = false;
  fa::Cli cli("naive", "Chapter 00: standard attention (S and P in HBM), checked against the fp64 reference.",
              defaults());
  cli.add_flag("--backward", &backward, "also run and check the backward pass (dQ, dK, dV)");
  cli.extend_help("--head-dim", "this chapter: 1 .. 256");
  const fa::Options opts = cli.parse(argc, argv);
  if (opts.help) return cli.print_usage();

  // 2. The inputs: shape, this chapter's limits, the tensors, writable outputs (bad input: exit 2).
  const fa::Problem p = fa::input_problem(opts, backward);
  if (p.head_dim > kMaxHeadDim)
    throw fa::UsageError("naive: head_dim must be <= 256 (got " + std::to_string(p.head_dim) + ")");
  const fa::HostTensors in = fa::load_inputs(opts, p, backward);
  fa::check_outputs_writable(opts);
  std::printf("problem: %s (%s)\n", fa::describe(p).c_str(), backward ? "forward + backward" : "forward");

  // 3. The GPU (none: exit 1), and whether S and P fit on it: B*H*Nq*Nk floats each.
  fa::require_gpu();
  const size_t ws_bytes = naive::workspace_bytes(p, backward);
  std::printf("memory:  %s for the N x N matrices (S, P%s%s) + %s for inputs and outputs\n",
              fa::human_bytes(double(ws_bytes)).c_str(), p.dropout_p > 0 ? ", P~" : "", backward ? ", dP" : "",
              fa::human_bytes(fa::device_io_bytes(p, backward)).c_str());
  fa::require_device_memory(double(ws_bytes) + fa::device_io_bytes(p, backward),
                            "S and P grow as B*H*Nq*Nk; chapters 02+ need O(N) instead");

  // 4. Run once on NaN-poisoned outputs and check against the fp64 reference.
  fa::DeviceTensors t(p, in);
  naive::Workspace ws(p, backward);
  auto fwd = [&] { naive::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), ws); };
  auto bwd = [&] {
    naive::backward(p, t.q.get(), t.k.get(), t.v.get(), t.dout.get(), ws, t.dq.get(), t.dk.get(), t.dv.get());
  };
  const fa::ErrorReport ef = fa::run_and_check_forward("00 forward", p, in, t, fwd);
  const fa::ErrorReport eb = backward ? fa::run_and_check_backward("00 backward", p, in, t, bwd) : fa::ErrorReport{};
  fa::write_outputs(opts, p, t);

  // 5. Time (the model HBM bytes count S and P as well: formulas.hpp).
  std::vector<fa::ResultRow> rows;
  if (opts.iters > 0) {
    fa::ResultRow f = fa::naive_row(p, "fwd", double(naive::workspace_bytes(p, false)));
    f.max_abs_err = ef.max_abs;
    rows.push_back(fa::time_kernel(opts, f, fwd));
    if (backward) {
      fa::ResultRow b = fa::naive_row(p, "bwd", double(ws_bytes));
      b.max_abs_err = eb.max_abs;
      rows.push_back(fa::time_kernel(opts, b, bwd));
    }
  }

  // 6. Print.
  fa::report_rows(opts, rows);
  return fa::verdict(ef.ok() && eb.ok());
} catch (...) {
  return fa::exit_code_of_current_exception();
}
