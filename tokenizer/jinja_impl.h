// ndtrain: the parsed form of a Jinja template (tokenizer/jinja.h), shared by the parser
// (jinja_parse.cpp) and the evaluator (jinja_eval.cpp). Not a public interface.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja.h"

namespace ndt::jinja {

struct Expr;
using ExprP = std::shared_ptr<const Expr>;
struct Expr {
  enum class K {
    Literal,
    Name,
    ListLit,
    DictLit,
    Attr,
    Index,
    Slice,
    Call,
    Filter,
    Test,
    Unary,
    Binary,
    Cond
  };
  K k = K::Literal;
  int line = 0;
  Value lit;                                          // Literal
  std::string name;                                   // Name, Attr, Filter, Test, Unary/Binary operator
  std::vector<ExprP> args;                            // operands, see jinja_parse.cpp
  std::vector<std::pair<std::string, ExprP>> kwargs;  // Call, Filter
  bool negate = false;                                // Test: `is not`
};

struct Node;
using NodeP = std::shared_ptr<const Node>;
using Body = std::vector<NodeP>;
struct Node {
  enum class K { Text, Output, If, For, Set, SetBlock, Break, Continue, Generation };
  K k = K::Text;
  int line = 0;
  std::string text;                              // Text
  ExprP expr;                                    // Output, For (iterable), Set (value)
  ExprP filter;                                  // For: `for x in xs if filter`
  std::vector<std::string> targets;              // For: loop variables; Set/SetBlock: the name
  std::string attr;                              // Set: `set ns.attr = ...`
  std::vector<std::pair<ExprP, Body>> branches;  // If: (condition, body) for if and each elif
  Body body, else_body;                          // For, SetBlock, Generation; If/For: else
};

// The error every template problem throws: "chat template line N: what".
[[noreturn]] void fail(int line, const std::string& what);

}  // namespace ndt::jinja
