// pack_ragged: a list of decoded images -> one ragged batch (data + index), in ONE call.
//
// RaggedBatch.from_list did this in Python: a few tensor calls per image (shape checks, a permute
// or reshape, then torch.cat). Each such call releases and re-takes the GIL, so with a reader, a
// decode and a pipeline thread running, a batch of 256 small images spent more time handing the GIL
// around than working (GPULoader measured ~3x the CPU of the same work done serially). Here the
// checks, views and the cat run in C++ with the GIL released once. Device-agnostic: at::cat runs on
// whatever device the images are on (one batched copy kernel on CUDA).
#include <torch/library.h>
#include <ATen/ATen.h>

#include <tuple>
#include <vector>

namespace {

// images: [H, W, C] tensors (chw_input false) or [C, H, W] tensors (true, e.g. nvJPEG's output) of
// one dtype, device and channel count; chw_input has one entry for all images or one per image (a
// batch split between decoders mixes both). The storage order of the batch is the one most
// images already have (as RaggedBatch.from_list chooses), so most images are copied once, as is.
// Returns (data 1-D, index int64 [B, 3] = offset, height, width on the CPU, layout 0 = HWC, 1 = CHW).
// Errors say which image is wrong; the Python wrapper re-raises them as ValueError.
std::tuple<at::Tensor, at::Tensor, int64_t> pack_ragged(at::TensorList images, c10::List<bool> chw_flags) {
  const int64_t B = static_cast<int64_t>(images.size());
  TORCH_CHECK(B > 0, "pack_ragged: empty list");
  const int64_t n_flags = static_cast<int64_t>(chw_flags.size());
  TORCH_CHECK(n_flags == 1 || n_flags == B, "pack_ragged: ", n_flags, " chw_input flags for ", B, " images");
  std::vector<bool> chw_of(B);
  for (int64_t i = 0; i < B; ++i) chw_of[i] = chw_flags.get(n_flags == 1 ? 0 : i);
  const at::Tensor& first = images[0];
  TORCH_CHECK(first.dim() == 3, "pack_ragged: image 0 has ", first.dim(), " dims, expected 3");
  const int64_t C = chw_of[0] ? first.size(0) : first.size(2);
  at::Tensor index = at::empty({B, 3}, at::TensorOptions().dtype(at::kLong));
  int64_t* idx = index.data_ptr<int64_t>();
  int64_t n_chw = 0;
  for (int64_t i = 0; i < B; ++i) {
    const at::Tensor& t = images[i];
    const bool chw_input = chw_of[i];
    TORCH_CHECK(t.dim() == 3, "pack_ragged: image ", i, " has ", t.dim(), " dims, expected 3");
    TORCH_CHECK(t.scalar_type() == first.scalar_type() && t.device() == first.device(), "pack_ragged: image ", i,
                " is ", t.scalar_type(), " on ", t.device(), ", image 0 is ", first.scalar_type(), " on ",
                first.device(), " (one dtype and device per batch)");
    const int64_t h = chw_input ? t.size(1) : t.size(0);
    const int64_t w = chw_input ? t.size(2) : t.size(1);
    const int64_t c = chw_input ? t.size(0) : t.size(2);
    TORCH_CHECK(c == C, "pack_ragged: image ", i, " has ", c, " channels, image 0 has ", C);
    TORCH_CHECK(h >= 1 && w >= 1, "pack_ragged: image ", i, " is empty (", h, "x", w, ")");
    idx[3 * i + 1] = h;
    idx[3 * i + 2] = w;
    // Stored channels first: a contiguous [C, H, W] (or its HWC view, strides (W, 1, H*W)).
    const bool chw = chw_input ? t.is_contiguous()
                               : (t.stride(0) == w && t.stride(1) == 1 && t.stride(2) == h * w);
    if (chw && !(c == 1 || h * w == 1)) ++n_chw;
  }
  const bool layout_chw = 2 * n_chw > B;
  std::vector<at::Tensor> flats;
  flats.reserve(B);
  int64_t offset = 0;
  for (int64_t i = 0; i < B; ++i) {
    const at::Tensor& t = images[i];
    const bool chw_input = chw_of[i];
    // As [C, H, W] or [H, W, C] in the batch's order, then flattened (a view when already so).
    at::Tensor v = chw_input ? (layout_chw ? t : t.permute({1, 2, 0})) : (layout_chw ? t.permute({2, 0, 1}) : t);
    flats.push_back(v.reshape({-1}));
    idx[3 * i] = offset;
    offset += flats.back().numel();
  }
  at::Tensor data = B == 1 ? flats[0].contiguous() : at::cat(flats);
  return {data, index, layout_chw ? 1 : 0};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(gpu_ops, m) {
  // Decoded images -> (data, index [B, 3] on the CPU, layout 0 HWC / 1 CHW): see pack_ragged above.
  m.def("pack_ragged(Tensor[] images, bool[] chw_input) -> (Tensor, Tensor, int)", &pack_ragged);
}
