// ddp_mlp: data-parallel training of a small neural network with Loom, read top to bottom.
//
//     loomrun -n 4 ./build/examples/ddp_mlp [--epochs 8] [--checkpoint PATH]
//
// The next step after ddp_linear_regression: a multi-layer perceptron (16 inputs, a hidden layer
// of 64 ReLU units, 4 classes with a softmax) learns a synthetic classification task. Its
// backward pass runs layer by layer from the output, and each layer's gradients are marked ready
// as soon as they are final, so that their bucket's all-reduce runs while the layers below are
// still being differentiated: the overlap DistributedDataParallel relies on.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "loom/ddp.hpp"
#include "loom/loom.hpp"

namespace {

constexpr size_t kSamples = 8192;
constexpr size_t kIn = 16, kHidden = 64, kClasses = 4;
constexpr size_t kLocalBatch = 32;
constexpr float kLearningRate = 0.05f;

// A dense layer y = W x + b, with its gradients.
struct Layer {
  size_t in, out;
  std::vector<float> w, b, gw, gb;
  Layer(size_t in_, size_t out_, std::mt19937& rng)
      : in(in_), out(out_), w(in_ * out_), b(out_), gw(in_ * out_), gb(out_) {
    std::normal_distribution<float> normal(0.0f, std::sqrt(2.0f / static_cast<float>(in)));  // He initialisation
    for (auto& v : w) v = normal(rng);
  }
  void forward(const float* x, float* y) const {
    for (size_t o = 0; o < out; ++o) {
      float s = b[o];
      for (size_t i = 0; i < in; ++i) s += w[o * in + i] * x[i];
      y[o] = s;
    }
  }
  // Adds this sample's gradients given dL/dy; writes dL/dx when asked.
  void backward(const float* x, const float* dy, float* dx) {
    for (size_t o = 0; o < out; ++o) {
      gb[o] += dy[o];
      for (size_t i = 0; i < in; ++i) gw[o * in + i] += dy[o] * x[i];
    }
    if (dx == nullptr) return;
    for (size_t i = 0; i < in; ++i) {
      float s = 0;
      for (size_t o = 0; o < out; ++o) s += w[o * in + i] * dy[o];
      dx[i] = s;
    }
  }
  void zeroGrad() {
    std::fill(gw.begin(), gw.end(), 0.0f);
    std::fill(gb.begin(), gb.end(), 0.0f);
  }
  void step(float lr) {
    for (size_t k = 0; k < w.size(); ++k) w[k] -= lr * gw[k];
    for (size_t k = 0; k < b.size(); ++k) b[k] -= lr * gb[k];
  }
};

uint64_t checksum(const std::vector<const std::vector<float>*>& parts) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over every parameter's bytes
  for (const auto* p : parts) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(p->data());
    for (size_t i = 0; i < p->size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  int epochs = 8;
  std::string checkpointPath = "ddp_mlp_checkpoint.bin";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--epochs") == 0) epochs = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--checkpoint") == 0) checkpointPath = argv[i + 1];
  }
  try {
    // 1. Rendezvous from the launcher's environment (loomrun, srun, mpirun, torchrun).
    loom::Communicator comm = loom::Communicator::fromEnv();
    const int rank = comm.rank(), world = comm.size();

    // 2. The dataset, the same on every rank (fixed seed): four Gaussian clouds, one per class,
    //    around random centres in 16 dimensions, overlapping enough that it takes a few epochs.
    std::mt19937 rng(777);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> centres(kClasses * kIn);
    for (auto& c : centres) c = 0.9f * normal(rng);
    std::vector<float> x(kSamples * kIn);
    std::vector<int> label(kSamples);
    for (size_t s = 0; s < kSamples; ++s) {
      label[s] = static_cast<int>(s % kClasses);
      for (size_t f = 0; f < kIn; ++f) x[s * kIn + f] = centres[label[s] * kIn + f] + normal(rng);
    }

    // 3. The model. Each rank initialises it differently on purpose: GradSync broadcasts rank 0's.
    std::mt19937 init(static_cast<unsigned>(100 + rank));
    Layer l1(kIn, kHidden, init), l2(kHidden, kClasses, init);

    // 4. Registration in the model's order, first layer first; GradSync buckets them last first.
    loom::ddp::GradSync sync(comm, {
                                       {l1.w.data(), l1.gw.data(), l1.w.size(), loom::DataType::Float32, "l1.weight"},
                                       {l1.b.data(), l1.gb.data(), l1.b.size(), loom::DataType::Float32, "l1.bias"},
                                       {l2.w.data(), l2.gw.data(), l2.w.size(), loom::DataType::Float32, "l2.weight"},
                                       {l2.b.data(), l2.gb.data(), l2.b.size(), loom::DataType::Float32, "l2.bias"},
                                   });
    enum { kL1W, kL1B, kL2W, kL2B };

    loom::ddp::DistributedSampler sampler(kSamples, rank, world, /*shuffle=*/true, /*seed=*/99);
    std::vector<float> h(kHidden), a(kHidden), logits(kClasses), dLogits(kClasses), dA(kHidden);
    std::vector<float> batchA, batchX;  // what backward needs of the forward pass
    std::vector<float> batchDLogits;
    for (int epoch = 0; epoch < epochs; ++epoch) {
      sampler.setEpoch(static_cast<uint64_t>(epoch));
      const std::vector<size_t> mine = sampler.indices();
      double stats[3] = {0, 0, 0};  // loss sum, correct, samples
      for (size_t start = 0; start < mine.size(); start += kLocalBatch) {
        const size_t end = std::min(start + kLocalBatch, mine.size());
        const auto n = static_cast<float>(end - start);
        batchA.assign((end - start) * kHidden, 0.0f);
        batchDLogits.assign((end - start) * kClasses, 0.0f);

        // Forward, sample by sample: hidden = ReLU(W1 x + b1), logits = W2 hidden + b2, softmax.
        for (size_t k = start; k < end; ++k) {
          const float* xs = &x[mine[k] * kIn];
          l1.forward(xs, h.data());
          for (size_t j = 0; j < kHidden; ++j) a[j] = std::max(h[j], 0.0f);
          l2.forward(a.data(), logits.data());
          const float top = *std::max_element(logits.begin(), logits.end());
          float z = 0;
          for (float& v : logits) z += (v = std::exp(v - top));
          const int y = label[mine[k]];
          stats[0] -= std::log(logits[static_cast<size_t>(y)] / z);
          stats[1] += std::max_element(logits.begin(), logits.end()) - logits.begin() == y ? 1 : 0;
          stats[2] += 1;
          // d(mean cross-entropy)/d(logits) = (softmax - one_hot) / n
          for (size_t c = 0; c < kClasses; ++c)
            batchDLogits[(k - start) * kClasses + c] = (logits[c] / z - (static_cast<int>(c) == y ? 1.0f : 0.0f)) / n;
          std::copy(a.begin(), a.end(), batchA.begin() + static_cast<long>((k - start) * kHidden));
        }

        // Backward, output layer first. Its gradients are final once every sample went through
        // it: mark them ready, and their all-reduce starts while layer 1 is differentiated.
        l1.zeroGrad();
        l2.zeroGrad();
        std::vector<float> dHidden((end - start) * kHidden);
        for (size_t k = start; k < end; ++k) {
          const float* act = &batchA[(k - start) * kHidden];
          l2.backward(act, &batchDLogits[(k - start) * kClasses], dA.data());
          for (size_t j = 0; j < kHidden; ++j) dHidden[(k - start) * kHidden + j] = act[j] > 0 ? dA[j] : 0.0f;
        }
        sync.markReady(kL2B);
        sync.markReady(kL2W);
        for (size_t k = start; k < end; ++k) l1.backward(&x[mine[k] * kIn], &dHidden[(k - start) * kHidden], nullptr);
        sync.markReady(kL1B);
        sync.markReady(kL1W);

        // Every gradient is now the average over all ranks: the same step everywhere.
        sync.synchronize();
        l1.step(kLearningRate);
        l2.step(kLearningRate);
      }
      comm.allReduce(stats, stats, 3, loom::DataType::Float64, loom::ReduceOp::Sum);
      if (rank == 0) {
        std::printf("epoch %2d  loss %.4f  accuracy %.1f%%\n", epoch, stats[0] / stats[2], 100.0 * stats[1] / stats[2]);
        std::fflush(stdout);
      }
    }

    // 5. Checkpoint on rank 0 only, after a barrier; then a checksum on every rank.
    comm.barrier();
    if (rank == 0) {
      FILE* f = std::fopen(checkpointPath.c_str(), "wb");
      bool ok = f != nullptr;
      for (const auto* p : {&l1.w, &l1.b, &l2.w, &l2.b})
        ok = ok && std::fwrite(p->data(), sizeof(float), p->size(), f) == p->size();
      if (f != nullptr) std::fclose(f);
      if (!ok) std::fprintf(stderr, "rank 0: could not write %s\n", checkpointPath.c_str());
      std::printf("rank 0 saved the checkpoint to %s\n", checkpointPath.c_str());
    }
    comm.barrier();
    std::printf("rank %d: weights checksum %016llx\n", rank,
                static_cast<unsigned long long>(checksum({&l1.w, &l1.b, &l2.w, &l2.b})));
    return 0;
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
