// The order in which emu_sm90.hpp resumes its cooperative threads, chosen by a test before it runs a step (a
// header of its own so that the tests, which do not include the emulation, can set it).
// Real warps run at any relative speed: any order that respects the waits is one the GPU may produce, and a kernel
// must be right in all of them. One order cannot show every missing wait, so the tests run each step in two:
//   round_robin   at every wait, the next thread after this one that can go on: every thread moves in small
//                 steps, the producer keeps refilling buffers while the consumers compute (a buffer released before
//                 the wgmma reading it has landed is refilled under it);
//   lowest_first  at every wait, the lowest-numbered thread that can go on (this one, if it can): warps 0, 1, ... run
//                 ahead as far as the waits let them, the others stall, and the producer and writer warps (the
//                 highest threads) run only when every MMA thread waits. A warp that reads what other warps store
//                 (dS^T, before the dQ wgmma) or that rewrites what another warp's copy has not read yet (the dQ
//                 tile of the backward's step 10) without a barrier between them reads or writes too early.
#pragma once

namespace emu9 {
enum class Schedule { round_robin, lowest_first };
inline Schedule schedule = Schedule::round_robin;
inline const char* schedule_name(Schedule s) { return s == Schedule::round_robin ? "round robin" : "lowest first"; }
}  // namespace emu9
