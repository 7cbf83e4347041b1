// Gradient lists of real models for the benchmarks: element counts of every float32
// parameter tensor, in the models' declaration order (torchvision's).
#ifndef HYBRIDPS_BENCH_MODELS_H_
#define HYBRIDPS_BENCH_MODELS_H_

#include <cstddef>
#include <vector>

namespace hybridps::bench {

// ResNet-50: 161 tensors, 25,557,032 parameters (convolutions, batch-norm scale and
// shift, the classifier).
inline std::vector<size_t> ResNet50() {
  std::vector<size_t> t = {64 * 3 * 7 * 7, 64, 64};
  size_t in = 64;
  const size_t planes[] = {64, 128, 256, 512}, blocks[] = {3, 4, 6, 3};
  for (int s = 0; s < 4; ++s) {
    const size_t p = planes[s];
    for (size_t b = 0; b < blocks[s]; ++b) {
      t.insert(t.end(), {p * in, p, p, p * p * 9, p, p, 4 * p * p, 4 * p, 4 * p});
      if (b == 0) t.insert(t.end(), {4 * p * in, 4 * p, 4 * p});
      in = 4 * p;
    }
  }
  t.insert(t.end(), {1000 * 2048, 1000});
  return t;
}

// VGG-16: 32 tensors (13 convolutions and 3 fully connected layers, weight and bias),
// 138,357,544 parameters, 102.8 M of them in the first fully connected layer.
inline std::vector<size_t> Vgg16() {
  std::vector<size_t> t;
  size_t in = 3;
  for (size_t out : {64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512}) {
    t.insert(t.end(), {out * in * 9, out});
    in = out;
  }
  t.insert(t.end(), {4096 * 512 * 7 * 7, 4096, 4096 * 4096, 4096, 1000 * 4096, 1000});
  return t;
}

}  // namespace hybridps::bench

#endif  // HYBRIDPS_BENCH_MODELS_H_
