// Jinja values with Python's meaning: str() and repr() as Python prints them, == as Python
// compares, and json.dumps(ensure_ascii=False) as transformers' tojson writes it.
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tensor/error.h"
#include "tokenizer/jinja.h"

namespace ndt::jinja {

const Value* Object::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Object::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}
Value::Value(bool b) : kind_(Kind::Bool), b_(b) {}
Value::Value(int64_t v) : kind_(Kind::Int), i_(v) {}
Value::Value(double v) : kind_(Kind::Float), f_(v) {}
Value::Value(std::string s) : kind_(Kind::String), s_(std::make_shared<const std::string>(std::move(s))) {}
Value Value::list(List items) {
  Value v;
  v.kind_ = Kind::List, v.l_ = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::tuple(List items) {
  Value v = list(std::move(items));
  v.tuple_ = true;
  return v;
}
Value Value::object(Object o) {
  Value v;
  v.kind_ = Kind::Object, v.o_ = std::make_shared<Object>(std::move(o));
  return v;
}
Value Value::name_space(Object o) {
  Value v = object(std::move(o));
  v.kind_ = Kind::Namespace;
  return v;
}
Value Value::function(Function f) {
  Value v;
  v.kind_ = Kind::Function, v.fn_ = std::make_shared<Function>(std::move(f));
  return v;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return b_;
    case Kind::Int:
      return i_ != 0;
    case Kind::Float:
      return f_ != 0;
    case Kind::String:
      return !s_->empty();
    case Kind::List:
      return !l_->empty();
    case Kind::Object:
      return !o_->items.empty();
    default:
      return true;
  }
}

std::string Value::type_name() const {
  static const char* names[] = {"undefined", "NoneType", "bool", "int",       "float",
                                "str",       "list",     "dict", "Namespace", "function"};
  return names[int(kind_)];
}

namespace {

// Python's float repr: the shortest digits that read back, fixed notation for exponents
// -4..15, else d.ddde+XX.
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  const int exp = std::atoi(sci.c_str() + e + 1);
  std::string digits;
  bool neg = false;
  for (size_t i = 0; i < e; ++i)
    if (sci[i] == '-') {
      neg = true;
    } else if (sci[i] != '.') {
      digits += sci[i];
    }
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
      out += digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out.append(1, '.').append(digits, 1);
  char eb[16];
  std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + eb;
}

std::string str_repr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == q)
      out += std::string("\\") + char(q);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else
      out += char(c);
  }
  return out + q;
}

}  // namespace

std::string Value::str() const {
  switch (kind_) {
    case Kind::Undefined:
      return "";
    case Kind::String:
      return *s_;
    default:
      return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::Undefined:
      return "";
    case Kind::None:
      return "None";
    case Kind::Bool:
      return b_ ? "True" : "False";
    case Kind::Int:
      return std::to_string(i_);
    case Kind::Float:
      return float_repr(f_);
    case Kind::String:
      return str_repr(*s_);
    case Kind::List: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < l_->size(); ++i) out += (i ? ", " : "") + (*l_)[i].repr();
      return out + (tuple_ ? (l_->size() == 1 ? ",)" : ")") : "]");
    }
    case Kind::Object: {
      std::string out = "{";
      for (size_t i = 0; i < o_->items.size(); ++i)
        out += (i ? ", " : "") + str_repr(o_->items[i].first) + ": " + o_->items[i].second.repr();
      return out + "}";
    }
    case Kind::Namespace:
      return "<Namespace>";
    case Kind::Function:
      return "<function>";
  }
  return "";
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  auto numeric = [](const Value& v) { return v.is_number() || v.kind() == K::Bool; };
  if (numeric(a) && numeric(b)) {
    auto num = [](const Value& v) { return v.kind() == K::Bool ? double(v.b()) : v.f(); };
    if (a.kind() != K::Float && b.kind() != K::Float)
      return (a.kind() == K::Bool ? int64_t(a.b()) : a.i()) == (b.kind() == K::Bool ? int64_t(b.b()) : b.i());
    return num(a) == num(b);
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::Undefined:
    case K::None:
      return true;
    case K::String:
      return a.s() == b.s();
    case K::List:
      if (a.l().size() != b.l().size() || a.is_tuple() != b.is_tuple()) return false;
      for (size_t i = 0; i < a.l().size(); ++i)
        if (!equal(a.l()[i], b.l()[i])) return false;
      return true;
    case K::Object: {
      if (a.o().items.size() != b.o().items.size()) return false;
      for (const auto& [k, v] : a.o().items) {
        const Value* w = b.o().find(k);
        if (!w || !equal(v, *w)) return false;
      }
      return true;
    }
    default:
      return &a.o() == &b.o();
  }
}

namespace {

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, int indent, int depth) {
  using K = Value::Kind;
  std::string nl, close_nl;
  if (indent >= 0) {
    nl.assign(1, '\n').append(size_t(indent * (depth + 1)), ' ');
    close_nl.assign(1, '\n').append(size_t(indent * depth), ' ');
  }
  const std::string sep = indent < 0 ? ", " : ",";
  switch (v.kind()) {
    case K::None:
      out += "null";
      return;
    case K::Bool:
      out += v.b() ? "true" : "false";
      return;
    case K::Int:
    case K::Float:
      out += v.repr();
      return;
    case K::String:
      json_string(out, v.s());
      return;
    case K::List:
      if (v.l().empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t i = 0; i < v.l().size(); ++i) {
        out += (i ? sep : "") + nl;
        json_value(out, v.l()[i], indent, depth + 1);
      }
      out += close_nl + "]";
      return;
    case K::Object:
      if (v.o().items.empty()) {
        out += "{}";
        return;
      }
      out += "{";
      for (size_t i = 0; i < v.o().items.size(); ++i) {
        out += (i ? sep : "") + nl;
        json_string(out, v.o().items[i].first);
        out += ": ";
        json_value(out, v.o().items[i].second, indent, depth + 1);
      }
      out += close_nl + "}";
      return;
    default:
      NDT_FAIL("tojson: a ", v.type_name(), " value is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, int indent) {
  std::string out;
  json_value(out, v, indent, 0);
  return out;
}

}  // namespace ndt::jinja
