// ndtrain: the train_gpt program as a function, so tests can run it in-process.
//
//   const char* argv[] = {"train_gpt", "--config", "configs/fortunes_char.ini"};
//   int rc = train::train_main(3, argv, std::cout, std::cerr);
//
// Exit codes: 0 done; 2 a bad config key or value; 1 any other error (data, checkpoint,
// weights, device). Every error is one line on `err` naming what is wrong.
#pragma once

#include <ostream>

namespace ndt::train {

int train_main(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace ndt::train
