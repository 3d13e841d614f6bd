// gather_check_xxh3: a batch of records' bytes, checked against their stored XXH3-128 digests and
// (optionally) copied back to back into one buffer, in one call with the GIL released.
//
// The readers call it for records whose bytes they locate themselves (readers/raw.py: the store
// file's map and the kept offsets and checksums): the copy into a pinned batch buffer and the hash
// run on C++ threads instead of one Python loop per record under the GIL.
//
//   data:    1-D uint8, contiguous (the store file's map, or any buffer)
//   spans:   int64 [B, 2], record b is data[spans[b][0] : spans[b][1]]
//   digests: uint8 [B, 16], XXH3-128 in canonical (big-endian) form, as Python's
//            xxhash.xxh3_128_digest gives it; None: no check
//   out:     1-D uint8, contiguous, at least sum of the lengths: record b is copied to
//            out[sum of lengths before b :]; the digest is then taken of the copy (the bytes that
//            will be used). None: nothing copied, the digest taken in place
//   threads: 0: torch.get_num_threads()
// Returns bool [B], true where record b's digest does not match (all false without digests).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "parallel.h"

#define XXH_INLINE_ALL
#include "../third_party/xxhash/xxhash.h"

namespace {

constexpr const char* kOp = "gpu_ops.gather_check_xxh3: ";

void check_bytes_1d(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kByte && t.dim() == 1 && t.is_contiguous(), kOp,
              name, " must be a contiguous 1-D CPU uint8 tensor, got ", t.scalar_type(), " ", t.sizes(), " on ",
              t.device());
}

at::Tensor gather_check_xxh3(const at::Tensor& data, const at::Tensor& spans,
                             const c10::optional<at::Tensor>& digests, const c10::optional<at::Tensor>& out,
                             int64_t threads) {
  check_bytes_1d(data, "data");
  TORCH_CHECK(spans.device().is_cpu() && spans.scalar_type() == at::kLong && spans.dim() == 2 && spans.size(1) == 2,
              kOp, "spans must be a CPU int64 tensor [B, 2] (start, end), got ", spans.scalar_type(), " ",
              spans.sizes());
  TORCH_CHECK(threads >= 0, kOp, "expected threads >= 0 (0: torch.get_num_threads()), got ", threads);
  const at::Tensor sp = spans.contiguous();
  const int64_t B = sp.size(0), n = data.numel();
  const int64_t* s = sp.data_ptr<int64_t>();
  std::vector<int64_t> dest(static_cast<size_t>(B));
  int64_t total = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = s[2 * b], end = s[2 * b + 1];
    TORCH_CHECK(start >= 0 && start <= end && end <= n, kOp, "span ", b, " (", start, ", ", end,
                ") lies outside data of ", n, " bytes");
    dest[static_cast<size_t>(b)] = total;
    total += end - start;
  }
  const uint8_t* dg = nullptr;
  at::Tensor dgc;
  if (digests.has_value() && digests->defined()) {
    const at::Tensor& d = *digests;
    TORCH_CHECK(d.device().is_cpu() && d.scalar_type() == at::kByte && d.dim() == 2 && d.size(0) == B &&
                    d.size(1) == 16,
                kOp, "digests must be a CPU uint8 tensor [", B, ", 16], got ", d.scalar_type(), " ", d.sizes());
    dgc = d.contiguous();
    dg = dgc.data_ptr<uint8_t>();
  }
  uint8_t* o = nullptr;
  if (out.has_value() && out->defined()) {
    check_bytes_1d(*out, "out");
    TORCH_CHECK(out->numel() >= total, kOp, "out holds ", out->numel(), " bytes, the records ", total);
    o = out->data_ptr<uint8_t>();
    const uint8_t* lo = static_cast<const uint8_t*>(data.data_ptr());
    TORCH_CHECK(total == 0 || o + total <= lo || lo + n <= o, kOp, "out overlaps data");
  }
  at::Tensor bad = at::zeros({B}, at::TensorOptions().dtype(at::kBool));
  bool* bad_p = bad.data_ptr<bool>();
  const uint8_t* src = static_cast<const uint8_t*>(data.data_ptr());
  if (dg == nullptr && o == nullptr) return bad;
  // Chunks of 8 records (a ~100 kB record hashes in ~5 us, a thread costs ~20-50 us to start).
  gpu_ops::parallel_for(
      0, B, 8,
      [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const size_t len = static_cast<size_t>(s[2 * b + 1] - s[2 * b]);
          const uint8_t* p = src + s[2 * b];
          if (o != nullptr) {
            uint8_t* d = o + dest[static_cast<size_t>(b)];
            if (len) std::memcpy(d, p, len);
            p = d;
          }
          if (dg != nullptr) {
            XXH128_canonical_t c;
            XXH128_canonicalFromHash(&c, XXH3_128bits(p, len));
            bad_p[b] = std::memcmp(c.digest, dg + 16 * b, 16) != 0;
          }
        }
      },
      threads);
  return bad;
}

}  // namespace

TORCH_LIBRARY_IMPL(gpu_ops, CPU, m) { m.impl("gather_check_xxh3", &gather_check_xxh3); }
