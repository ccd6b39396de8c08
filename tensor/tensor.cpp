#include "tensor/tensor.h"

#include "tensor/checked.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <numeric>
#include <sstream>

#include "tensor/cuda/runtime.h"
#include "tensor/kernels.h"

namespace ndt {

// ---- small helpers ----------------------------------------------------------------

namespace detail {
void throw_error(const char* file, int line, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  throw Error(msg + " [" + (base ? base + 1 : file) + ":" + std::to_string(line) + "]");
}
}  // namespace detail

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f64:
      return 8;
    case DType::i32:
      return 4;
    case DType::u16:
      return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "float32";
    case DType::bf16:
      return "bfloat16";
    case DType::f64:
      return "float64";
    case DType::i32:
      return "int32";
    case DType::u16:
      return "uint16";
  }
  return "?";
}

DType dtype_from_name(const std::string& s) {
  if (s == "float32" || s == "f32" || s == "fp32") return DType::f32;
  if (s == "bfloat16" || s == "bf16") return DType::bf16;
  if (s == "float64" || s == "f64" || s == "fp64") return DType::f64;
  if (s == "int32" || s == "i32") return DType::i32;
  if (s == "uint16" || s == "u16") return DType::u16;
  NDT_FAIL("unknown dtype '", s, "' (expected float32, bfloat16, float64, int32 or uint16)");
}

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    const std::string idx = s.substr(5);
    NDT_CHECK(!idx.empty() && idx.size() <= 6 && std::all_of(idx.begin(), idx.end(), ::isdigit),
              "bad device '", s, "' (expected cpu, cuda or cuda:N)");
    return cuda(std::stoi(idx));
  }
  NDT_FAIL("bad device '", s, "' (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

std::string shape_str(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    if (__builtin_mul_overflow(n, d, &n))
      NDT_FAIL("shape ", shape_str(s), " has more elements than a 64-bit count holds");
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    st[i] = s;
    if (__builtin_mul_overflow(s, std::max<int64_t>(shape[i], 1), &s))
      NDT_FAIL("shape ", shape_str(shape), " has more elements than a 64-bit count holds");
  }
  return st;
}

static int64_t wrap_dim(int64_t d, int64_t ndim, const char* what) {
  int64_t w = d < 0 ? d + ndim : d;
  NDT_CHECK(w >= 0 && w < ndim, what, ": dim ", d, " out of range for a ", ndim, "-D tensor");
  return w;
}

static Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl().storage;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(impl);
}

// ---- creation ---------------------------------------------------------------------

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) NDT_CHECK(d >= 0, "Tensor::empty: negative dimension in ", ndt::shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  const int64_t bytes =
      checked_mul(numel_of(shape), static_cast<int64_t>(dtype_size(dtype)), "Tensor::empty bytes");
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(bytes), device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(impl);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  kernels::fill(t, value);
  return t;
}

Tensor Tensor::scalar(double value, DType dtype, Device device) { return full({}, value, dtype, device); }

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  NDT_CHECK(static_cast<int64_t>(values.size()) == numel_of(shape), "from_vector: ", values.size(),
            " values do not fill shape ", ndt::shape_str(shape));
  Tensor t = empty(shape, dtype_of<T>(), Device::cpu());
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(T));
  return device.is_cpu() ? t : t.to(device);
}
template Tensor Tensor::from_vector(const std::vector<float>&, const Shape&, Device);
template Tensor Tensor::from_vector(const std::vector<double>&, const Shape&, Device);
template Tensor Tensor::from_vector(const std::vector<int32_t>&, const Shape&, Device);
template Tensor Tensor::from_vector(const std::vector<uint16_t>&, const Shape&, Device);
template Tensor Tensor::from_vector(const std::vector<bf16>&, const Shape&, Device);

// ---- properties -------------------------------------------------------------------

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape()[i] == 1) continue;
    if (strides()[i] != expected) return false;
    expected *= shape()[i];
  }
  return true;
}

std::string Tensor::desc() const {
  if (!defined()) return "undefined";
  return std::string(dtype_name(dtype())) + shape_str() + " on " + device().str();
}

void* Tensor::data_ptr() const {
  const Storage& st = *impl().storage;
  NDT_CHECK(st.allocated() || st.nbytes() == 0, "use of ", desc(),
            (name().empty() ? "" : " '" + name() + "'"),
            " whose memory is released (a sharded unit used while it is not gathered)");
  return static_cast<char*>(st.data()) + offset() * dtype_size(dtype());
}

template <typename T>
T* Tensor::data() const {
  NDT_CHECK(dtype() == dtype_of<T>(), "data<", dtype_name(dtype_of<T>()), ">() on a ", dtype_name(dtype()),
            " tensor");
  return static_cast<T*>(data_ptr());
}
template float* Tensor::data<float>() const;
template double* Tensor::data<double>() const;
template int32_t* Tensor::data<int32_t>() const;
template uint16_t* Tensor::data<uint16_t>() const;
template bf16* Tensor::data<bf16>() const;

bool Tensor::shares_storage(const Tensor& o) const {
  return defined() && o.defined() && impl().storage == o.impl().storage;
}

Tensor& Tensor::set_requires_grad(bool r) {
  NDT_CHECK(is_leaf(), "set_requires_grad: only leaf tensors (not results of ops) can be marked");
  NDT_CHECK(!r || is_floating(dtype()), "set_requires_grad: a ", dtype_name(dtype()),
            " tensor cannot require gradients");
  impl().requires_grad = r;
  return *this;
}

// ---- views ------------------------------------------------------------------------

Tensor Tensor::view(const Shape& shape_in) const {
  Shape shape = shape_in;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      NDT_CHECK(infer < 0, "view: more than one -1 in ", ndt::shape_str(shape_in));
      infer = static_cast<int64_t>(i);
    } else {
      NDT_CHECK(shape[i] >= 0, "view: bad shape ", ndt::shape_str(shape_in));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    NDT_CHECK(known > 0 && numel() % known == 0, "view: cannot view ", this->shape_str(), " as ",
              ndt::shape_str(shape_in));
    shape[infer] = numel() / known;
  }
  NDT_CHECK(numel_of(shape) == numel(), "view: shape ", ndt::shape_str(shape_in), " has ", numel_of(shape),
            " elements but the tensor ", this->shape_str(), " has ", numel());
  NDT_CHECK(is_contiguous(), "view: cannot view tensor ", this->shape_str(), " with strides ",
            ndt::shape_str(strides()), " as ", ndt::shape_str(shape_in),
            ": it is not contiguous; call contiguous() or reshape()");
  return make_view(*this, shape, contiguous_strides(shape), offset());
}

Tensor Tensor::reshape(const Shape& shape) const {
  return is_contiguous() ? view(shape) : contiguous().view(shape);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim(), "narrow");
  NDT_CHECK(start >= 0 && length >= 0 && start + length <= shape()[d], "narrow: [", start, ", ",
            start + length, ") out of range for dim ", d, " of ", this->shape_str());
  Shape sh = shape();
  sh[d] = length;
  return make_view(*this, sh, strides(), offset() + start * strides()[d]);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  NDT_CHECK(index >= 0 && index < shape()[d], "select: index ", index, " out of range for dim ", d, " of ",
            this->shape_str());
  Shape sh = shape(), st = strides();
  int64_t off = offset() + index * st[d];
  sh.erase(sh.begin() + d);
  st.erase(st.begin() + d);
  return make_view(*this, sh, st, off);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  d0 = wrap_dim(d0, dim(), "transpose");
  d1 = wrap_dim(d1, dim(), "transpose");
  Shape sh = shape(), st = strides();
  std::swap(sh[d0], sh[d1]);
  std::swap(st[d0], st[d1]);
  return make_view(*this, sh, st, offset());
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  NDT_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: ", dims.size(), " dims given for a ", dim(),
            "-D tensor");
  Shape sh(dims.size()), st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim(), "permute");
    NDT_CHECK(!seen[d], "permute: dim ", d, " repeated");
    seen[d] = true;
    sh[i] = shape()[d];
    st[i] = strides()[d];
  }
  return make_view(*this, sh, st, offset());
}

Tensor Tensor::unsqueeze(int64_t d) const {
  NDT_CHECK(d >= 0 && d <= dim(), "unsqueeze: dim ", d, " out of range for ", this->shape_str());
  Shape sh = shape(), st = strides();
  int64_t s = d < dim() ? sh[d] * st[d] : 1;
  sh.insert(sh.begin() + d, 1);
  st.insert(st.begin() + d, s);
  return make_view(*this, sh, st, offset());
}

Tensor Tensor::detach() const { return make_view(*this, shape(), strides(), offset()); }

Tensor Tensor::view_at(int64_t off, const Shape& shape) const {
  NDT_CHECK(is_contiguous(), "view_at: the base tensor must be contiguous");
  NDT_CHECK(off >= 0 && off + numel_of(shape) <= numel(), "view_at: [", off, ", ", off + numel_of(shape),
            ") does not fit in a buffer of ", numel(), " elements");
  return make_view(*this, shape, contiguous_strides(shape), offset() + off);
}

// ---- copies -----------------------------------------------------------------------

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  kernels::copy(out, *this);
  return out;
}

Tensor Tensor::to(DType dt) const {
  if (dt == dtype()) return *this;
  Tensor out = empty(shape(), dt, device());
  kernels::copy(out, *this);
  return out;
}

Tensor Tensor::to(Device dev) const {
  if (dev == device()) return *this;
  Tensor src = contiguous();
  Tensor out = empty(shape(), dtype(), dev);
  if (nbytes() == 0) return out;
  if (dev.is_cuda() && src.device().is_cpu()) {
    cuda::memcpy(out.data_ptr(), src.data_ptr(), nbytes(), cuda::CopyKind::kHostToDevice, dev.index);
  } else if (dev.is_cpu() && src.device().is_cuda()) {
    cuda::memcpy(out.data_ptr(), src.data_ptr(), nbytes(), cuda::CopyKind::kDeviceToHost, src.device().index);
  } else {
    // GPU to GPU: through the host; peer copies are the job of the communicators.
    return src.to(Device::cpu()).to(dev);
  }
  return out;
}

void Tensor::copy_(const Tensor& src) const {
  NDT_CHECK(src.shape() == shape(), "copy_: source ", src.shape_str(), " does not match destination ",
            shape_str());
  if (src.device() == device()) {
    kernels::copy(*this, src);
  } else {
    kernels::copy(*this, src.to(device()));
  }
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = to(Device::cpu()).to(dtype_of<T>()).contiguous();
  std::vector<T> v(host.numel());
  if (!v.empty()) std::memcpy(v.data(), host.data_ptr(), v.size() * sizeof(T));
  return v;
}
template std::vector<float> Tensor::to_vector() const;
template std::vector<double> Tensor::to_vector() const;
template std::vector<int32_t> Tensor::to_vector() const;
template std::vector<uint16_t> Tensor::to_vector() const;

double Tensor::item() const {
  NDT_CHECK(numel() == 1, "item: tensor ", shape_str(), " has ", numel(), " elements, not 1");
  return to_vector<double>()[0];
}

// ---- printing ---------------------------------------------------------------------

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  os << "Tensor(" << dtype_name(t.dtype()) << t.shape_str() << " on " << t.device().str();
  if (t.requires_grad()) os << ", requires_grad";
  os << ")";
  if (t.numel() == 0) return os << " []";
  std::vector<double> v = t.to_vector<double>();
  const int64_t last = t.dim() == 0 ? 1 : t.shape().back();
  const int64_t rows = static_cast<int64_t>(v.size()) / last;
  const int64_t kEdge = 3;
  auto row = [&](int64_t r) {
    os << "\n  [";
    for (int64_t c = 0; c < last; ++c) {
      if (last > 2 * kEdge && c == kEdge) {
        os << " ...";
        c = last - kEdge;
      }
      os << (c ? ", " : "") << std::setprecision(5) << v[r * last + c];
    }
    os << "]";
  };
  for (int64_t r = 0; r < rows; ++r) {
    if (rows > 2 * kEdge && r == kEdge) {
      os << "\n  ... (" << rows - 2 * kEdge << " more rows)";
      r = rows - kEdge;
    }
    row(r);
  }
  return os;
}

}  // namespace ndt
