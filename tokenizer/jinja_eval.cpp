// Rendering a parsed Jinja template (tokenizer/jinja_impl.h): scopes as jinja2 keeps them
// (a for loop's body gets a fresh scope each iteration; if does not make one), Python's
// arithmetic and comparisons, and the filters, tests, methods and globals of the subset.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <optional>

#include "tensor/error.h"
#include "tokenizer/jinja_impl.h"
#include "tokenizer/unicode.h"

namespace ndt::jinja {

namespace {

// ---- strings as Python sees them: code points -----------------------------------------

std::u32string decode(const std::string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    const int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
    out += char32_t(cp);
    i += n;
  }
  return out;
}

std::string encode(const std::u32string& s) {
  std::string out;
  for (char32_t cp : s) tok::append_utf8(out, static_cast<uint32_t>(cp));
  return out;
}

// str.isspace()
bool py_space(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// str.strip / lstrip / rstrip, with chars or whitespace
std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::u32string u = decode(s);
  const std::u32string set = chars.is_string() ? decode(chars.s()) : U"";
  auto drop = [&](char32_t c) {
    return chars.is_string() ? set.find(c) != std::u32string::npos : py_space(c);
  };
  size_t a = 0, b = u.size();
  while (left && a < b && drop(u[a])) ++a;
  while (right && b > a && drop(u[b - 1])) --b;
  return encode(u.substr(a, b - a));
}

int64_t py_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

// ---- the evaluator --------------------------------------------------------------------

struct Scope {
  std::map<std::string, Value> vars;
  const Scope* parent = nullptr;
  const Object* globals = nullptr;
  const Value* find(const std::string& k) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(k);
      if (it != s->vars.end()) return &it->second;
      if (s->globals)
        if (const Value* v = s->globals->find(k)) return v;
    }
    return nullptr;
  }
};

enum class Flow { Normal, Break, Continue };

class Renderer {
 public:
  Flow exec(const Body& body, Scope& scope, std::string& out);
  Value eval(const Expr& e, Scope& scope);

 private:
  Flow exec_for(const Node& n, Scope& scope, std::string& out);
  Value binary(const Expr& e, Scope& scope);
  Value attr(const Value& obj, const std::string& name, const Expr& e);
  Value index(const Value& obj, const Value& key, const Expr& e);
  Value slice(const Expr& e, Scope& scope);
  Value call(const Expr& e, Scope& scope);
  Value method(const Value& obj, const std::string& name, const List& args, const Object& kw, int line);
  Value filter(const Expr& e, Scope& scope);
  bool test(const Expr& e, Scope& scope);
  List iterate(const Value& v, int line);
  std::string what(const Expr& e);
};

std::string Renderer::what(const Expr& e) {
  switch (e.k) {
    case Expr::K::Name:
      return e.name;
    case Expr::K::Attr:
      return what(*e.args[0]) + "." + e.name;
    case Expr::K::Index:
      return what(*e.args[0]) + "[" + (e.args[1]->k == Expr::K::Literal ? e.args[1]->lit.repr() : "...") +
             "]";
    default:
      return "the value";
  }
}

[[noreturn]] void undefined(const Expr& e, const std::string& name) {
  fail(e.line, "'" + name + "' is undefined");
}

List Renderer::iterate(const Value& v, int line) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return {};
    case Value::Kind::List:
      return v.l();
    case Value::Kind::Object: {
      List keys;
      for (const auto& kv : v.o().items) keys.emplace_back(kv.first);
      return keys;
    }
    case Value::Kind::String: {
      List chars;
      for (char32_t c : decode(v.s())) chars.emplace_back(encode(std::u32string(1, c)));
      return chars;
    }
    default:
      fail(line, "'" + v.type_name() + "' object is not iterable");
  }
}

Flow Renderer::exec(const Body& body, Scope& scope, std::string& out) {
  for (const NodeP& np : body) {
    const Node& n = *np;
    switch (n.k) {
      case Node::K::Text:
        out += n.text;
        break;
      case Node::K::Output:
        out += eval(*n.expr, scope).str();
        break;
      case Node::K::If: {
        const Body* chosen = &n.else_body;
        for (const auto& [cond, b] : n.branches)
          if (eval(*cond, scope).truthy()) {
            chosen = &b;
            break;
          }
        if (Flow f = exec(*chosen, scope, out); f != Flow::Normal) return f;
        break;
      }
      case Node::K::For:
        exec_for(n, scope, out);
        break;
      case Node::K::Set: {
        Value v = eval(*n.expr, scope);
        if (n.attr.empty()) {
          scope.vars[n.targets[0]] = v;
          break;
        }
        const Value* ns = scope.find(n.targets[0]);
        if (!ns || ns->kind() != Value::Kind::Namespace)
          fail(n.line,
               "cannot assign attribute on '" + n.targets[0] + "': only a namespace() takes attributes");
        if (!n.attr.empty() && n.attr[0] == '_') fail(n.line, "namespace attributes may not start with '_'");
        ns->o_mut().set(n.attr, v);
        break;
      }
      case Node::K::SetBlock: {
        std::string captured;
        exec(n.body, scope, captured);
        scope.vars[n.targets[0]] = Value(captured);
        break;
      }
      case Node::K::Break:
        return Flow::Break;
      case Node::K::Continue:
        return Flow::Continue;
      case Node::K::Generation:
        if (Flow f = exec(n.body, scope, out); f != Flow::Normal) return f;
        break;
    }
  }
  return Flow::Normal;
}

Flow Renderer::exec_for(const Node& n, Scope& scope, std::string& out) {
  const List all = iterate(eval(*n.expr, scope), n.line);
  auto bind = [&](Scope& s, const Value& item) {
    if (n.targets.size() == 1) {
      s.vars[n.targets[0]] = item;
      return;
    }
    const List parts = iterate(item, n.line);
    if (parts.size() != n.targets.size())
      fail(n.line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                       std::to_string(n.targets.size()) + " loop variables");
    for (size_t k = 0; k < parts.size(); ++k) s.vars[n.targets[k]] = parts[k];
  };
  List items;
  for (const Value& item : all) {
    if (n.filter) {
      Scope f{{}, &scope, nullptr};
      bind(f, item);
      if (!eval(*n.filter, f).truthy()) continue;
    }
    items.push_back(item);
  }
  const int64_t len = int64_t(items.size());
  for (int64_t i = 0; i < len; ++i) {
    Scope s{{}, &scope, nullptr};
    bind(s, items[size_t(i)]);
    Object loop;
    loop.set("index", Value(i + 1)), loop.set("index0", Value(i));
    loop.set("revindex", Value(len - i)), loop.set("revindex0", Value(len - i - 1));
    loop.set("first", Value(i == 0)), loop.set("last", Value(i == len - 1));
    loop.set("length", Value(len));
    loop.set("previtem", i > 0 ? items[size_t(i - 1)] : Value());
    loop.set("nextitem", i + 1 < len ? items[size_t(i + 1)] : Value());
    s.vars["loop"] = Value::object(std::move(loop));
    if (exec(n.body, s, out) == Flow::Break) break;
  }
  if (items.empty()) {
    Scope s{{}, &scope, nullptr};
    exec(n.else_body, s, out);
  }
  return Flow::Normal;
}

Value Renderer::attr(const Value& obj, const std::string& name, const Expr& e) {
  if (obj.is_undefined()) undefined(e, what(*e.args[0]));
  if (obj.is_mapping()) {
    const Value* v = obj.o().find(name);
    return v ? *v : Value();
  }
  return Value();  // jinja2: a missing attribute is undefined
}

Value Renderer::index(const Value& obj, const Value& key, const Expr& e) {
  if (obj.is_undefined()) undefined(e, what(*e.args[0]));
  if (obj.is_mapping()) {
    if (!key.is_string()) return Value();
    const Value* v = obj.o().find(key.s());
    return v ? *v : Value();
  }
  if ((obj.is_list() || obj.is_string()) &&
      (key.kind() == Value::Kind::Int || key.kind() == Value::Kind::Bool)) {
    const int64_t k = key.kind() == Value::Kind::Bool ? key.b() : key.i();
    if (obj.is_list()) {
      const int64_t i = py_index(k, int64_t(obj.l().size()));
      return i >= 0 && i < int64_t(obj.l().size()) ? obj.l()[size_t(i)] : Value();
    }
    const std::u32string u = decode(obj.s());
    const int64_t i = py_index(k, int64_t(u.size()));
    return i >= 0 && i < int64_t(u.size()) ? Value(encode(u.substr(size_t(i), 1))) : Value();
  }
  return Value();
}

Value Renderer::slice(const Expr& e, Scope& scope) {
  const Value obj = eval(*e.args[0], scope);
  auto bound = [&](size_t k) -> std::optional<int64_t> {
    if (!e.args[k]) return std::nullopt;
    Value v = eval(*e.args[k], scope);
    if (v.is_none()) return std::nullopt;
    if (v.kind() != Value::Kind::Int) fail(e.line, "slice indices must be integers");
    return v.i();
  };
  const auto a = bound(1), b = bound(2), st = bound(3);
  const int64_t step = st.value_or(1);
  if (step == 0) fail(e.line, "slice step cannot be zero");
  auto pick = [&](int64_t n, auto&& take) {
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t i = *v < 0 ? *v + n : *v;
      return step > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
    };
    const int64_t lo = clamp(a, step > 0 ? 0 : n - 1), hi = clamp(b, step > 0 ? n : -1);
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) take(size_t(i));
  };
  if (obj.is_list()) {
    List out;
    pick(int64_t(obj.l().size()), [&](size_t i) { out.push_back(obj.l()[i]); });
    return Value::list(std::move(out));
  }
  if (obj.is_string()) {
    const std::u32string u = decode(obj.s());
    std::u32string out;
    pick(int64_t(u.size()), [&](size_t i) { out += u[i]; });
    return Value(encode(out));
  }
  if (obj.is_undefined()) undefined(e, what(*e.args[0]));
  fail(e.line, "cannot slice a " + obj.type_name());
}

Value arith(const Expr& e, const Value& a, const Value& b) {
  const std::string& op = e.name;
  auto num_kind = [](const Value& v) { return v.is_number() || v.kind() == Value::Kind::Bool; };
  if (op == "+" && a.is_string() && b.is_string()) return Value(a.s() + b.s());
  if (op == "+" && a.is_list() && b.is_list()) {
    List l = a.l();
    l.insert(l.end(), b.l().begin(), b.l().end());
    return Value::list(std::move(l));
  }
  if (op == "*" && a.is_string() && b.kind() == Value::Kind::Int) {
    std::string s;
    for (int64_t i = 0; i < b.i(); ++i) s += a.s();
    return Value(s);
  }
  if (!num_kind(a) || !num_kind(b)) {
    if (a.is_undefined() || b.is_undefined()) fail(e.line, "an undefined value used with '" + op + "'");
    fail(e.line,
         "unsupported operand types for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
  }
  auto iv = [](const Value& v) { return v.kind() == Value::Kind::Bool ? int64_t(v.b()) : v.i(); };
  auto fv = [](const Value& v) { return v.kind() == Value::Kind::Bool ? double(v.b()) : v.f(); };
  const bool ints = a.kind() != Value::Kind::Float && b.kind() != Value::Kind::Float;
  if (op == "/") {
    if (fv(b) == 0) fail(e.line, "division by zero");
    return Value(fv(a) / fv(b));
  }
  if (op == "//" || op == "%") {
    if (fv(b) == 0) fail(e.line, "division by zero");
    if (ints) {
      int64_t q = iv(a) / iv(b), r = iv(a) % iv(b);
      if (r != 0 && ((r < 0) != (iv(b) < 0))) --q, r += iv(b);
      return op == "//" ? Value(q) : Value(r);
    }
    const double q = std::floor(fv(a) / fv(b));
    return op == "//" ? Value(q) : Value(fv(a) - q * fv(b));
  }
  if (op == "**")
    return ints && iv(b) >= 0 ? Value(int64_t(std::llround(std::pow(fv(a), fv(b)))))
                              : Value(std::pow(fv(a), fv(b)));
  if (ints) return Value(op == "+" ? iv(a) + iv(b) : op == "-" ? iv(a) - iv(b) : iv(a) * iv(b));
  return Value(op == "+" ? fv(a) + fv(b) : op == "-" ? fv(a) - fv(b) : fv(a) * fv(b));
}

bool contains(const Expr& e, const Value& item, const Value& container) {
  if (container.is_string()) {
    if (!item.is_string())
      fail(e.line, "'in <string>' requires a string on the left, got " + item.type_name());
    return container.s().find(item.s()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& v : container.l())
      if (equal(v, item)) return true;
    return false;
  }
  if (container.is_mapping()) return item.is_string() && container.o().find(item.s()) != nullptr;
  if (container.is_undefined()) return false;
  fail(e.line, "argument of type '" + container.type_name() + "' is not iterable");
}

bool less(const Expr& e, const Value& a, const Value& b) {
  auto num = [](const Value& v) { return v.is_number() || v.kind() == Value::Kind::Bool; };
  if (num(a) && num(b)) {
    auto fv = [](const Value& v) { return v.kind() == Value::Kind::Bool ? double(v.b()) : v.f(); };
    return fv(a) < fv(b);
  }
  if (a.is_string() && b.is_string()) return a.s() < b.s();  // UTF-8 bytes order as code points
  fail(e.line, "'<' not supported between '" + a.type_name() + "' and '" + b.type_name() + "'");
}

Value Renderer::binary(const Expr& e, Scope& scope) {
  const std::string& op = e.name;
  Value a = eval(*e.args[0], scope);
  if (op == "and") return a.truthy() ? eval(*e.args[1], scope) : a;
  if (op == "or") return a.truthy() ? a : eval(*e.args[1], scope);
  Value b = eval(*e.args[1], scope);
  if (op == "~") return Value(a.str() + b.str());
  if (op == "==") return Value(equal(a, b));
  if (op == "!=") return Value(!equal(a, b));
  if (op == "<") return Value(less(e, a, b));
  if (op == ">") return Value(less(e, b, a));
  if (op == "<=") return Value(!less(e, b, a));
  if (op == ">=") return Value(!less(e, a, b));
  if (op == "in") return Value(contains(e, a, b));
  if (op == "not in") return Value(!contains(e, a, b));
  return arith(e, a, b);
}

Value Renderer::eval(const Expr& e, Scope& scope) {
  switch (e.k) {
    case Expr::K::Literal:
      return e.lit;
    case Expr::K::Name: {
      const Value* v = scope.find(e.name);
      return v ? *v : Value();
    }
    case Expr::K::ListLit: {
      List l;
      for (const ExprP& x : e.args) l.push_back(eval(*x, scope));
      return e.name == "tuple" ? Value::tuple(std::move(l)) : Value::list(std::move(l));
    }
    case Expr::K::DictLit: {
      Object o;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i], scope);
        if (!k.is_string()) fail(e.line, "dict keys must be strings in chat templates");
        o.set(k.s(), eval(*e.args[i + 1], scope));
      }
      return Value::object(std::move(o));
    }
    case Expr::K::Attr:
      return attr(eval(*e.args[0], scope), e.name, e);
    case Expr::K::Index:
      return index(eval(*e.args[0], scope), eval(*e.args[1], scope), e);
    case Expr::K::Slice:
      return slice(e, scope);
    case Expr::K::Call:
      return call(e, scope);
    case Expr::K::Filter:
      return filter(e, scope);
    case Expr::K::Test:
      return Value(test(e, scope) != e.negate);
    case Expr::K::Unary: {
      Value v = eval(*e.args[0], scope);
      if (e.name == "not") return Value(!v.truthy());
      if (v.kind() == Value::Kind::Int) return Value(e.name == "-" ? -v.i() : v.i());
      if (v.kind() == Value::Kind::Float) return Value(e.name == "-" ? -v.f() : v.f());
      fail(e.line, "bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
    }
    case Expr::K::Binary:
      return binary(e, scope);
    case Expr::K::Cond:
      if (eval(*e.args[1], scope).truthy()) return eval(*e.args[0], scope);
      return e.args[2] ? eval(*e.args[2], scope) : Value();
  }
  return Value();
}

Value Renderer::call(const Expr& e, Scope& scope) {
  List args;
  Object kw;
  for (size_t i = 1; i < e.args.size(); ++i) args.push_back(eval(*e.args[i], scope));
  for (const auto& [k, x] : e.kwargs) kw.set(k, eval(*x, scope));
  const Expr& callee = *e.args[0];
  if (callee.k == Expr::K::Attr) {  // a method: x.strip(), d.items(), ...
    Value obj = eval(*callee.args[0], scope);
    if (obj.is_undefined()) undefined(callee, what(*callee.args[0]));
    if (obj.is_mapping()) {
      const Value* f = obj.o().find(callee.name);
      if (f && f->kind() == Value::Kind::Function) return f->fn()(args, kw);
    }
    return method(obj, callee.name, args, kw, e.line);
  }
  Value f = eval(callee, scope);
  if (f.kind() != Value::Kind::Function) {
    if (f.is_undefined()) undefined(callee, what(callee));
    fail(e.line, "'" + what(callee) + "' (" + f.type_name() + ") is not callable");
  }
  try {
    return f.fn()(args, kw);
  } catch (const ndt::Error& err) {
    const std::string m = err.what();
    if (m.rfind("chat template", 0) == 0) throw;
    fail(e.line, m);
  }
}

Value arg(const List& args, const Object& kw, size_t i, const std::string& name, Value dflt = Value()) {
  if (i < args.size()) return args[i];
  if (const Value* v = kw.find(name)) return *v;
  return dflt;
}

std::string ascii_case(const std::string& s, int line, const std::string& what, int mode) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    if (uint8_t(c) >= 0x80) fail(line, what + " of non-ASCII text is not supported in chat templates");
    const bool alpha = std::isalpha(uint8_t(c));
    if (mode == 0) c = char(std::tolower(uint8_t(c)));
    if (mode == 1) c = char(std::toupper(uint8_t(c)));
    if (mode == 2) c = char(start ? std::toupper(uint8_t(c)) : std::tolower(uint8_t(c)));  // title
    if (mode == 3) c = char(&c == &out[0] ? std::toupper(uint8_t(c)) : std::tolower(uint8_t(c)));
    start = !alpha;
  }
  return out;
}

Value split(const std::string& s, const Value& sep, int64_t maxsplit, int line) {
  List out;
  if (sep.is_string()) {
    if (sep.s().empty()) fail(line, "split: empty separator");
    size_t pos = 0;
    while (maxsplit != 0) {
      size_t f = s.find(sep.s(), pos);
      if (f == std::string::npos) break;
      out.emplace_back(s.substr(pos, f - pos));
      pos = f + sep.s().size(), --maxsplit;
    }
    out.emplace_back(s.substr(pos));
    return Value::list(std::move(out));
  }
  const std::u32string u = decode(s);
  size_t i = 0;
  while (true) {
    while (i < u.size() && py_space(u[i])) ++i;
    if (i >= u.size()) break;
    if (maxsplit == 0) {
      size_t end = u.size();
      while (end > i && py_space(u[end - 1])) --end;
      out.emplace_back(encode(u.substr(i, end - i)));
      break;
    }
    size_t j = i;
    while (j < u.size() && !py_space(u[j])) ++j;
    out.emplace_back(encode(u.substr(i, j - i)));
    i = j, --maxsplit;
  }
  return Value::list(std::move(out));
}

std::string replace(const std::string& s, const std::string& a, const std::string& b, int64_t count) {
  if (a.empty()) return s;  // Python inserts between characters; no template relies on it
  std::string out;
  size_t pos = 0;
  while (count != 0) {
    size_t f = s.find(a, pos);
    if (f == std::string::npos) break;
    out += s.substr(pos, f - pos) + b;
    pos = f + a.size(), --count;
  }
  return out + s.substr(pos);
}

Value Renderer::method(const Value& obj, const std::string& name, const List& args, const Object& kw,
                       int line) {
  if (obj.is_string()) {
    const std::string& s = obj.s();
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return Value(strip(s, arg(args, kw, 0, "chars"), name != "rstrip", name != "lstrip"));
    if (name == "split" || name == "rsplit") {
      if (name == "rsplit" && arg(args, kw, 1, "maxsplit", Value(int64_t(-1))).i() != -1)
        fail(line, "rsplit with maxsplit is not supported in chat templates");
      return split(s, arg(args, kw, 0, "sep"), arg(args, kw, 1, "maxsplit", Value(int64_t(-1))).i(), line);
    }
    if (name == "startswith" || name == "endswith") {
      Value p = arg(args, kw, 0, "prefix");
      List options = p.is_list() ? p.l() : List{p};
      for (const Value& o : options) {
        if (!o.is_string()) fail(line, name + " takes a string or a tuple of strings");
        const std::string& x = o.s();
        if (x.size() <= s.size() && (name == "startswith" ? s.compare(0, x.size(), x) == 0
                                                          : s.compare(s.size() - x.size(), x.size(), x) == 0))
          return Value(true);
      }
      return Value(false);
    }
    if (name == "lower") return Value(ascii_case(s, line, "lower()", 0));
    if (name == "upper") return Value(ascii_case(s, line, "upper()", 1));
    if (name == "title") return Value(ascii_case(s, line, "title()", 2));
    if (name == "capitalize") return Value(ascii_case(s, line, "capitalize()", 3));
    if (name == "replace")
      return Value(replace(s, arg(args, kw, 0, "old").str(), arg(args, kw, 1, "new").str(),
                           arg(args, kw, 2, "count", Value(int64_t(-1))).i()));
    if (name == "find" || name == "count") {
      const std::string sub = arg(args, kw, 0, "sub").str();
      if (name == "count") {
        if (sub.empty()) return Value(int64_t(decode(s).size() + 1));
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value(n);
      }
      const size_t p = s.find(sub);
      return Value(p == std::string::npos ? int64_t(-1) : int64_t(decode(s.substr(0, p)).size()));
    }
  }
  if (obj.kind() == Value::Kind::Object) {
    if (name == "get") {
      const Value key = arg(args, kw, 0, "key");
      const Value* v = key.is_string() ? obj.o().find(key.s()) : nullptr;
      return v ? *v : arg(args, kw, 1, "default", Value::none());
    }
    if (name == "items" || name == "keys" || name == "values") {
      List out;
      for (const auto& [k, v] : obj.o().items)
        out.push_back(name == "items" ? Value::tuple({Value(k), v}) : name == "keys" ? Value(k) : v);
      return Value::list(std::move(out));
    }
  }
  fail(line, "the method " + obj.type_name() + "." + name + "() is not supported in chat templates");
}

bool test_value(const std::string& name, const Value& v, const List& args, int line);

// selectattr / rejectattr / select / reject: items where the test (default: truthy) holds.
Value select(const Value& seq, const List& fargs, bool by_attr, bool keep, int line) {
  List out;
  const size_t t0 = by_attr ? 1 : 0;
  for (const Value& item : seq.is_undefined() ? List{} : seq.is_list() ? seq.l() : List{}) {
    Value x = item;
    if (by_attr) {
      if (fargs.empty() || !fargs[0].is_string()) fail(line, "selectattr/rejectattr need an attribute name");
      const Value* a = item.is_mapping() ? item.o().find(fargs[0].s()) : nullptr;
      x = a ? *a : Value();
    }
    bool ok;
    if (fargs.size() <= t0) {
      ok = x.truthy();
    } else {
      if (!fargs[t0].is_string()) fail(line, "the test name must be a string");
      ok = test_value(fargs[t0].s(), x, List(fargs.begin() + long(t0) + 1, fargs.end()), line);
    }
    if (ok == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

// The filters on text: trim, string, lower, upper, title, capitalize, replace, tojson.
std::optional<Value> text_filter(const std::string& f, const Value& v, const List& a, const Object& kw,
                                 int line) {
  if (f == "trim") return Value(strip(v.str(), arg(a, kw, 0, "chars"), true, true));
  if (f == "tojson") {
    const Value ind = arg(a, kw, 0, "indent", Value::none());
    for (const auto& [k, x] : kw.items)
      if (k != "indent") fail(line, "tojson(" + k + "=...) is not supported in chat templates");
    if (v.is_undefined()) fail(line, "tojson of an undefined value");
    return Value(to_json(v, ind.is_none() ? -1 : int(ind.i())));
  }
  if (f == "string") return Value(v.str());
  if (f == "lower") return Value(ascii_case(v.str(), line, "lower", 0));
  if (f == "upper") return Value(ascii_case(v.str(), line, "upper", 1));
  if (f == "title") return Value(ascii_case(v.str(), line, "title", 2));
  if (f == "capitalize") return Value(ascii_case(v.str(), line, "capitalize", 3));
  if (f == "replace")
    return Value(replace(v.str(), arg(a, kw, 0, "old").str(), arg(a, kw, 1, "new").str(),
                         arg(a, kw, 2, "count", Value(int64_t(-1))).i()));
  return std::nullopt;
}

Value Renderer::filter(const Expr& e, Scope& scope) {
  const Value v = eval(*e.args[0], scope);
  List a;
  Object kw;
  for (size_t i = 1; i < e.args.size(); ++i) a.push_back(eval(*e.args[i], scope));
  for (const auto& [k, x] : e.kwargs) kw.set(k, eval(*x, scope));
  const std::string& f = e.name;
  if (std::optional<Value> t = text_filter(f, v, a, kw, e.line)) return *t;
  if (f == "length" || f == "count") {
    if (v.is_string()) return Value(int64_t(decode(v.s()).size()));
    if (v.is_mapping()) return Value(int64_t(v.o().items.size()));
    return Value(int64_t(iterate(v, e.line).size()));
  }
  if (f == "join") {
    std::string out;
    const List items = iterate(v, e.line);
    const Value attr_name = arg(a, kw, 1, "attribute");
    for (size_t i = 0; i < items.size(); ++i) {
      Value x = items[i];
      if (attr_name.is_string())
        x = x.is_mapping() && x.o().find(attr_name.s()) ? *x.o().find(attr_name.s()) : Value();
      out += (i ? arg(a, kw, 0, "d", Value("")).str() : "") + x.str();
    }
    return Value(out);
  }
  if (f == "first" || f == "last") {
    const List items = iterate(v, e.line);
    return items.empty() ? Value() : f == "first" ? items.front() : items.back();
  }
  if (f == "default" || f == "d") {
    const bool boolean = arg(a, kw, 1, "boolean", Value(false)).truthy();
    return v.is_undefined() || (boolean && !v.truthy()) ? arg(a, kw, 0, "default_value", Value("")) : v;
  }
  if (f == "int") {
    if (v.kind() == Value::Kind::Int) return v;
    if (v.kind() == Value::Kind::Float) return Value(int64_t(v.f()));
    if (v.kind() == Value::Kind::Bool) return Value(int64_t(v.b()));
    char* end = nullptr;
    const std::string s = v.str();
    const long long n = std::strtoll(s.c_str(), &end, 10);
    return end && *end == '\0' && !s.empty() ? Value(int64_t(n))
                                             : arg(a, kw, 0, "default", Value(int64_t(0)));
  }
  if (f == "float") {
    if (v.is_number()) return Value(v.f());
    char* end = nullptr;
    const std::string s = v.str();
    const double d = std::strtod(s.c_str(), &end);
    return end && *end == '\0' && !s.empty() ? Value(d) : arg(a, kw, 0, "default", Value(0.0));
  }
  if (f == "list") return Value::list(iterate(v, e.line));
  if (f == "items") {
    if (v.is_undefined()) return Value::list({});
    if (!v.is_mapping()) fail(e.line, "items: expected a mapping, got " + v.type_name());
    return method(Value::object(v.o()), "items", {}, {}, e.line);
  }
  if (f == "selectattr" || f == "rejectattr") return select(v, a, true, f == "selectattr", e.line);
  if (f == "select" || f == "reject") return select(v, a, false, f == "select", e.line);
  if (f == "map") {
    const Value at = arg({}, kw, 0, "attribute");
    if (!at.is_string() || !a.empty())
      fail(e.line, "map is supported with attribute=... only in chat templates");
    List out;
    for (const Value& x : iterate(v, e.line)) {
      const Value* y = x.is_mapping() ? x.o().find(at.s()) : nullptr;
      out.push_back(y ? *y : kw.find("default") ? *kw.find("default") : Value());
    }
    return Value::list(std::move(out));
  }
  if (f == "safe") return v;
  fail(e.line, "the filter '" + f + "' is not supported in chat templates");
}

bool test_value(const std::string& name, const Value& v, const List& args, int line) {
  using K = Value::Kind;
  auto need = [&](size_t n) {
    if (args.size() < n) fail(line, "the test '" + name + "' needs an argument");
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.kind() == K::Object;
  if (name == "iterable") return v.is_list() || v.is_string() || v.kind() == K::Object || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_string() || v.kind() == K::Object;
  if (name == "number") return v.is_number() || v.kind() == K::Bool;
  if (name == "integer") return v.kind() == K::Int;
  if (name == "float") return v.kind() == K::Float;
  if (name == "boolean") return v.kind() == K::Bool;
  if (name == "true") return v.kind() == K::Bool && v.b();
  if (name == "false") return v.kind() == K::Bool && !v.b();
  if (name == "callable") return v.kind() == K::Function;
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind() != K::Int) fail(line, "the test '" + name + "' needs an integer, got " + v.type_name());
    if (name == "divisibleby") {
      need(1);
      if (args[0].kind() != K::Int || args[0].i() == 0) fail(line, "divisibleby needs a non-zero integer");
      return v.i() % args[0].i() == 0;
    }
    return (((v.i() % 2) + 2) % 2 == 1) == (name == "odd");
  }
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") {
    need(1);
    return equal(v, args[0]);
  }
  if (name == "ne" || name == "!=") {
    need(1);
    return !equal(v, args[0]);
  }
  if (name == "in") {
    need(1);
    if (args[0].is_list())
      for (const Value& x : args[0].l())
        if (equal(x, v)) return true;
    if (args[0].is_string() && v.is_string()) return args[0].s().find(v.s()) != std::string::npos;
    if (args[0].is_mapping() && v.is_string()) return args[0].o().find(v.s()) != nullptr;
    return false;
  }
  fail(line, "the test '" + name + "' is not supported in chat templates");
}

bool Renderer::test(const Expr& e, Scope& scope) {
  List args;
  for (size_t i = 1; i < e.args.size(); ++i) args.push_back(eval(*e.args[i], scope));
  return test_value(e.name, eval(*e.args[0], scope), args, e.line);
}

// transformers' globals: raise_exception, strftime_now, namespace, dict, and jinja2's range.
Object globals() {
  Object g;
  g.set("raise_exception", Value::function([](const List& a, const Object&) -> Value {
          std::string msg = a.empty() ? "" : a[0].str();
          for (char& c : msg)
            if (c == '\n') c = ' ';
          NDT_FAIL("chat template raised an error: ", msg);
        }));
  g.set("strftime_now", Value::function([](const List& a, const Object&) -> Value {
          const std::time_t t = std::time(nullptr);
          std::tm tm{};
          localtime_r(&t, &tm);
          char buf[256];
          const size_t n = std::strftime(buf, sizeof buf, a.empty() ? "" : a[0].str().c_str(), &tm);
          return Value(std::string(buf, n));
        }));
  auto make_dict = [](const List& a, const Object& kw, bool ns) -> Value {
    Object o;
    for (const Value& x : a) {
      if (!x.is_mapping()) NDT_FAIL("namespace()/dict() take a mapping or keyword arguments");
      for (const auto& [k, v] : x.o().items) o.set(k, v);
    }
    for (const auto& [k, v] : kw.items) {
      if (ns && !k.empty() && k[0] == '_') NDT_FAIL("namespace attributes may not start with '_'");
      o.set(k, v);
    }
    return ns ? Value::name_space(std::move(o)) : Value::object(std::move(o));
  };
  g.set("namespace",
        Value::function([make_dict](const List& a, const Object& kw) { return make_dict(a, kw, true); }));
  g.set("dict",
        Value::function([make_dict](const List& a, const Object& kw) { return make_dict(a, kw, false); }));
  g.set("range", Value::function([](const List& a, const Object&) -> Value {
          for (const Value& x : a)
            if (x.kind() != Value::Kind::Int) NDT_FAIL("range() takes integers");
          if (a.empty() || a.size() > 3) NDT_FAIL("range() takes 1 to 3 integers");
          const int64_t lo = a.size() > 1 ? a[0].i() : 0, hi = a.size() > 1 ? a[1].i() : a[0].i();
          const int64_t step = a.size() > 2 ? a[2].i() : 1;
          if (step == 0) NDT_FAIL("range() step must not be zero");
          if ((hi - lo) / step > 100000) NDT_FAIL("range() of more than 100000 items");
          List out;
          for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) out.emplace_back(i);
          return Value::list(std::move(out));
        }));
  return g;
}

}  // namespace

std::string Template::render(const Object& vars) const {
  const Object g = globals();
  Scope top{{}, nullptr, &g};
  Scope user{{}, &top, &vars};
  std::string out;
  Renderer r;
  r.exec(root_->body, user, out);
  return out;
}

}  // namespace ndt::jinja
