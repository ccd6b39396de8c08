// Reading a Jinja template: the lexer (text and tags, with trim_blocks, lstrip_blocks and the
// `-` whitespace control as jinja2's lexer applies them) and a recursive-descent parser with
// jinja2's precedence (filters and tests bind tighter than arithmetic: `a + b | trim` is
// a + (b | trim)).
#include <cctype>
#include <cstdlib>

#include "tensor/error.h"
#include "tokenizer/jinja_impl.h"
#include "tokenizer/unicode.h"

namespace ndt::jinja {

void fail(int line, const std::string& what) { NDT_FAIL("chat template line ", line, ": ", what); }

namespace {

struct Tok {
  enum T { Name, Int, Float, Str, Op, End } t = End;
  std::string s;  // Name, Op, Str (decoded)
  Value v;        // Int, Float
  int line = 0;
};

// One piece of the template: text, or the tokens of a {{ }} or {% %} tag.
struct Piece {
  enum T { Text, Var, Block } t = Text;
  std::string text;
  std::vector<Tok> toks;
  int line = 0;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// The template cut into text, tags and their tokens; string literals with Python's escapes
// (\n \t \\ \' \" \uXXXX ...), as jinja2 decodes them.
class Lexer {
 public:
  explicit Lexer(const std::string& src) : src_(src) {}

  std::vector<Piece> run() {
    std::vector<Piece> out;
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t open = find_open(pos_);
      std::string text = src_.substr(pos_, open - pos_);
      const int text_line = line_;
      count_lines(pos_, open);
      if (open == src_.size()) {
        push_text(out, text, text_line);
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      size_t p = open + 2;
      if (p < src_.size() && src_[p] == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
        ++p;
      } else if (p < src_.size() && src_[p] == '+') {
        ++p;  // lstrip disabled for this tag
      } else if (kind != '{') {
        lstrip(text, line_starting);
      }
      push_text(out, text, text_line);
      pos_ = p;
      if (kind == '#') {
        size_t end = src_.find("#}", pos_);
        if (end == std::string::npos) fail(line_, "comment {# not closed with #}");
        const bool minus = end > pos_ && src_[end - 1] == '-';
        count_lines(pos_, end);
        pos_ = end + 2;
        line_starting = after_close(minus, true);
        continue;
      }
      Piece piece;
      piece.t = kind == '{' ? Piece::Var : Piece::Block;
      piece.line = line_;
      bool minus = false;
      piece.toks = tokens(kind == '{' ? '}' : '%', minus);
      out.push_back(std::move(piece));
      line_starting = after_close(minus, kind == '%');
    }
    return out;
  }

 private:
  size_t find_open(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return src_.size();
  }
  void count_lines(size_t a, size_t b) {
    for (size_t i = a; i < b && i < src_.size(); ++i) line_ += src_[i] == '\n';
  }
  static void push_text(std::vector<Piece>& out, const std::string& text, int line) {
    if (text.empty()) return;
    Piece p;
    p.text = text, p.line = line;
    out.push_back(std::move(p));
  }
  // lstrip_blocks: spaces and tabs between the line's start and a block or comment tag go.
  static void lstrip(std::string& text, bool line_starting) {
    const size_t nl = text.rfind('\n');
    const size_t start = nl == std::string::npos ? 0 : nl + 1;
    if (nl == std::string::npos && !line_starting) return;
    for (size_t i = start; i < text.size(); ++i)
      if (text[i] != ' ' && text[i] != '\t') return;
    text.resize(start);
  }
  // After a tag's close: `-` strips all whitespace, trim_blocks one newline after a block or
  // comment. Returns whether what was consumed ended a line (jinja2's line_starting).
  bool after_close(bool minus, bool block) {
    size_t p = pos_;
    if (minus) {
      while (p < src_.size() && is_space(src_[p])) ++p;
    } else if (block && p < src_.size() && src_[p] == '\n') {
      ++p;
    }
    const bool nl = p > pos_ && src_[p - 1] == '\n';
    count_lines(pos_, p);
    pos_ = p;
    return nl;
  }

  std::vector<Tok> tokens(char close, bool& minus);
  Tok string_token(char quote);

  const std::string& src_;
  size_t pos_ = 0;
  int line_ = 1;
};

Tok Lexer::string_token(char quote) {
  Tok t;
  t.t = Tok::Str, t.line = line_;
  ++pos_;
  while (true) {
    if (pos_ >= src_.size()) fail(t.line, "string literal not closed");
    char c = src_[pos_++];
    if (c == quote) break;
    if (c == '\n') ++line_;
    if (c != '\\') {
      t.s += c;
      continue;
    }
    if (pos_ >= src_.size()) fail(t.line, "string literal not closed");
    char e = src_[pos_++];
    switch (e) {
      case 'n':
        t.s += '\n';
        break;
      case 't':
        t.s += '\t';
        break;
      case 'r':
        t.s += '\r';
        break;
      case '0':
        t.s += '\0';
        break;
      case 'b':
        t.s += '\b';
        break;
      case 'f':
        t.s += '\f';
        break;
      case 'v':
        t.s += '\v';
        break;
      case '\\':
      case '\'':
      case '"':
        t.s += e;
        break;
      case '\n':
        ++line_;
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        if (pos_ + n > src_.size()) fail(t.line, std::string("bad \\") + e + " escape in a string literal");
        tok::append_utf8(t.s, uint32_t(std::strtoul(src_.substr(pos_, n).c_str(), nullptr, 16)));
        pos_ += n;
        break;
      }
      default:
        t.s += '\\', t.s += e;  // Python keeps unknown escapes as written
    }
  }
  return t;
}

std::vector<Tok> Lexer::tokens(char close, bool& minus) {
  static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                               ">",  "(",  ")",  "[",  "]",  "{",  "}", ",", ".", ":", "|", "="};
  std::vector<Tok> out;
  while (true) {
    while (pos_ < src_.size() && is_space(src_[pos_])) line_ += src_[pos_++] == '\n';
    if (pos_ >= src_.size()) fail(line_, std::string("tag not closed with ") + close + "}");
    const char c = src_[pos_];
    if (c == '-' && pos_ + 2 < src_.size() && src_[pos_ + 1] == close && src_[pos_ + 2] == '}') {
      minus = true, pos_ += 3;
      return out;
    }
    if (c == close && pos_ + 1 < src_.size() && src_[pos_ + 1] == '}') {
      minus = false, pos_ += 2;
      return out;
    }
    Tok t;
    t.line = line_;
    if (c == '\'' || c == '"') {
      out.push_back(string_token(c));
      continue;
    }
    if (std::isalpha(uint8_t(c)) || c == '_') {
      size_t b = pos_;
      while (pos_ < src_.size() && (std::isalnum(uint8_t(src_[pos_])) || src_[pos_] == '_')) ++pos_;
      t.t = Tok::Name, t.s = src_.substr(b, pos_ - b);
    } else if (std::isdigit(uint8_t(c))) {
      size_t b = pos_;
      while (pos_ < src_.size() && (std::isdigit(uint8_t(src_[pos_])) || src_[pos_] == '_')) ++pos_;
      bool is_float = false;
      if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(uint8_t(src_[pos_ + 1]))) {
        is_float = true, ++pos_;
        while (pos_ < src_.size() && std::isdigit(uint8_t(src_[pos_]))) ++pos_;
      }
      if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
        is_float = true, ++pos_;
        if (pos_ < src_.size() && (src_[pos_] == '+' || src_[pos_] == '-')) ++pos_;
        while (pos_ < src_.size() && std::isdigit(uint8_t(src_[pos_]))) ++pos_;
      }
      std::string num;
      for (char d : src_.substr(b, pos_ - b))
        if (d != '_') num += d;
      t.t = is_float ? Tok::Float : Tok::Int;
      t.v = is_float ? Value(std::strtod(num.c_str(), nullptr))
                     : Value(int64_t(std::strtoll(num.c_str(), nullptr, 10)));
    } else {
      t.t = Tok::Op;
      for (const char* op : kOps)
        if (src_.compare(pos_, std::string(op).size(), op) == 0) {
          t.s = op;
          break;
        }
      if (t.s.empty()) fail(line_, std::string("unexpected character '") + c + "'");
      pos_ += t.s.size();
    }
    out.push_back(std::move(t));
  }
}

// ---- parser -----------------------------------------------------------------------------

ExprP make(Expr::K k, int line, std::vector<ExprP> args = {}, std::string name = "") {
  auto e = std::make_shared<Expr>();
  e->k = k, e->line = line, e->args = std::move(args), e->name = std::move(name);
  return e;
}

class Parser {
 public:
  explicit Parser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  // Statements until a block tag whose first word is in `ends` (left unconsumed), or the end.
  Body body(const std::vector<std::string>& ends, const std::string& opener, int open_line) {
    Body out;
    while (true) {
      if (pi_ >= pieces_.size()) {
        if (ends.empty()) return out;
        fail(open_line, "{% " + opener + " %} is not closed with {% " + ends.back() + " %}");
      }
      const Piece& p = pieces_[pi_];
      if (p.t == Piece::Text) {
        auto n = std::make_shared<Node>();
        n->k = Node::K::Text, n->line = p.line, n->text = p.text;
        out.push_back(n), ++pi_;
      } else if (p.t == Piece::Var) {
        start(p);
        auto n = std::make_shared<Node>();
        n->k = Node::K::Output, n->line = p.line, n->expr = expr();
        finish();
        out.push_back(n), ++pi_;
      } else {
        const std::string word = p.toks.empty() ? "" : p.toks[0].s;
        for (const std::string& e : ends)
          if (word == e) return out;
        out.push_back(statement(p));
      }
    }
  }

 private:
  void start(const Piece& p) { toks_ = &p.toks, ti_ = 0, line_ = p.line; }
  const Tok& peek(size_t ahead = 0) const {
    static const Tok end;
    return ti_ + ahead < toks_->size() ? (*toks_)[ti_ + ahead] : end;
  }
  int line() const { return peek().t == Tok::End ? line_ : peek().line; }
  bool is_op(const char* s, size_t ahead = 0) const { return peek(ahead).t == Tok::Op && peek(ahead).s == s; }
  bool is_name(const char* s, size_t ahead = 0) const {
    return peek(ahead).t == Tok::Name && peek(ahead).s == s;
  }
  bool accept_op(const char* s) { return is_op(s) ? (++ti_, true) : false; }
  bool accept_name(const char* s) { return is_name(s) ? (++ti_, true) : false; }
  std::string describe(const Tok& t) const {
    return t.t == Tok::End ? "the end of the tag"
                           : "'" + (t.t == Tok::Int || t.t == Tok::Float ? t.v.str() : t.s) + "'";
  }
  void expect_op(const char* s) {
    if (!accept_op(s)) fail(line(), std::string("expected '") + s + "', got " + describe(peek()));
  }
  std::string name() {
    if (peek().t != Tok::Name) fail(line(), "expected a name, got " + describe(peek()));
    return (*toks_)[ti_++].s;
  }
  void finish() {
    if (peek().t != Tok::End) fail(line(), "unexpected " + describe(peek()) + " in the tag");
  }
  // The next block tag must be exactly {% word %}.
  void close_tag() {
    start(pieces_[pi_]);
    ++ti_;
    finish();
    ++pi_;
  }

  NodeP statement(const Piece& p);
  NodeP if_statement(const Piece& p);
  NodeP for_statement(const Piece& p);
  NodeP set_statement(const Piece& p);

  ExprP expr();  // conditional expression
  ExprP or_expr();
  ExprP and_expr();
  ExprP not_expr();
  ExprP compare();
  ExprP math1();
  ExprP concat();
  ExprP math2();
  ExprP power();
  ExprP unary(bool with_filter = true);
  ExprP primary();
  ExprP postfix(ExprP e);
  ExprP filters(ExprP e);
  void call_args(Expr& e);

  std::vector<Piece> pieces_;
  size_t pi_ = 0;
  const std::vector<Tok>* toks_ = nullptr;
  size_t ti_ = 0;
  int line_ = 0;
};

NodeP Parser::statement(const Piece& p) {
  start(p);
  const std::string word = peek().t == Tok::Name ? peek().s : "";
  if (word == "if") return if_statement(p);
  if (word == "for") return for_statement(p);
  if (word == "set") return set_statement(p);
  auto n = std::make_shared<Node>();
  n->line = p.line;
  if (word == "break" || word == "continue") {
    ++ti_;
    finish();
    ++pi_;
    n->k = word == "break" ? Node::K::Break : Node::K::Continue;
    return n;
  }
  if (word == "generation") {
    ++ti_;
    finish();
    ++pi_;
    n->k = Node::K::Generation;
    n->body = body({"endgeneration"}, "generation", p.line);
    close_tag();
    return n;
  }
  if (word.empty()) fail(p.line, "a block tag must start with a statement name");
  fail(p.line,
       "{% " + word + " %} is not supported in chat templates" +
           (word.rfind("end", 0) == 0 || word == "else" || word == "elif" ? " here (no open block)" : ""));
}

NodeP Parser::if_statement(const Piece& p) {
  auto n = std::make_shared<Node>();
  n->k = Node::K::If, n->line = p.line;
  ++ti_;  // if
  ExprP cond = expr();
  finish();
  ++pi_;
  while (true) {
    Body b = body({"elif", "else", "endif"}, "if", p.line);
    n->branches.emplace_back(cond, std::move(b));
    start(pieces_[pi_]);
    const std::string word = peek().s;
    ++ti_;
    if (word == "elif") {
      cond = expr();
      finish();
      ++pi_;
      continue;
    }
    finish();
    ++pi_;
    if (word == "else") {
      n->else_body = body({"endif"}, "if", p.line);
      close_tag();
    }
    return n;
  }
}

NodeP Parser::for_statement(const Piece& p) {
  auto n = std::make_shared<Node>();
  n->k = Node::K::For, n->line = p.line;
  ++ti_;  // for
  const bool paren = accept_op("(");
  n->targets.push_back(name());
  while (accept_op(",")) n->targets.push_back(name());
  if (paren) expect_op(")");
  if (!accept_name("in")) fail(line(), "expected 'in' in the for statement, got " + describe(peek()));
  n->expr = or_expr();  // no conditional expression: `if` filters the items
  if (accept_name("if")) n->filter = expr();
  if (is_name("recursive")) fail(line(), "recursive for loops are not supported in chat templates");
  finish();
  ++pi_;
  n->body = body({"else", "endfor"}, "for", p.line);
  if (!pieces_[pi_].toks.empty() && pieces_[pi_].toks[0].s == "else") {
    close_tag();
    n->else_body = body({"endfor"}, "for", p.line);
  }
  close_tag();
  return n;
}

NodeP Parser::set_statement(const Piece& p) {
  auto n = std::make_shared<Node>();
  n->line = p.line;
  ++ti_;  // set
  n->targets.push_back(name());
  if (accept_op(".")) n->attr = name();
  if (is_op(",")) fail(line(), "{% set a, b = ... %} (tuple assignment) is not supported in chat templates");
  if (accept_op("=")) {
    n->k = Node::K::Set;
    n->expr = expr();
    finish();
    ++pi_;
    return n;
  }
  if (!n->attr.empty()) fail(line(), "expected '=' after set " + n->targets[0] + "." + n->attr);
  if (is_op("|")) fail(line(), "filtered {% set %} blocks are not supported in chat templates");
  finish();
  ++pi_;
  n->k = Node::K::SetBlock;
  n->body = body({"endset"}, "set", p.line);
  close_tag();
  return n;
}

ExprP Parser::expr() {
  ExprP e = or_expr();
  while (is_name("if")) {
    const int l = line();
    ++ti_;
    ExprP cond = or_expr();
    ExprP other = accept_name("else") ? expr() : nullptr;
    e = make(Expr::K::Cond, l, {e, cond, other});
  }
  return e;
}

ExprP Parser::or_expr() {
  ExprP e = and_expr();
  while (is_name("or")) {
    const int l = line();
    ++ti_;
    e = make(Expr::K::Binary, l, {e, and_expr()}, "or");
  }
  return e;
}

ExprP Parser::and_expr() {
  ExprP e = not_expr();
  while (is_name("and")) {
    const int l = line();
    ++ti_;
    e = make(Expr::K::Binary, l, {e, not_expr()}, "and");
  }
  return e;
}

ExprP Parser::not_expr() {
  if (is_name("not")) {
    const int l = line();
    ++ti_;
    return make(Expr::K::Unary, l, {not_expr()}, "not");
  }
  return compare();
}

ExprP Parser::compare() {
  ExprP e = math1();
  while (true) {
    const int l = line();
    std::string op;
    if (peek().t == Tok::Op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == "<=" ||
                                peek().s == ">" || peek().s == ">=")) {
      op = peek().s, ++ti_;
    } else if (is_name("in")) {
      op = "in", ++ti_;
    } else if (is_name("not") && is_name("in", 1)) {
      op = "not in", ti_ += 2;
    } else {
      return e;
    }
    e = make(Expr::K::Binary, l, {e, math1()}, op);
  }
}

ExprP Parser::math1() {
  ExprP e = concat();
  while (is_op("+") || is_op("-")) {
    const int l = line();
    const std::string op = (*toks_)[ti_++].s;
    e = make(Expr::K::Binary, l, {e, concat()}, op);
  }
  return e;
}

ExprP Parser::concat() {
  ExprP e = math2();
  while (is_op("~")) {
    const int l = line();
    ++ti_;
    e = make(Expr::K::Binary, l, {e, math2()}, "~");
  }
  return e;
}

ExprP Parser::math2() {
  ExprP e = power();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const int l = line();
    const std::string op = (*toks_)[ti_++].s;
    e = make(Expr::K::Binary, l, {e, power()}, op);
  }
  return e;
}

ExprP Parser::power() {
  ExprP e = unary();
  while (is_op("**")) {
    const int l = line();
    ++ti_;
    e = make(Expr::K::Binary, l, {e, unary()}, "**");
  }
  return e;
}

ExprP Parser::unary(bool with_filter) {
  const int l = line();
  ExprP e;
  if (accept_op("-")) {
    e = make(Expr::K::Unary, l, {unary(false)}, "-");
  } else if (accept_op("+")) {
    e = make(Expr::K::Unary, l, {unary(false)}, "+");
  } else {
    e = postfix(primary());
  }
  return with_filter ? filters(e) : e;
}

ExprP Parser::primary() {
  const Tok t = peek();
  const int l = line();
  if (t.t == Tok::End) fail(l, "expected an expression, got the end of the tag");
  ++ti_;
  auto lit = [&](Value v) {
    auto e = std::make_shared<Expr>();
    e->k = Expr::K::Literal, e->line = l, e->lit = std::move(v);
    return e;
  };
  if (t.t == Tok::Int || t.t == Tok::Float) return lit(t.v);
  if (t.t == Tok::Str) {
    std::string s = t.s;
    while (peek().t == Tok::Str) s += (*toks_)[ti_++].s;  // adjacent literals join
    return lit(Value(s));
  }
  if (t.t == Tok::Name) {
    if (t.s == "true" || t.s == "True") return lit(Value(true));
    if (t.s == "false" || t.s == "False") return lit(Value(false));
    if (t.s == "none" || t.s == "None") return lit(Value::none());
    return make(Expr::K::Name, l, {}, t.s);
  }
  if (t.s == "(") {
    if (accept_op(")")) return make(Expr::K::ListLit, l, {}, "tuple");
    ExprP e = expr();
    if (!is_op(",")) {
      expect_op(")");
      return e;
    }
    std::vector<ExprP> items{e};  // a tuple: a list to the template
    while (accept_op(",") && !is_op(")")) items.push_back(expr());
    expect_op(")");
    return make(Expr::K::ListLit, l, items, "tuple");
  }
  if (t.s == "[") {
    std::vector<ExprP> items;
    while (!accept_op("]")) {
      items.push_back(expr());
      if (!accept_op(",")) {
        expect_op("]");
        break;
      }
    }
    return make(Expr::K::ListLit, l, items);
  }
  if (t.s == "{") {
    std::vector<ExprP> kv;
    while (!accept_op("}")) {
      kv.push_back(expr());
      expect_op(":");
      kv.push_back(expr());
      if (!accept_op(",")) {
        expect_op("}");
        break;
      }
    }
    return make(Expr::K::DictLit, l, kv);
  }
  fail(l, "unexpected " + describe(t) + " in an expression");
}

void Parser::call_args(Expr& e) {
  // after '('
  while (!accept_op(")")) {
    if (is_op("*") || is_op("**"))
      fail(line(), "*args and **kwargs in calls are not supported in chat templates");
    if (peek().t == Tok::Name && is_op("=", 1)) {
      std::string k = name();
      ++ti_;
      e.kwargs.emplace_back(k, expr());
    } else {
      e.args.push_back(expr());
    }
    if (!accept_op(",")) {
      expect_op(")");
      break;
    }
  }
}

ExprP Parser::postfix(ExprP e) {
  while (true) {
    const int l = line();
    if (accept_op(".")) {
      if (peek().t == Tok::Int) {
        e = make(Expr::K::Index, l, {e, make(Expr::K::Literal, l)});
        const_cast<Expr&>(*e->args[1]).lit = (*toks_)[ti_++].v;
      } else {
        e = make(Expr::K::Attr, l, {e}, name());
      }
    } else if (accept_op("[")) {
      std::vector<ExprP> parts{e};
      bool slice = false;
      for (int k = 0; k < 3; ++k) {
        if (is_op(":") || is_op("]")) {
          parts.push_back(nullptr);
        } else {
          parts.push_back(expr());
        }
        if (k < 2 && accept_op(":")) {
          slice = true;
          continue;
        }
        break;
      }
      expect_op("]");
      if (slice) {
        parts.resize(4);
        e = make(Expr::K::Slice, l, parts);
      } else {
        if (!parts[1]) fail(l, "empty subscript []");
        e = make(Expr::K::Index, l, {parts[0], parts[1]});
      }
    } else if (accept_op("(")) {
      auto c = std::make_shared<Expr>();
      c->k = Expr::K::Call, c->line = l, c->args = {e};
      call_args(*c);
      e = c;
    } else {
      return e;
    }
  }
}

ExprP Parser::filters(ExprP e) {
  while (true) {
    const int l = line();
    if (accept_op("|")) {
      auto f = std::make_shared<Expr>();
      f->k = Expr::K::Filter, f->line = l, f->args = {e}, f->name = name();
      if (accept_op("(")) call_args(*f);
      e = f;
    } else if (accept_name("is")) {
      auto t = std::make_shared<Expr>();
      t->k = Expr::K::Test, t->line = l, t->args = {e};
      t->negate = accept_name("not");
      t->name = name();
      if (accept_op("(")) {
        call_args(*t);
      } else if (peek().t == Tok::Str || peek().t == Tok::Int || peek().t == Tok::Float ||
                 (peek().t == Tok::Name && !is_name("else") && !is_name("or") && !is_name("and") &&
                  !is_name("if") && !is_name("in") && !is_name("not") && !is_name("is"))) {
        t->args.push_back(postfix(primary()));
      }
      e = t;
    } else if (accept_op("(")) {
      auto c = std::make_shared<Expr>();
      c->k = Expr::K::Call, c->line = l, c->args = {e};
      call_args(*c);
      e = c;
    } else {
      return e;
    }
  }
}

}  // namespace

Template Template::parse(const std::string& text) {
  // jinja2 reads \r\n and \r as \n, and drops one newline at the end (keep_trailing_newline off)
  std::string src;
  src.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r') {
      src += '\n';
      if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
    } else {
      src += text[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  Parser parser(Lexer(src).run());
  auto root = std::make_shared<Node>();
  root->k = Node::K::Generation;  // a body rendered as is
  root->body = parser.body({}, "", 1);
  Template t;
  t.root_ = root;
  return t;
}

}  // namespace ndt::jinja
