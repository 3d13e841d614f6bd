// The native decoder's Python binding: module packer_engine (gpu_ops/engine.py builds and loads
// it; readers/gpu/engine.py wraps it as decoder="engine").
#include <torch/extension.h>

#include "engine.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using packer_engine::Engine;
  m.doc() = "packer's native nvJPEG decoder (see gpu_ops/csrc/engine/engine.h)";
  m.def("nvjpeg_version", &packer_engine::nvjpeg_version, "nvJPEG's version as major*10000+minor*100+patch");
  pybind11::class_<Engine>(m, "Engine")
      .def(pybind11::init<int64_t, int64_t, double, int64_t>(), pybind11::arg("device"), pybind11::arg("threads"),
           pybind11::arg("hardware_share"), pybind11::arg("gpu_huffman_pixels"))
      .def("submit", &Engine::submit, pybind11::arg("buffers"), pybind11::arg("parts"),
           pybind11::arg("regions") = pybind11::none())
      .def("result", &Engine::result, pybind11::arg("ticket"))
      .def_property_readonly("hardware", &Engine::hardware)
      .def_property_readonly("hardware_reason", &Engine::hardware_reason)
      .def_property_readonly("hardware_share", &Engine::hardware_share)
      .def_property_readonly("hardware_lanes", &Engine::hardware_lanes)
      .def_property_readonly("hardware_notes", &Engine::hardware_notes)
      .def_property_readonly("hardware_decoder_info", &Engine::hardware_decoder_info)
      .def_property_readonly("hardware_failures", &Engine::hardware_failures)
      .def_property_readonly("hardware_error", &Engine::hardware_error)
      .def_property_readonly("last_timings", &Engine::last_timings)
      .def_property_readonly("threads", &Engine::threads)
      .def("where_counts", &Engine::where_counts)
      .def_property_readonly("outputs_allocated_ahead", &Engine::outputs_allocated_ahead)
      .def("threads_beside_hardware", &Engine::threads_beside_hardware, pybind11::arg("lanes"));
}
