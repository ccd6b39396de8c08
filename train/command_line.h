// ndtrain: the command line of the programs beside train_gpt (generate, export_weights,
// prepare_text), read by Boost.Program_options as train_gpt's is: every option spelled
// --lower_snake_case, as train_gpt's keys are, integers read as integers (every bit of an
// int64), and the spellings an option had before still understood for one release, each
// with a note on stderr.
//
//   po::options_description opts("generate: ...\n\nUsage: generate --model PATH [options]\n\nOptions");
//   opts.add_options()("help,h", "print this help")
//       ("max_new_tokens", po::value(&n)->default_value(200), "tokens to generate");
//   po::variables_map vm;
//   if (!train::parse_command_line(argc, argv, opts, {}, {{"max-new-tokens", "max_new_tokens"}}, vm))
//     return 0;  // --help or -h: the options were printed
//
// A bad command line throws ndt::Error, one line that names the option ("the argument ('1.5')
// for option '--seed' is invalid: it takes an integer from ... to ..."); the programs print
// it and exit with code 2.
#pragma once

#include <boost/program_options.hpp>
#include <iostream>
#include <string>
#include <vector>

namespace ndt::train {

// An option's spelling of the last release, and its spelling now (both without the dashes).
struct Renamed {
  std::string old_name, new_name;
};

// Parses argv with `opts` (which holds "help,h") and the positional arguments `pos` into
// `vm` (stored, then notified). --help or -h anywhere prints `opts` to `out` and returns
// false. An old spelling (--old or --old=value) reads as its new one, with one note on `err`:
// "note: --old is now --new; the old spelling goes in the next release". An argument that is
// neither an option nor one of `pos` is an error.
bool parse_command_line(int argc, const char* const* argv,
                        const boost::program_options::options_description& opts,
                        const boost::program_options::positional_options_description& pos,
                        const std::vector<Renamed>& renamed, boost::program_options::variables_map& vm,
                        std::ostream& out = std::cout, std::ostream& err = std::cerr);

// What kind of value an option takes, for messages: "true or false", "a number", "text",
// "an integer from -2147483648 to 2147483647", ...
std::string value_kind(const boost::program_options::option_description& d);

}  // namespace ndt::train
