#include "train/command_line.h"

#include <cstdint>
#include <limits>

#include "tensor/error.h"

namespace ndt::train {

namespace po = boost::program_options;

namespace {

constexpr const char* kStray = "unexpected-argument";  // the arguments no option or position takes

template <class T>
std::string integer_range() {
  return "an integer from " + std::to_string(std::numeric_limits<T>::min()) + " to " +
         std::to_string(std::numeric_limits<T>::max());
}

}  // namespace

std::string value_kind(const po::option_description& d) {
  const po::value_semantic* v = d.semantic().get();
  if (dynamic_cast<const po::typed_value<bool>*>(v)) return "true or false";
  if (dynamic_cast<const po::typed_value<int64_t>*>(v)) return integer_range<int64_t>();
  if (dynamic_cast<const po::typed_value<int>*>(v)) return integer_range<int>();
  if (dynamic_cast<const po::typed_value<uint64_t>*>(v)) return "a non-negative integer";
  if (dynamic_cast<const po::typed_value<double>*>(v)) return "a number";
  return "text";
}

bool parse_command_line(int argc, const char* const* argv, const po::options_description& opts,
                        const po::positional_options_description& pos, const std::vector<Renamed>& renamed,
                        po::variables_map& vm, std::ostream& out, std::ostream& err) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") {
      out << opts << "\n";
      return false;
    }
  for (const Renamed& r : renamed) {
    bool noted = false;
    for (std::string& a : args) {
      const std::string old = "--" + r.old_name;
      if (a != old && a.rfind(old + "=", 0) != 0) continue;
      a = "--" + r.new_name + a.substr(old.size());
      if (!noted)
        err << "note: " << old << " is now --" << r.new_name
            << "; the old spelling goes in the next release\n";
      noted = true;
    }
  }
  po::options_description all;
  all.add(opts);
  all.add_options()(kStray, po::value<std::vector<std::string>>());
  po::positional_options_description positions = pos;
  if (positions.max_total_count() != std::numeric_limits<unsigned>::max()) positions.add(kStray, -1);
  try {
    po::store(po::command_line_parser(args).options(all).positional(positions).run(), vm);
    if (vm.count(kStray))
      throw Error("unexpected argument '" + vm[kStray].as<std::vector<std::string>>().front() + "'");
    po::notify(vm);
  } catch (const po::validation_error& e) {
    std::string name = e.get_option_name();
    while (!name.empty() && name[0] == '-') name.erase(0, 1);
    const po::option_description* d = opts.find_nothrow(name, false);
    throw Error(std::string(e.what()) + (d ? ": it takes " + value_kind(*d) : std::string()));
  } catch (const po::error& e) {
    throw Error(e.what());
  }
  return true;
}

}  // namespace ndt::train
