// Tensor, dtypes, devices, views, copies, printing, memory accounting, error messages, the
// counter-based RNG and the CPU threads' defaults.
#include <gtest/gtest.h>

#include "support/launch.h"
#include "support/testing.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "autograd/ops.h"
#include "tensor/cuda/runtime.h"
#include "tensor/kernels.h"
#include "tensor/rng.h"
#include "tensor/tensor.h"
#include "tensor/threads.h"

using namespace ndt;
using ndt::testing::error_of;

namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t to_bf16_bits(uint32_t float_bits_in) { return float_to_bf16(bits_float(float_bits_in)).bits; }

// 0, 1, 2, ... as f32 in `shape`
Tensor arange(const Shape& shape) {
  std::vector<float> v(numel_of(shape));
  std::iota(v.begin(), v.end(), 0.0f);
  return Tensor::from_vector<float>(v, shape);
}

#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "'" << (haystack) << "' lacks '" << (needle) << "'"

}  // namespace

// ---- dtypes and devices ------------------------------------------------------------------

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::u16), 2u);
  for (DType t : {DType::f32, DType::bf16, DType::f64, DType::i32, DType::u16})
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t) << dtype_name(t);
  EXPECT_STREQ(dtype_name(DType::f32), "float32");
  EXPECT_STREQ(dtype_name(DType::bf16), "bfloat16");
  EXPECT_EQ(dtype_from_name("bf16"), DType::bf16);
  EXPECT_EQ(dtype_from_name("f64"), DType::f64);
  EXPECT_CONTAINS(error_of([] { dtype_from_name("float16"); }), "float16");
  EXPECT_TRUE(is_floating(DType::bf16));
  EXPECT_FALSE(is_floating(DType::i32));
  EXPECT_EQ(sizeof(bf16), 2u);
}

TEST(Bf16, RoundToNearestEven) {
  EXPECT_EQ(to_bf16_bits(0x3F800000u), 0x3F80);  // 1.0 exact
  EXPECT_EQ(to_bf16_bits(0x3F808000u), 0x3F80);  // 1 + 2^-8: tie, 0x3F80 is even -> down
  EXPECT_EQ(to_bf16_bits(0x3F818000u), 0x3F82);  // 1 + 3*2^-8: tie, 0x3F81 is odd -> up
  EXPECT_EQ(to_bf16_bits(0x3F808001u), 0x3F81);  // just above the tie -> up
  EXPECT_EQ(to_bf16_bits(0x3F807FFFu), 0x3F80);  // just below the tie -> down
  EXPECT_EQ(to_bf16_bits(0xBF818000u), 0xBF82);  // negative tie to even
  EXPECT_EQ(to_bf16_bits(0x3F80FFFFu), 0x3F81);
  EXPECT_EQ(to_bf16_bits(0x3F7FFFFFu), 0x3F80);  // carries into the exponent
  EXPECT_EQ(to_bf16_bits(0x7F7FFFFFu), 0x7F80);  // FLT_MAX rounds to +inf
  EXPECT_EQ(to_bf16_bits(0x7F800000u), 0x7F80);  // +inf
  EXPECT_EQ(to_bf16_bits(0xFF800000u), 0xFF80);  // -inf
  EXPECT_EQ(to_bf16_bits(0x00000000u), 0x0000);
  EXPECT_EQ(to_bf16_bits(0x80000000u), 0x8000);  // -0 keeps its sign
  EXPECT_EQ(to_bf16_bits(0x00008000u), 0x0000);  // subnormal tie to even
  EXPECT_EQ(to_bf16_bits(0x00018000u), 0x0002);
  // NaN stays NaN, including a NaN whose payload lies only in the dropped bits
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu}) {
    const bf16 h = float_to_bf16(bits_float(nan));
    EXPECT_TRUE(std::isnan(bf16_to_float(h))) << std::hex << nan;
    EXPECT_EQ(h.bits & 0x8000, (nan >> 16) & 0x8000) << "sign kept";
  }
  // every bf16 value converts to float and back unchanged
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16_to_float(bf16{static_cast<uint16_t>(b)});
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f).bits, b) << std::hex << b;
  }
}

TEST(Device, Parse) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  const Device d = Device::parse("cuda:3");
  EXPECT_TRUE(d.is_cuda());
  EXPECT_EQ(d.index, 3);
  EXPECT_EQ(d.str(), "cuda:3");
  EXPECT_EQ(Device::parse(Device::cuda(12).str()), Device::cuda(12));
  EXPECT_NE(Device::cuda(0), Device::cuda(1));
  EXPECT_NE(Device::cpu(), Device::cuda(0));
  for (const char* bad : {"gpu", "", "CPU", "cuda:", "cuda:x", "cuda:-1", "cuda:1:2", "cuda:+1", "cuda1",
                          "cuda:99999999999999999999"}) {
    const std::string msg = error_of([&] { Device::parse(bad); });
    EXPECT_CONTAINS(msg, std::string("'") + bad + "'");
    EXPECT_CONTAINS(msg, "cuda:N");
  }
}

// ---- views ----------------------------------------------------------------------------

TEST(Views, NarrowSelectShareStorageAndIndex) {
  Tensor x = arange({2, 3, 4});
  Tensor n = x.narrow(1, 1, 2);  // (2,2,4): x[:, 1:3, :]
  EXPECT_EQ(n.shape(), (Shape{2, 2, 4}));
  EXPECT_TRUE(n.shares_storage(x));
  EXPECT_FALSE(n.is_contiguous());
  std::vector<float> expect;
  for (int i = 0; i < 2; ++i)
    for (int j = 1; j < 3; ++j)
      for (int k = 0; k < 4; ++k) expect.push_back(i * 12 + j * 4 + k);
  EXPECT_EQ(n.to_vector<float>(), expect);

  Tensor s = x.select(2, 1);  // (2,3): x[:, :, 1]
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_TRUE(s.shares_storage(x));
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1, 5, 9, 13, 17, 21}));
  EXPECT_EQ(x.select(0, 1).select(0, 2).to_vector<float>(), (std::vector<float>{20, 21, 22, 23}));
  EXPECT_EQ(x.narrow(-1, 3, 1).select(-1, 0).to_vector<float>(), (std::vector<float>{3, 7, 11, 15, 19, 23}));

  // writing through a view changes the base
  kernels::fill(n, -1.0);
  std::vector<float> v = x.to_vector<float>();
  for (int i = 0; i < 24; ++i) EXPECT_EQ(v[i], (i % 12) >= 4 ? -1.0f : static_cast<float>(i)) << i;

  EXPECT_CONTAINS(error_of([&] { x.narrow(1, 2, 2); }), "(2, 3, 4)");
  EXPECT_CONTAINS(error_of([&] { x.select(0, 2); }), "(2, 3, 4)");
  EXPECT_CONTAINS(error_of([&] { x.narrow(3, 0, 1); }), "out of range");
}

TEST(Views, TransposePermuteUnsqueeze) {
  Tensor x = arange({2, 3, 4});
  Tensor t = x.transpose(0, 2);  // (4,3,2), t[k][j][i] = x[i][j][k]
  EXPECT_EQ(t.shape(), (Shape{4, 3, 2}));
  EXPECT_TRUE(t.shares_storage(x));
  EXPECT_FALSE(t.is_contiguous());
  std::vector<float> tv = t.to_vector<float>();
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 3; ++j)
      for (int i = 0; i < 2; ++i) EXPECT_EQ(tv[k * 6 + j * 2 + i], i * 12 + j * 4 + k);

  Tensor p = x.permute({1, 2, 0});  // (3,4,2), p[j][k][i] = x[i][j][k]
  EXPECT_EQ(p.shape(), (Shape{3, 4, 2}));
  EXPECT_TRUE(p.shares_storage(x));
  std::vector<float> pv = p.to_vector<float>();
  for (int j = 0; j < 3; ++j)
    for (int k = 0; k < 4; ++k)
      for (int i = 0; i < 2; ++i) EXPECT_EQ(pv[j * 8 + k * 2 + i], i * 12 + j * 4 + k);
  EXPECT_EQ(x.permute({0, 1, 2}).to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(x.permute({2, 0, 1}).permute({1, 2, 0}).to_vector<float>(), x.to_vector<float>());
  EXPECT_CONTAINS(error_of([&] { x.permute({0, 0, 1}); }), "repeated");
  EXPECT_CONTAINS(error_of([&] { x.permute({0, 1}); }), "permute");

  for (int64_t d = 0; d <= 3; ++d) {
    Tensor u = x.unsqueeze(d);
    Shape expect = {2, 3, 4};
    expect.insert(expect.begin() + d, 1);
    EXPECT_EQ(u.shape(), expect);
    EXPECT_TRUE(u.is_contiguous());
    EXPECT_TRUE(u.shares_storage(x));
    EXPECT_EQ(u.to_vector<float>(), x.to_vector<float>());
  }
  // unsqueeze of a transposed view indexes like its base
  EXPECT_EQ(t.unsqueeze(1).to_vector<float>(), tv);
}

TEST(Views, ViewAtIsAParameterInsideAFlatBuffer) {
  Tensor buf = Tensor::zeros({40});
  Tensor w = buf.view_at(5, {3, 4});
  Tensor b = buf.view_at(17, {4});
  EXPECT_TRUE(w.shares_storage(buf));
  EXPECT_TRUE(w.is_contiguous());
  kernels::fill(w, 2.0);
  kernels::fill(b, 3.0);
  std::vector<float> v = buf.to_vector<float>();
  for (int i = 0; i < 40; ++i)
    EXPECT_EQ(v[i], i >= 5 && i < 17 ? 2.0f : (i >= 17 && i < 21 ? 3.0f : 0.0f)) << i;
  // a view_at of a view_at is relative to the inner view
  Tensor inner = buf.view_at(10, {20}).view_at(2, {2});
  kernels::fill(inner, 7.0);
  EXPECT_EQ(buf.to_vector<float>()[12], 7.0f);
  EXPECT_EQ(buf.to_vector<float>()[13], 7.0f);
  EXPECT_CONTAINS(error_of([&] { buf.view_at(38, {3}); }), "40");
  EXPECT_CONTAINS(error_of([&] { buf.view({4, 10}).transpose(0, 1).view_at(0, {2}); }), "contiguous");
}

TEST(Views, ViewReshapesContiguousAndRefusesStrided) {
  Tensor x = arange({2, 3, 4});
  Tensor v = x.view({6, -1});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
  EXPECT_TRUE(v.shares_storage(x));
  EXPECT_EQ(v.to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(x.view({-1}).shape(), (Shape{24}));
  EXPECT_CONTAINS(error_of([&] { x.view({5, 5}); }), "(5, 5)");
  EXPECT_CONTAINS(error_of([&] { x.view({-1, -1}); }), "-1");

  Tensor t = x.transpose(1, 2);  // (2,4,3), not contiguous
  const std::string msg = error_of([&] { t.view({8, 3}); });
  EXPECT_CONTAINS(msg, "view");
  EXPECT_CONTAINS(msg, "(2, 4, 3)");  // the tensor's shape
  EXPECT_CONTAINS(msg, "(8, 3)");     // the requested shape
  EXPECT_CONTAINS(msg, "contiguous");
  // reshape copies instead
  Tensor r = t.reshape({8, 3});
  EXPECT_FALSE(r.shares_storage(x));
  EXPECT_EQ(r.to_vector<float>(), t.to_vector<float>());
  // a narrow along the first dim stays contiguous and can be viewed
  Tensor n = x.narrow(0, 1, 1).view({12});
  EXPECT_TRUE(n.shares_storage(x));
  EXPECT_EQ(n.to_vector<float>()[0], 12.0f);
}

// ---- copies ----------------------------------------------------------------------------

TEST(Copies, ContiguousCloneAndDtypes) {
  Tensor x = arange({3, 4});
  EXPECT_TRUE(x.contiguous().same(x));  // already contiguous: no copy
  Tensor t = x.transpose(0, 1);
  Tensor c = t.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.shares_storage(x));
  EXPECT_EQ(c.shape(), (Shape{4, 3}));
  EXPECT_EQ(c.to_vector<float>(), t.to_vector<float>());
  EXPECT_EQ(c.to_vector<float>()[1], 4.0f);  // c[0][1] = x[1][0]

  Tensor k = x.clone();
  EXPECT_FALSE(k.shares_storage(x));
  kernels::fill(k, 0.0);
  EXPECT_EQ(x.to_vector<float>()[5], 5.0f);  // the clone is independent

  EXPECT_TRUE(x.to(DType::f32).same(x));
  Tensor d = x.to(DType::f64);
  EXPECT_EQ(d.dtype(), DType::f64);
  EXPECT_EQ(d.to_vector<double>()[7], 7.0);
  EXPECT_EQ(d.to(DType::f32).to_vector<float>(), x.to_vector<float>());
  // a strided source converts element by element
  EXPECT_EQ(t.to(DType::f64).to_vector<double>(), c.to(DType::f64).to_vector<double>());
}

TEST(Copies, ToBf16RoundsToNearestEven) {
  std::vector<float> v = {1.0f,
                          bits_float(0x3F808000u),
                          bits_float(0x3F818000u),
                          bits_float(0x3F808001u),
                          -2.5f,
                          1e-3f,
                          3.14159265f,
                          65504.0f,
                          -0.0f};
  Tensor x = Tensor::from_vector<float>(v, {3, 3});
  Tensor h = x.to(DType::bf16);
  EXPECT_EQ(h.dtype(), DType::bf16);
  EXPECT_EQ(h.nbytes(), 18u);
  const bf16* p = h.data<bf16>();
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(p[i].bits, float_to_bf16(v[i]).bits) << i;
  std::vector<float> back = h.to_vector<float>();
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(back[i], bf16_to_float(float_to_bf16(v[i]))) << i;
  // from a transposed view too
  Tensor ht = x.transpose(0, 1).to(DType::bf16);
  EXPECT_EQ(ht.to_vector<float>()[1], bf16_to_float(float_to_bf16(v[3])));
  // f64 -> bf16 rounds once: 1 + 2^-8 + 2^-40 is above the tie, so it rounds up
  // (rounding to f32 first would land exactly on the tie and then round down to 1.0)
  Tensor d = Tensor::from_vector<double>(
      {1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40), 1.0 + std::ldexp(1.0, -8),
       -(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40))},
      {3});
  const bf16* pd = d.to(DType::bf16).data<bf16>();
  EXPECT_EQ(pd[0].bits, 0x3F81);
  EXPECT_EQ(pd[1].bits, 0x3F80);
  EXPECT_EQ(pd[2].bits, 0xBF81);
  EXPECT_EQ(
      Tensor::full({1}, 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40), DType::bf16).data<bf16>()[0].bits,
      0x3F81);
}

TEST(Copies, CopyIntoStridedDestinationConverts) {
  Tensor dst = Tensor::zeros({4, 3}, DType::f64);
  Tensor src = arange({3, 4});
  dst.transpose(0, 1).copy_(src);  // dst^T = src
  std::vector<double> v = dst.to_vector<double>();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(v[i * 3 + j], j * 4 + i);
  EXPECT_CONTAINS(error_of([&] { dst.copy_(src); }), "(3, 4)");
}

// Any view into any view, any dtype pair: the copy kernel merges the dimensions both sides
// step through as one and walks the rest row by row (several threads for large ones); every
// element lands where the element-by-element definition puts it. Values 0..255 are exact in
// every dtype, so the comparison is exact.
double element(const Tensor& t, const std::vector<int64_t>& index) {
  int64_t off = 0;
  for (size_t d = 0; d < index.size(); ++d) off += index[d] * t.strides()[d];
  switch (t.dtype()) {
    case DType::f32:
      return static_cast<const float*>(t.data_ptr())[off];
    case DType::f64:
      return static_cast<const double*>(t.data_ptr())[off];
    case DType::bf16:
      return bf16_to_float(static_cast<const bf16*>(t.data_ptr())[off]);
    default:
      ADD_FAILURE() << "dtype";
      return 0;
  }
}
TEST(Copies, EveryViewIntoEveryViewCopiesElementByElement) {
  std::mt19937 rng(11);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  // a view of a fresh buffer: its dims permuted, one of them narrowed, size-1 dims kept
  auto view_of = [&](const Shape& shape, DType dt, bool fill) {
    const int64_t nd = static_cast<int64_t>(shape.size());
    std::vector<int64_t> perm(static_cast<size_t>(nd));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    Shape outer(static_cast<size_t>(nd));  // the buffer's shape: shape permuted, one dim wider
    for (int64_t d = 0; d < nd; ++d) outer[static_cast<size_t>(d)] = shape[static_cast<size_t>(perm[d])];
    const int64_t wide = pick(0, nd - 1), extra = pick(0, 2);
    outer[static_cast<size_t>(wide)] += extra;
    Tensor buf = Tensor::empty(outer, DType::f32);
    std::vector<float> v(static_cast<size_t>(buf.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = fill ? static_cast<float>((i * 37) % 256) : -1.0f;
    buf = Tensor::from_vector(v, outer).to(dt);
    Tensor t = buf.narrow(wide, pick(0, extra), outer[static_cast<size_t>(wide)] - extra);
    std::vector<int64_t> inverse(static_cast<size_t>(nd));
    for (int64_t d = 0; d < nd; ++d) inverse[static_cast<size_t>(perm[d])] = d;
    return t.permute(inverse);
  };
  const std::vector<std::pair<DType, DType>> pairs = {{DType::f32, DType::f32},  {DType::bf16, DType::bf16},
                                                      {DType::f32, DType::bf16}, {DType::bf16, DType::f32},
                                                      {DType::f64, DType::f32},  {DType::f32, DType::f64}};
  for (int trial = 0; trial < 120; ++trial) {
    Shape shape;
    for (int64_t d = 0, rank = pick(1, 4); d < rank; ++d) shape.push_back(pick(1, 7));
    if (trial % 10 == 0) shape = {40, 33, pick(17, 30)};  // over the threads' threshold
    const int64_t nd = static_cast<int64_t>(shape.size());
    const auto [src_dt, dst_dt] = pairs[static_cast<size_t>(trial) % pairs.size()];
    const Tensor src = view_of(shape, src_dt, true);
    const Tensor dst = trial % 3 == 0 ? Tensor::full(shape, -1.0, dst_dt) : view_of(shape, dst_dt, false);
    ASSERT_EQ(src.shape(), shape);
    kernels::copy(dst, src);
    std::vector<int64_t> index(static_cast<size_t>(nd), 0);
    for (int64_t i = 0; i < src.numel(); ++i) {
      ASSERT_EQ(element(dst, index), element(src, index)) << "trial " << trial << " element " << i;
      for (int64_t d = nd - 1; d >= 0 && ++index[static_cast<size_t>(d)] == shape[static_cast<size_t>(d)];
           --d)
        index[static_cast<size_t>(d)] = 0;
    }
  }
}

// Overlapping source and destination in one storage: the result is that of reading all of
// the source first (memmove), whatever the strides and dtypes.
TEST(Copies, OverlappingCopiesBehaveLikeMemmove) {
  Tensor buf = arange({10});
  buf.narrow(0, 1, 9).copy_(buf.narrow(0, 0, 9));  // shift right by one, contiguous
  EXPECT_EQ(buf.to_vector<float>(), (std::vector<float>{0, 0, 1, 2, 3, 4, 5, 6, 7, 8}));
  buf = arange({10});
  buf.narrow(0, 0, 9).copy_(buf.narrow(0, 1, 9));  // shift left
  EXPECT_EQ(buf.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 9}));

  Tensor t = arange({4, 4});
  t.copy_(t.transpose(0, 1));  // in-place transpose: every element read before written
  std::vector<float> v = t.to_vector<float>();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(v[i * 4 + j], j * 4 + i) << i << "," << j;

  Tensor r = arange({3, 4});  // strided overlap: column k+1 = column k, k = 0..2
  r.narrow(1, 1, 3).copy_(r.narrow(1, 0, 3));
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{0, 0, 1, 2, 4, 4, 5, 6, 8, 8, 9, 10}));

  Tensor same = arange({5});
  same.copy_(same);  // the same view: unchanged
  EXPECT_EQ(same.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4}));
}

// Every kernel but fill and copy takes dense tensors; a strided view is refused by name
// rather than read as the wrong numbers.
TEST(Errors, StridedInputsToDenseKernelsAreRefused) {
  Tensor x = arange({4, 6}).transpose(0, 1);  // (6, 4), strided
  Tensor w = Tensor::full({4}, 1.0), b = Tensor::zeros({4});
  Tensor out = Tensor::empty({6, 4}), mean = Tensor::empty({6}), rstd = Tensor::empty({6});
  std::string e = error_of([&] { kernels::layernorm_forward(x, w, b, 1e-5, out, mean, rstd); });
  EXPECT_CONTAINS(e, "layernorm_forward");
  EXPECT_CONTAINS(e, "not contiguous");
  EXPECT_CONTAINS(e, "(6, 4)");
  Tensor c = Tensor::empty({6, 6});
  EXPECT_CONTAINS(error_of([&] { kernels::gemm(x, false, arange({4, 6}), false, c); }), "gemm");
  EXPECT_CONTAINS(error_of([&] {
                    kernels::scale(x, 2.0, Tensor::empty({6, 4}).transpose(0, 1));
                  }),
                  "not contiguous");
  // the same data made contiguous is accepted
  kernels::layernorm_forward(x.contiguous(), w, b, 1e-5, out, mean, rstd);
}

// The fused residual add + LayerNorm is add followed by layernorm, bit for bit, and its
// backward with the residual's gradient is the LayerNorm's dx plus that gradient.
TEST(Copies, AddLayernormIsAddThenLayernormBitForBit) {
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    Tensor a = arange({6, 10}).to(dt), b = Tensor::empty({6, 10}, dt), w = Tensor::empty({10}, dt),
           bias = Tensor::empty({10}, dt);
    kernels::scale(a, 0.37, a);
    kernels::fill_normal(b, 1, 2, 0, 0.0f, 1.0f);
    kernels::fill_normal(w, 1, 3, 0, 1.0f, 0.5f);
    kernels::fill_normal(bias, 1, 4, 0, 0.0f, 0.5f);
    const DType sd = dt == DType::f64 ? DType::f64 : DType::f32;
    Tensor sum = Tensor::empty({6, 10}, dt), out = Tensor::empty({6, 10}, dt), mean = Tensor::empty({6}, sd),
           rstd = Tensor::empty({6}, sd);
    kernels::add_layernorm_forward(a, b, w, bias, 1e-5, sum, out, mean, rstd);
    Tensor sum2 = Tensor::empty({6, 10}, dt), out2 = Tensor::empty({6, 10}, dt),
           mean2 = Tensor::empty({6}, sd), rstd2 = Tensor::empty({6}, sd);
    kernels::add(a, b, sum2);
    kernels::layernorm_forward(sum2, w, bias, 1e-5, out2, mean2, rstd2);
    EXPECT_EQ(sum.to_vector<double>(), sum2.to_vector<double>()) << dtype_name(dt);
    EXPECT_EQ(out.to_vector<double>(), out2.to_vector<double>()) << dtype_name(dt);
    EXPECT_EQ(rstd.to_vector<double>(), rstd2.to_vector<double>()) << dtype_name(dt);

    Tensor dout = Tensor::empty({6, 10}, dt), dres = Tensor::empty({6, 10}, dt);
    kernels::fill_normal(dout, 1, 5, 0, 0.0f, 1.0f);
    kernels::fill_normal(dres, 1, 6, 0, 0.0f, 1.0f);
    Tensor dx = Tensor::empty({6, 10}, dt), dw = Tensor::empty({10}, dt), db = Tensor::empty({10}, dt);
    kernels::layernorm_backward(dout, sum, w, mean, rstd, dx, dw, db, dres);
    Tensor dx2 = Tensor::empty({6, 10}, dt), dw2 = Tensor::empty({10}, dt), db2 = Tensor::empty({10}, dt);
    kernels::layernorm_backward(dout, sum, w, mean, rstd, dx2, dw2, db2);
    std::vector<double> g = dx.to_vector<double>(), g2 = dx2.to_vector<double>(),
                        r = dres.to_vector<double>();
    const double tol = dt == DType::bf16 ? 2e-2 : dt == DType::f32 ? 1e-6 : 1e-14;
    for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], g2[i] + r[i], tol * (1 + std::fabs(g[i]))) << i;
    EXPECT_EQ(dw.to_vector<double>(), dw2.to_vector<double>());
  }
}

// Large LayerNorms (several threads, rows longer than the vector lanes, column blocks with a
// tail) in f32 and bf16 against the f64 kernel on the same values.
TEST(Copies, LayerNormRowsOnThreadsMatchF64) {
  const int64_t N = 300, C = 97;  // N C over the threads' threshold; 97 = 64 + 33 columns
  Tensor x = Tensor::empty({N, C}, DType::f64), w = Tensor::empty({C}, DType::f64),
         bias = Tensor::empty({C}, DType::f64), dout = Tensor::empty({N, C}, DType::f64),
         dres = Tensor::empty({N, C}, DType::f64);
  kernels::fill_normal(x, 1, 7, 0, 0.5f, 2.0f);
  kernels::fill_normal(w, 1, 8, 0, 1.0f, 0.5f);
  kernels::fill_normal(bias, 1, 9, 0, 0.0f, 0.5f);
  kernels::fill_normal(dout, 1, 10, 0, 0.0f, 1.0f);
  kernels::fill_normal(dres, 1, 11, 0, 0.0f, 1.0f);
  struct Run {
    std::vector<double> out, mean, rstd, dx, dw, db;
  };
  auto run = [&](DType dt) {
    const DType sd = dt == DType::f64 ? DType::f64 : DType::f32;
    // the inputs rounded to dt first, so that f64 sees the same values
    Tensor xd = x.to(dt), wd = w.to(dt), bd = bias.to(dt), dd = dout.to(dt), rd = dres.to(dt);
    auto wide = [](const Tensor& t) { return t.to(DType::f64); };
    Tensor out = Tensor::empty({N, C}, dt), mean = Tensor::empty({N}, sd), rstd = Tensor::empty({N}, sd);
    Tensor dx = Tensor::empty({N, C}, dt), dw = Tensor::empty({C}, dt), db = Tensor::empty({C}, dt);
    kernels::layernorm_forward(xd, wd, bd, 1e-5, out, mean, rstd);
    kernels::layernorm_backward(dd, xd, wd, mean, rstd, dx, dw, db, rd);
    Run low{wide(out).to_vector<double>(), wide(mean).to_vector<double>(), wide(rstd).to_vector<double>(),
            wide(dx).to_vector<double>(),  wide(dw).to_vector<double>(),   wide(db).to_vector<double>()};
    // f64 on the values dt holds
    Tensor x64 = wide(xd), w64 = wide(wd), b64 = wide(bd), d64 = wide(dd), r64 = wide(rd);
    Tensor o = Tensor::empty({N, C}, DType::f64), m = Tensor::empty({N}, DType::f64),
           r = Tensor::empty({N}, DType::f64), gx = Tensor::empty({N, C}, DType::f64),
           gw = Tensor::empty({C}, DType::f64), gb = Tensor::empty({C}, DType::f64);
    kernels::layernorm_forward(x64, w64, b64, 1e-5, o, m, r);
    kernels::layernorm_backward(d64, x64, w64, m, r, gx, gw, gb, r64);
    Run ref{o.to_vector<double>(),  m.to_vector<double>(),  r.to_vector<double>(),
            gx.to_vector<double>(), gw.to_vector<double>(), gb.to_vector<double>()};
    return std::make_pair(low, ref);
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const auto [got, want] = run(dt);
    // f32: sums of 97 (rows) or 300 (columns) terms; bf16: one rounding of the result
    const double tol = dt == DType::f32 ? 2e-5 : 1e-2;
    auto near = [&](const std::vector<double>& a, const std::vector<double>& b, double scale,
                    const char* what) {
      ASSERT_EQ(a.size(), b.size()) << what;
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, std::fabs(a[i] - b[i]) / (scale + std::fabs(b[i])));
      EXPECT_LT(worst, tol) << what;
    };
    near(got.out, want.out, 1, "out");
    near(got.mean, want.mean, 1, "mean");
    near(got.rstd, want.rstd, 0, "rstd");
    near(got.dx, want.dx, 1, "dx");
    near(got.dw, want.dw, 10, "dw");  // a sum over 300 rows
    near(got.db, want.db, 10, "db");
  }
}

// sum and sum_squares over many blocks: near the exact sum in every dtype, and the same bits
// on one thread as on three (the blocks' sums are added in order, not as threads finish).
// add, add_ and mul in f32 and bf16 (vector loops, bf16 a block at a time) give the bits of
// the element-by-element formula in float, rounded once: same shapes over the threads'
// threshold, and a row vector broadcast over rows.
TEST(Copies, AddAndMulVectorLoopsGiveTheFormulasBits) {
  const int64_t R = 301, C = 257;  // R C over the threads' threshold; C not a block multiple
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = Tensor::empty({R, C}, dt), b = Tensor::empty({R, C}, dt), row = Tensor::empty({C}, dt);
    kernels::fill_normal(a, 1, 13, 0, 0.0f, 1.0f);
    kernels::fill_normal(b, 1, 14, 0, 0.5f, 2.0f);
    kernels::fill_normal(row, 1, 15, 0, 0.0f, 1.0f);
    const std::vector<float> va = a.to(DType::f32).to_vector<float>(),
                             vb = b.to(DType::f32).to_vector<float>(),
                             vr = row.to(DType::f32).to_vector<float>();
    auto rounded = [&](float v) { return dt == DType::bf16 ? bf16_to_float(float_to_bf16(v)) : v; };
    const float al = 0.75f, be = -1.25f;
    Tensor sum = Tensor::empty({R, C}, dt), bsum = Tensor::empty({R, C}, dt),
           prod = Tensor::empty({R, C}, dt), acc = a.to(dt);
    kernels::add(a, b, sum, al, be);
    kernels::add(a, row, bsum, 1.0, 1.0);
    kernels::mul(a, b, prod);
    kernels::add_(acc, b, al);
    const std::vector<float> s = sum.to(DType::f32).to_vector<float>(),
                             bs = bsum.to(DType::f32).to_vector<float>(),
                             p = prod.to(DType::f32).to_vector<float>(),
                             ac = acc.to(DType::f32).to_vector<float>();
    int wrong = 0;
    for (int64_t i = 0; i < R * C; ++i) {
      wrong += s[i] != rounded(al * va[i] + be * vb[i]);
      wrong += bs[i] != rounded(va[i] + vr[i % C]);
      wrong += p[i] != rounded(va[i] * vb[i]);
      wrong += ac[i] != rounded(va[i] + al * vb[i]);
    }
    EXPECT_EQ(wrong, 0);
  }
}

// sum_rows (a bias's gradient) sums each column's rows in order, in float, whatever the
// threads' slices of columns: the bits of the plain loop, rounded once.
TEST(Copies, SumRowsIsEachColumnInOrder) {
  const int64_t R = 301, C = 1043;  // over the threads' threshold; slices of 512 and a tail
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = Tensor::empty({R, C}, dt), out = Tensor::empty({C}, dt);
    kernels::fill_normal(x, 1, 16, 0, 0.1f, 1.0f);
    kernels::sum_rows(x, out);
    const std::vector<float> v = x.to(DType::f32).to_vector<float>(),
                             got = out.to(DType::f32).to_vector<float>();
    int wrong = 0;
    for (int64_t j = 0; j < C; ++j) {
      float acc = 0;
      for (int64_t r = 0; r < R; ++r) acc += v[r * C + j];
      wrong += got[j] != (dt == DType::bf16 ? bf16_to_float(float_to_bf16(acc)) : acc);
    }
    EXPECT_EQ(wrong, 0);
  }
}

TEST(Copies, SumsAreExactEnoughAndTheSameOnAnyNumberOfThreads) {
  const int64_t n = 3 * 8192 * 5 + 77;  // many blocks, over the threads' threshold, a tail
  Tensor x64 = Tensor::empty({n}, DType::f64);
  kernels::fill_normal(x64, 1, 12, 0, 0.3f, 1.0f);
  const int before = num_threads();
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = x64.to(dt);
    const std::vector<double> v = x.to_vector<double>();
    long double s = 0, q = 0;  // the exact sums of the values x holds, to ~1e-19
    for (const double e : v) {
      s += e;
      q += static_cast<long double>(e) * e;
    }
    std::vector<double> got;
    for (int threads : {1, 3}) {
      set_num_threads(threads);
      // the kernels write the sum rounded to x's dtype
      Tensor so = Tensor::empty({}, dt), qo = Tensor::empty({}, dt);
      kernels::sum(x, so);
      kernels::sum_squares(x, qo);
      got.push_back(so.item());
      got.push_back(qo.item());
    }
    set_num_threads(before);
    EXPECT_EQ(got[0], got[2]) << "sum: 1 thread against 3";
    EXPECT_EQ(got[1], got[3]) << "sum_squares: 1 thread against 3";
    const double tol = dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 1e-6 : 1e-2;  // the result's rounding
    EXPECT_NEAR(got[0], static_cast<double>(s), tol * static_cast<double>(q)) << "sum";
    EXPECT_NEAR(got[1], static_cast<double>(q), tol * static_cast<double>(q)) << "sum_squares";
  }
}

// ---- printing ---------------------------------------------------------------------------

TEST(Printing, ShowsDtypeShapeAndValues) {
  std::ostringstream os;
  os << Tensor::from_vector<float>({1.5f, 2, 3, 4, 5, 6}, {2, 3});
  const std::string s = os.str();
  EXPECT_CONTAINS(s, "float32");
  EXPECT_CONTAINS(s, "(2, 3)");
  EXPECT_CONTAINS(s, "cpu");
  EXPECT_CONTAINS(s, "1.5");
  EXPECT_CONTAINS(s, "6");
  EXPECT_EQ(s.find("..."), std::string::npos);

  std::ostringstream og;
  og << Tensor::zeros({2}, DType::f64).set_requires_grad(true) << " " << Tensor();
  EXPECT_CONTAINS(og.str(), "float64");
  EXPECT_CONTAINS(og.str(), "requires_grad");
  EXPECT_CONTAINS(og.str(), "undefined");
}

TEST(Printing, ElidesLargeTensors) {
  Tensor big = arange({1000, 1000});
  std::ostringstream os;
  os << big;
  const std::string s = os.str();
  EXPECT_CONTAINS(s, "(1000, 1000)");
  EXPECT_CONTAINS(s, "...");
  EXPECT_CONTAINS(s, "994 more rows");
  EXPECT_LT(s.size(), 1000u) << "a million elements print as a short summary";
  // the first and last three rows and columns are shown, the middle elided
  std::ostringstream o10;
  o10 << arange({10, 10});
  const std::string s10 = o10.str();
  EXPECT_CONTAINS(s10, "4 more rows");
  EXPECT_CONTAINS(s10, "[0, 1, 2 ..., 7, 8, 9]");
  EXPECT_CONTAINS(s10, "[90, 91, 92 ..., 97, 98, 99]");
  EXPECT_EQ(s10.find("55"), std::string::npos);  // row 5 is elided
  EXPECT_EQ(s10.find("14"), std::string::npos);  // column 4 is elided
  std::ostringstream ob;
  ob << big.to(DType::bf16);
  EXPECT_CONTAINS(ob.str(), "bfloat16");
}

// ---- memory accounting ---------------------------------------------------------------------

TEST(Memory, InUseAndPeakFollowAllocations) {
  const Device cpu = Device::cpu();
  const int64_t base = memory_stats(cpu).in_use;
  reset_peak_memory(cpu);
  EXPECT_EQ(memory_stats(cpu).peak, base);
  const int64_t mb = 1 << 20;
  {
    Tensor a = Tensor::empty({mb / 4});  // 1 MiB
    EXPECT_EQ(memory_stats(cpu).in_use, base + mb);
    {
      Tensor b = Tensor::empty({mb / 2}, DType::f64);  // 4 MiB
      Tensor view = b.narrow(0, 10, 100);              // a view allocates nothing
      EXPECT_EQ(memory_stats(cpu).in_use, base + 5 * mb);
    }
    EXPECT_EQ(memory_stats(cpu).in_use, base + mb);
    EXPECT_EQ(memory_stats(cpu).peak, base + 5 * mb);
    Tensor small = Tensor::empty({3}, DType::bf16);  // rounded up to 64 bytes
    EXPECT_EQ(memory_stats(cpu).in_use, base + mb + 64);
  }
  EXPECT_EQ(memory_stats(cpu).in_use, base);
  EXPECT_EQ(memory_stats(cpu).peak, base + 5 * mb);
  EXPECT_GE(memory_stats(cpu).cached, 5 * mb);  // freed blocks wait in the cache
  reset_peak_memory(cpu);
  EXPECT_EQ(memory_stats(cpu).peak, base);
  {
    Tensor again = Tensor::empty({mb / 4});  // served from the cache, still counted
    EXPECT_EQ(memory_stats(cpu).in_use, base + mb);
  }
  empty_cache(cpu);
  EXPECT_EQ(memory_stats(cpu).cached, 0);
  EXPECT_EQ(memory_stats(cpu).in_use, base);
}

// Buffers whose sizes follow the data (a mixture of experts' routed rows) reuse freed blocks of
// nearby sizes: above 64 KiB a freed block serves any size up to 1/8 of a power of two around
// it, still counted at the size asked for; a size past its class gets a block of its own.
TEST(Memory, NearbySizesReuseAFreedBlock) {
  const Device cpu = Device::cpu();
  empty_cache(cpu);
  const int64_t base = memory_stats(cpu).in_use, mb = 1 << 20;
  const void* first = nullptr;
  {
    Tensor a = Tensor::empty({mb / 4 + 1000});  // 1 MiB and 4000 bytes: the class (1, 1 + 1/8] MiB
    first = a.data_ptr();
  }
  EXPECT_EQ(memory_stats(cpu).cached, mb + mb / 8);  // kept at its class's size
  {
    Tensor b = Tensor::empty({mb / 4 + 20000});  // 76000 bytes more: the same class
    EXPECT_EQ(b.data_ptr(), first);
    EXPECT_EQ(memory_stats(cpu).in_use, base + mb + 80000);  // counted as asked
    EXPECT_EQ(memory_stats(cpu).cached, 0);
    Tensor c = Tensor::empty({mb / 4 + mb / 16});  // past the class: a block of its own
    EXPECT_NE(c.data_ptr(), first);
  }
  Tensor small = Tensor::empty({1000});  // small sizes keep exact lists: no rounding up
  EXPECT_EQ(memory_stats(cpu).in_use, base + 4032);
  empty_cache(cpu);
}

// FSDP over a group of one rank: a released storage borrows another's memory (its views read
// it in place), counts none of it and, released again, leaves it to its owner; a storage that
// holds memory refuses to borrow.
TEST(Memory, ABorrowedStorageIsNeitherCountedNorFreed) {
  const Device cpu = Device::cpu();
  Tensor owner = Tensor::full({1000}, 2.5);
  const int64_t base = memory_stats(cpu).in_use;
  auto storage = std::make_shared<Storage>(1000 * sizeof(float), cpu, /*allocate=*/false);
  Storage& st = *storage;
  st.borrow(owner.data_ptr());
  EXPECT_TRUE(st.borrowed());
  EXPECT_EQ(st.data(), owner.data_ptr());
  EXPECT_EQ(memory_stats(cpu).in_use, base);
  static_cast<float*>(st.data())[7] = -1.0f;  // one memory: the owner sees it
  EXPECT_EQ(owner.to_vector<float>()[7], -1.0f);
  st.release();
  EXPECT_FALSE(st.allocated());
  EXPECT_FALSE(st.borrowed());
  EXPECT_EQ(memory_stats(cpu).in_use, base);
  EXPECT_EQ(owner.to_vector<float>()[8], 2.5f);  // the owner's memory is still there
  st.allocate();
  EXPECT_CONTAINS(error_of([&] { st.borrow(owner.data_ptr()); }), "holds memory");
}

// ---- error messages ------------------------------------------------------------------------

TEST(Errors, ShapeMismatchesNameTheOpAndShapes) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 5});
  std::string m = error_of([&] { matmul(a, b); });
  EXPECT_CONTAINS(m, "matmul");
  EXPECT_CONTAINS(m, "(2, 3)");
  EXPECT_CONTAINS(m, "(4, 5)");
  m = error_of([&] { matmul(Tensor::zeros({2, 3, 4, 5}), b); });
  EXPECT_CONTAINS(m, "matmul");
  EXPECT_CONTAINS(m, "(2, 3, 4, 5)");
  m = error_of([&] { matmul(Tensor::zeros({2, 3, 4}), Tensor::zeros({3, 4, 5})); });
  EXPECT_CONTAINS(m, "batch");
  EXPECT_CONTAINS(m, "(3, 4, 5)");
  m = error_of([&] { add(a, b); });
  EXPECT_CONTAINS(m, "add");
  EXPECT_CONTAINS(m, "(2, 3)");
  EXPECT_CONTAINS(m, "(4, 5)");
  m = error_of([&] { mul(a, Tensor::zeros({2})); });
  EXPECT_CONTAINS(m, "mul");
  EXPECT_CONTAINS(m, "(2)");
  m = error_of([&] { linear(Tensor::zeros({7, 12}), Tensor::zeros({10, 4}), Tensor()); });
  EXPECT_CONTAINS(m, "linear");
  EXPECT_CONTAINS(m, "(7, 12)");
  EXPECT_CONTAINS(m, "(10, 4)");
  m = error_of([&] { linear(Tensor::zeros({7, 12}), Tensor::zeros({12, 4}), Tensor::zeros({5})); });
  EXPECT_CONTAINS(m, "bias");
  EXPECT_CONTAINS(m, "(5)");
  m = error_of([&] { layernorm(Tensor::zeros({7, 12}), Tensor::zeros({11}), Tensor::zeros({12})); });
  EXPECT_CONTAINS(m, "layernorm");
  EXPECT_CONTAINS(m, "(11)");
  m = error_of([&] {
    attention(Tensor::zeros({1, 2, 5, 4}), Tensor::zeros({1, 2, 5, 3}), Tensor::zeros({1, 2, 5, 3}));
  });
  EXPECT_CONTAINS(m, "attention");
  EXPECT_CONTAINS(m, "(1, 2, 5, 4)");
  EXPECT_CONTAINS(m, "(1, 2, 5, 3)");
  m = error_of([&] { split_last(Tensor::zeros({3, 12}), {5, 5}); });
  EXPECT_CONTAINS(m, "split_last");
  EXPECT_CONTAINS(m, "(3, 12)");
  m = error_of([&] { concat_last({Tensor::zeros({3, 2}), Tensor::zeros({4, 2})}); });
  EXPECT_CONTAINS(m, "concat_last");
  EXPECT_CONTAINS(m, "(4, 2)");
  m = error_of([&] { heads_to_front(Tensor::zeros({2, 7, 12})); });
  EXPECT_CONTAINS(m, "heads_to_front");
  EXPECT_CONTAINS(m, "(2, 7, 12)");
  m = error_of([&] { view(Tensor::zeros({2, 7}), {3, 5}); });
  EXPECT_CONTAINS(m, "(3, 5)");
}

TEST(Errors, DtypeMismatchesNameTheOpAndDtypes) {
  std::string m = error_of([] { matmul(Tensor::zeros({2, 3}), Tensor::zeros({3, 4}, DType::f64)); });
  EXPECT_CONTAINS(m, "matmul");
  EXPECT_CONTAINS(m, "float32");
  EXPECT_CONTAINS(m, "float64");
  m = error_of([] { add(Tensor::zeros({2, 3}, DType::bf16), Tensor::zeros({2, 3})); });
  EXPECT_CONTAINS(m, "add");
  EXPECT_CONTAINS(m, "bfloat16");
  m = error_of([] { gelu(Tensor::zeros({2}, DType::i32)); });
  EXPECT_CONTAINS(m, "gelu");
  EXPECT_CONTAINS(m, "int32");
  m = error_of([] { cross_entropy(Tensor::zeros({7, 11}), Tensor::zeros({7})); });
  EXPECT_CONTAINS(m, "cross_entropy");
  EXPECT_CONTAINS(m, "int32");
  EXPECT_CONTAINS(m, "float32(7)");
  m = error_of([] { embedding(Tensor::zeros({4}), Tensor::zeros({11, 3})); });
  EXPECT_CONTAINS(m, "embedding");
  EXPECT_CONTAINS(m, "float32");
  m = error_of([] { Tensor::zeros({2}, DType::i32).set_requires_grad(true); });
  EXPECT_CONTAINS(m, "int32");
  m = error_of([] { Tensor::zeros({2}).data<double>(); });
  EXPECT_CONTAINS(m, "float64");
  EXPECT_CONTAINS(m, "float32");
}

TEST(Errors, BadValuesNameThemselves) {
  Tensor logits = Tensor::zeros({3, 11});
  std::string m = error_of([&] { cross_entropy(logits, Tensor::from_vector<int32_t>({1, 11, 2}, {3})); });
  EXPECT_CONTAINS(m, "cross_entropy");
  EXPECT_CONTAINS(m, "target 11");
  m = error_of([&] { cross_entropy(logits, Tensor::from_vector<int32_t>({1, 9, 2}, {3}), -1, 8); });
  EXPECT_CONTAINS(m, "target 9");  // inside V but past v_limit
  m = error_of([&] { cross_entropy(logits, Tensor::from_vector<int32_t>({1, 2, 2}, {3}), -1, 12); });
  EXPECT_CONTAINS(m, "v_limit 12");
  m = error_of([] { embedding(Tensor::from_vector<int32_t>({0, 11}, {2}), Tensor::zeros({11, 3})); });
  EXPECT_CONTAINS(m, "embedding");
  EXPECT_CONTAINS(m, "id 11");
  m = error_of([] { embedding(Tensor::from_vector<int32_t>({-1}, {1}), Tensor::zeros({11, 3})); });
  EXPECT_CONTAINS(m, "id -1");
  // a shard: ids are checked against the whole vocabulary, and the rows must fit in it
  m = error_of([] { embedding(Tensor::from_vector<int32_t>({12}, {1}), Tensor::zeros({3, 2}), 6, 12); });
  EXPECT_CONTAINS(m, "id 12");
  m = error_of([] { embedding(Tensor::from_vector<int32_t>({1}, {1}), Tensor::zeros({3, 2}), 10, 12); });
  EXPECT_CONTAINS(m, "rows [10, 13) of a vocabulary of 12");
  m = error_of([] { Tensor::zeros({2, 3}).item(); });
  EXPECT_CONTAINS(m, "(2, 3)");
  m = error_of([] { Tensor::from_vector<float>({1, 2, 3}, {2, 2}); });
  EXPECT_CONTAINS(m, "(2, 2)");
  m = error_of([] { Tensor::empty({2, -3}); });
  EXPECT_CONTAINS(m, "(2, -3)");
}

TEST(Errors, DeviceMismatchOrMissingCuda) {
  if (!cuda::available()) {
    // a CPU-only build (or a machine without a GPU) says so instead of crashing
    const std::string m = error_of([] { Tensor::zeros({2}, DType::f32, Device::cuda(0)); });
    EXPECT_CONTAINS(m, "CUDA");
    return;
  }
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({3, 4}, DType::f32, Device::cuda(0));
  const std::string m = error_of([&] { matmul(a, b); });
  EXPECT_CONTAINS(m, "matmul");
  EXPECT_CONTAINS(m, "cpu");
  EXPECT_CONTAINS(m, "cuda:0");
}

// ---- RNG -----------------------------------------------------------------------------------

// Random123's known-answer vectors for Philox4x32-10 (its tests/kat_vectors).
TEST(Rng, PhiloxKnownAnswers) {
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    uint32_t c[4] = {k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]};
    Philox::block(c, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(c[i], k.out[i]) << i;
  }
}

namespace {
Tensor normal(int64_t n, uint64_t seed, uint64_t stream, uint64_t start, DType dt = DType::f32,
              float mean = 0, float std = 1) {
  Tensor t = Tensor::empty({n}, dt);
  kernels::fill_normal(t, seed, stream, start, mean, std);
  return t;
}
Tensor uniform(int64_t n, uint64_t seed, uint64_t stream, uint64_t start, float lo, float hi) {
  Tensor t = Tensor::empty({n});
  kernels::fill_uniform(t, seed, stream, start, lo, hi);
  return t;
}
bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}
}  // namespace

TEST(Rng, SameCountersSameValues) {
  EXPECT_TRUE(bitwise_equal(normal(1001, 7, 3, 0), normal(1001, 7, 3, 0)));
  EXPECT_TRUE(bitwise_equal(uniform(1001, 7, 3, 0, -1, 2), uniform(1001, 7, 3, 0, -1, 2)));
  EXPECT_EQ(normal(5, 7, 3, 0).to_vector<float>()[2], Philox::normal(7, 3, 2, 0.0f, 1.0f));
}

TEST(Rng, SliceAloneEqualsSliceOfWhole) {
  const int64_t n = 1003;
  Tensor whole_n = normal(n, 1337, 9, 0), whole_u = uniform(n, 1337, 9, 0, -3, 5);
  // odd starts and lengths cross Philox block (4) and Box-Muller pair (2) boundaries
  for (auto [start, len] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 6}, {3, 5}, {13, 200}, {500, 503}, {1002, 1}}) {
    EXPECT_TRUE(bitwise_equal(normal(len, 1337, 9, start), whole_n.narrow(0, start, len).contiguous()))
        << "normal [" << start << ", " << start + len << ")";
    EXPECT_TRUE(
        bitwise_equal(uniform(len, 1337, 9, start, -3, 5), whole_u.narrow(0, start, len).contiguous()))
        << "uniform [" << start << ", " << start + len << ")";
  }
  // rows of a 2-D parameter generated shard by shard
  Tensor w = Tensor::empty({6, 7});
  kernels::fill_normal(w, 1, 2, 0, 0.0f, 0.02f);
  Tensor shard = Tensor::empty({2, 7});
  kernels::fill_normal(shard, 1, 2, 3 * 7, 0.0f, 0.02f);
  EXPECT_TRUE(bitwise_equal(shard, w.narrow(0, 3, 2).contiguous()));
}

TEST(Rng, DifferentStreamsAndSeedsDiffer) {
  const std::vector<float> a = normal(64, 1, 0, 0).to_vector<float>();
  const std::vector<float> b = normal(64, 1, 1, 0).to_vector<float>();
  const std::vector<float> c = normal(64, 2, 0, 0).to_vector<float>();
  const std::vector<float> d = normal(64, 1, 0, 64).to_vector<float>();
  int same_ab = 0, same_ac = 0, same_ad = 0;
  for (int i = 0; i < 64; ++i) {
    same_ab += a[i] == b[i];
    same_ac += a[i] == c[i];
    same_ad += a[i] == d[i];
  }
  EXPECT_EQ(same_ab, 0);
  EXPECT_EQ(same_ac, 0);
  EXPECT_EQ(same_ad, 0);
  // streams above 2^32 and seeds above 2^32 matter too
  EXPECT_FALSE(bitwise_equal(normal(8, 1, 1ull << 33, 0), normal(8, 1, 0, 0)));
  EXPECT_FALSE(bitwise_equal(normal(8, 1ull << 33, 0, 0), normal(8, 0, 0, 0)));
}

TEST(Rng, NormalAndUniformStatistics) {
  const int64_t n = 100000;
  auto stats = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) s += x;
    const double m = s / v.size();
    for (float x : v) s2 += (x - m) * (x - m);
    return std::pair<double, double>{m, std::sqrt(s2 / v.size())};
  };
  // standard error of the mean is 1/sqrt(n) ~ 0.003; bounds are ~6 sigma
  auto [m, s] = stats(normal(n, 42, 0, 0).to_vector<float>());
  EXPECT_NEAR(m, 0.0, 0.02);
  EXPECT_NEAR(s, 1.0, 0.02);
  auto [m2, s2] = stats(normal(n, 42, 1, 0, DType::f32, 3.0f, 0.5f).to_vector<float>());
  EXPECT_NEAR(m2, 3.0, 0.01);
  EXPECT_NEAR(s2, 0.5, 0.01);
  std::vector<float> nv = normal(n, 42, 2, 0).to_vector<float>();
  int64_t within1 = 0;
  for (float x : nv) within1 += std::abs(x) < 1.0f;
  EXPECT_NEAR(static_cast<double>(within1) / n, 0.6827, 0.01);  // the 68% rule: it is normal

  std::vector<float> u = uniform(n, 42, 3, 0, -2.0f, 6.0f).to_vector<float>();
  for (float x : u) {
    ASSERT_GT(x, -2.0f);
    ASSERT_LT(x, 6.0f);
  }
  auto [mu, su] = stats(u);
  EXPECT_NEAR(mu, 2.0, 0.05);
  EXPECT_NEAR(su, 8.0 / std::sqrt(12.0), 0.05);
}

TEST(Rng, F32AndF64FillsAgree) {
  std::vector<float> f = normal(999, 5, 6, 17).to_vector<float>();
  std::vector<double> d = normal(999, 5, 6, 17, DType::f64).to_vector<double>();
  for (size_t i = 0; i < f.size(); ++i) EXPECT_NEAR(d[i], f[i], 6e-8 * std::abs(f[i])) << i;
  Tensor u64 = Tensor::empty({999}, DType::f64);
  kernels::fill_uniform(u64, 5, 6, 17, -1.0f, 1.0f);
  std::vector<double> ud = u64.to_vector<double>();
  std::vector<float> uf = uniform(999, 5, 6, 17, -1.0f, 1.0f).to_vector<float>();
  for (size_t i = 0; i < uf.size(); ++i) EXPECT_NEAR(ud[i], uf[i], 6e-8 * std::abs(uf[i])) << i;
  // bf16 fills are the f32 values rounded once
  std::vector<float> h = normal(999, 5, 6, 17, DType::bf16).to_vector<float>();
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(h[i], bf16_to_float(float_to_bf16(f[i]))) << i;
}

TEST(TensorConversions, IntegersAboveTwoToTheTwentyFourAreExact) {
  // int32 values read through item(), to_vector<double>() and copies into f64 keep every
  // digit (float holds integers exactly only up to 2^24): error flags and indices need it
  for (int32_t v : {INT32_MAX, INT32_MIN + 1, (1 << 24) + 1, -((1 << 24) + 3), 123456789}) {
    Tensor t = Tensor::full({1}, v, DType::i32);
    EXPECT_EQ(t.item(), static_cast<double>(v));
    EXPECT_EQ(t.to_vector<double>()[0], static_cast<double>(v));
    EXPECT_EQ(t.to_vector<int32_t>()[0], v);
    EXPECT_EQ(t.to(DType::f64).item(), static_cast<double>(v));
    Tensor back = t.to(DType::f64).to(DType::i32);
    EXPECT_EQ(back.to_vector<int32_t>()[0], v);
  }
  // to f32 and bf16: one rounding, from the exact value
  Tensor big = Tensor::full({1}, (1 << 24) + 1, DType::i32);
  EXPECT_EQ(big.to(DType::f32).item(), 16777216.0);  // round to nearest even
  std::vector<int32_t> ids = {0, 1, (1 << 24) + 1, INT32_MAX};
  EXPECT_EQ(Tensor::from_vector(ids, {4}).to_vector<int32_t>(), ids);
  // a strided (non-contiguous) integer copy too
  Tensor m =
      Tensor::from_vector(std::vector<int32_t>{INT32_MAX, 1, 2, (1 << 24) + 1}, {2, 2}).transpose(0, 1);
  EXPECT_EQ(m.contiguous().to(DType::f64).to_vector<double>(),
            (std::vector<double>{2147483647.0, 2.0, 1.0, 16777217.0}));
}

// A vocabulary shard (tensor parallelism): rows [2, 5) of 6 ids. The shard's ids get their
// rows, the others zero rows, and the backward adds only the shard's ids.
TEST(Embedding, ShardOfTheVocabulary) {
  Tensor table = Tensor::from_vector<float>({10, 11, 20, 21, 30, 31}, {3, 2});
  Tensor ids = Tensor::from_vector<int32_t>({0, 2, 4, 5, 3, 2}, {6});
  Tensor out = Tensor::empty({6, 2});
  kernels::embedding_forward(ids, table, out, 2, 6);
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{0, 0, 10, 11, 30, 31, 0, 0, 20, 21, 10, 11}));
  Tensor dout = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {6, 2});
  Tensor dtable = Tensor::empty({3, 2});
  kernels::embedding_backward(ids, dout, dtable, 2);
  // row 0 (id 2): positions 1 and 5; row 1 (id 3): position 4; row 2 (id 4): position 2
  EXPECT_EQ(dtable.to_vector<float>(), (std::vector<float>{3 + 11, 4 + 12, 9, 10, 5, 6}));
}

// OpenMP's idle workers spin a bounded time (use_cpu_defaults, called by this program's
// main, sets GOMP_SPINCOUNT and re-executes it) unless the user chose: either variable set is
// left as it is, and NDT_NO_BLAS_REEXEC=1 keeps the environment as started. The test runs
// this program again under each environment; the child prints what its tests see.
TEST(Threads, OpenMPSpinningIsBoundedUnlessTheUserChose) {
  if (std::getenv("NDT_PRINT_SPIN")) {  // the child
    const char* s = std::getenv("GOMP_SPINCOUNT");
    const char* w = std::getenv("OMP_WAIT_POLICY");
    std::printf("SPIN=%s WAIT=%s\n", s ? s : "unset", w ? w : "unset");
    return;
  }
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  auto child = [&](const std::string& env) {
    // (gtest's shard variables too: under a sharded run the child must still run this test)
    const std::string clean =
        "env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY -u NDT_NO_BLAS_REEXEC -u GTEST_TOTAL_SHARDS -u "
        "GTEST_SHARD_INDEX ";
    const auto r =
        ndt::testing::run_shell(clean + env + " NDT_PRINT_SPIN=1 '" + std::string(self) +
                                "' --gtest_filter=" + "Threads.OpenMPSpinningIsBoundedUnlessTheUserChose");
    EXPECT_EQ(r.rc, 0) << r.out;
    const size_t at = r.out.find("SPIN=");
    return at == std::string::npos ? r.out : r.out.substr(at, r.out.find('\n', at) - at);
  };
  EXPECT_EQ(child(""), "SPIN=300 WAIT=unset");
  EXPECT_EQ(child("GOMP_SPINCOUNT=123456"), "SPIN=123456 WAIT=unset");
  EXPECT_EQ(child("OMP_WAIT_POLICY=active"), "SPIN=unset WAIT=active");
  EXPECT_EQ(child("NDT_NO_BLAS_REEXEC=1"), "SPIN=unset WAIT=unset");
}
