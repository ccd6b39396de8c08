// ndtrain: how many CPU threads the CPU kernels use (OpenMP loops and OpenBLAS GEMMs).
//
//   ndt::set_num_threads(2);   // 0: every core
#pragma once

namespace ndt {

void set_num_threads(int n);
int num_threads();

}  // namespace ndt
