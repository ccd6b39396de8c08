// ndtrain: the Jinja subset that models' chat templates are written in, with the meaning
// transformers gives them (jinja2's sandboxed environment, trim_blocks and lstrip_blocks on,
// loopcontrols, raise_exception, strftime_now, namespace, dict, and a tojson that writes
// json.dumps(x, ensure_ascii=False)).
//
//   jinja::Template t = jinja::Template::parse(text);        // throws on what it does not know
//   jinja::Object vars;
//   vars.set("messages", jinja::Value::list({...}));
//   std::string out = t.render(vars);
//
// Supported: text, {{ }}, {% %}, {# #}, whitespace control (- on either side), for (with
// else, `if` filter, tuple unpacking, loop.index/index0/first/last/length/revindex/revindex0,
// break, continue), if/elif/else, set (expression, ns.attr and {% set x %}...{% endset %}),
// generation (transformers' tag: its body renders as is), literals, arithmetic, comparisons,
// and/or/not, in, is-tests, attribute/subscript/slice access, conditional expressions, the
// filters and the string/dict methods real templates call (listed in jinja.cpp). Undefined
// values behave as jinja2's default Undefined: they print as "", are false, have length 0 and
// iterate as empty; any other use (an attribute, +, a call) is an error. Anything else (a
// macro, include, filter block, an unknown filter, test or method) is refused with one
// ndt::Error naming the construct and its line: never a different rendering.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ndt::jinja {

class Value;
using List = std::vector<Value>;
// A Python dict: insertion order kept (templates iterate tools' keys in order).
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};
// A callable given to a template (raise_exception, namespace, ...): positional and keyword args.
using Function = std::function<Value(const List& args, const Object& kwargs)>;

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Object, Namespace, Function };
  Value() = default;  // undefined
  static Value none();
  Value(bool b);
  Value(int v) : Value(int64_t(v)) {}
  Value(int64_t v);
  Value(double v);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  static Value list(List items);
  static Value tuple(List items);  // a list that prints as Python's tuple: ('a', 1)
  static Value object(Object o);
  static Value name_space(Object o);  // shared and mutable: ns.x assignments are seen by all
  static Value function(Function f);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_tuple() const { return kind_ == Kind::List && tuple_; }
  bool is_mapping() const { return kind_ == Kind::Object || kind_ == Kind::Namespace; }
  bool truthy() const;

  bool b() const { return b_; }
  int64_t i() const { return i_; }
  double f() const { return kind_ == Kind::Int ? double(i_) : f_; }
  const std::string& s() const { return *s_; }
  const List& l() const { return *l_; }
  const Object& o() const { return *o_; }
  Object& o_mut() const { return *o_; }
  const Function& fn() const { return *fn_; }

  std::string str() const;   // Python's str(): "None", "True", 1.0, ['a', 1], {'k': 'v'}
  std::string repr() const;  // Python's repr(): strings quoted
  std::string type_name() const;

 private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false, tuple_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<List> l_;
  std::shared_ptr<Object> o_;
  std::shared_ptr<Function> fn_;
};

bool equal(const Value& a, const Value& b);  // Python ==
// json.dumps(v, ensure_ascii=False, indent=indent (<0: none), sort_keys=False)
std::string to_json(const Value& v, int indent = -1);

struct Node;
class Template {
 public:
  // Throws ndt::Error naming the construct and line of anything outside the subset.
  static Template parse(const std::string& text);
  // Throws ndt::Error on an evaluation error (its line) or raise_exception (its message).
  std::string render(const Object& vars) const;

 private:
  std::shared_ptr<const Node> root_;
};

}  // namespace ndt::jinja
