// ddp_linear_regression: data-parallel training with Loom, read top to bottom.
//
//     loomrun -n 4 ./build/examples/ddp_linear_regression [--epochs 10] [--checkpoint PATH]
//
// (srun, mpirun and torchrun work as well: see docs/launchers.md.) Every rank runs this same program on
// its own share of the data. After each backward pass the ranks average their gradients, so every
// rank takes the same optimiser step and the replicas of the model stay identical: the run equals
// one process training on the ranks' batches put together, only faster.
//
// The model is linear regression, y = w . x + b, trained by stochastic gradient descent on the
// mean squared error, with the gradients written out by hand (no autograd here).
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

constexpr size_t kSamples = 8192;   // the dataset
constexpr size_t kFeatures = 32;    // inputs per sample
constexpr size_t kLocalBatch = 32;  // samples per rank per step: the global batch is 32 x ranks
constexpr float kLearningRate = 0.01f;

// FNV-1a over the bytes: the same weights give the same checksum on every rank.
uint64_t checksum(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  int epochs = 10;
  std::string checkpointPath = "ddp_checkpoint.bin";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--epochs") == 0) epochs = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--checkpoint") == 0) checkpointPath = argv[i + 1];
  }
  try {
    // 1. Rendezvous: rank and world size come from the launcher's environment.
    loom::Communicator comm = loom::Communicator::fromEnv();
    const int rank = comm.rank();
    const int world = comm.size();

    // 2. The dataset, made from a fixed seed so that every rank holds the same one (a real job
    //    reads it from shared storage). The targets come from hidden "true" weights plus noise.
    std::mt19937 rng(12345);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> trueW(kFeatures);
    for (auto& w : trueW) w = normal(rng);
    const float trueB = 0.5f;
    std::vector<float> x(kSamples * kFeatures), y(kSamples);
    for (size_t s = 0; s < kSamples; ++s) {
      y[s] = trueB;
      for (size_t f = 0; f < kFeatures; ++f) {
        x[s * kFeatures + f] = normal(rng);
        y[s] += trueW[f] * x[s * kFeatures + f];
      }
      y[s] += 0.1f * normal(rng);
    }

    // 3. The model: a weight vector and a bias, with a gradient buffer each. Each rank starts from
    //    different random values on purpose: GradSync's constructor broadcasts rank 0's, so that
    //    every replica starts identical.
    std::vector<float> weight(kFeatures), gradWeight(kFeatures);
    float bias = 0.0f, gradBias = 0.0f;
    std::mt19937 init(static_cast<unsigned>(rank));
    for (auto& w : weight) w = 0.1f * normal(init);

    // 4. Register the parameters in the model's order (first layer first). GradSync groups their
    //    gradients into buckets, last layer first, and all-reduces each bucket as soon as all its
    //    gradients are marked ready during backward.
    loom::ddp::GradSync sync(comm, {
                                       {weight.data(), gradWeight.data(), kFeatures, loom::DataType::Float32, "weight"},
                                       {&bias, &gradBias, 1, loom::DataType::Float32, "bias"},
                                   });
    const size_t kWeight = 0, kBias = 1;  // the parameters' indices, in registration order

    // 5. Each rank trains on its own shard of the samples, reshuffled every epoch with a seed all
    //    ranks share. Every shard has the same size (padded), so every rank takes the same number
    //    of steps: a rank that took one step more would wait for its peers forever.
    loom::ddp::DistributedSampler sampler(kSamples, rank, world, /*shuffle=*/true, /*seed=*/2024);

    for (int epoch = 0; epoch < epochs; ++epoch) {
      sampler.setEpoch(static_cast<uint64_t>(epoch));
      const std::vector<size_t> mine = sampler.indices();
      double lossSum = 0;
      size_t lossCount = 0;
      for (size_t start = 0; start < mine.size(); start += kLocalBatch) {
        const size_t end = std::min(start + kLocalBatch, mine.size());
        const float n = static_cast<float>(end - start);

        // Forward: predictions and the error of each sample of this rank's batch.
        std::vector<float> err(end - start);
        for (size_t k = start; k < end; ++k) {
          const float* xs = &x[mine[k] * kFeatures];
          float pred = bias;
          for (size_t f = 0; f < kFeatures; ++f) pred += weight[f] * xs[f];
          err[k - start] = pred - y[mine[k]];
          lossSum += static_cast<double>(err[k - start]) * err[k - start];
          ++lossCount;
        }

        // Backward, from the output towards the input: d(loss)/d(bias) first. As soon as a
        // gradient is final it is marked ready, and its bucket's all-reduce may start while the
        // next gradients are still being computed (on a GPU, that overlap hides the network).
        gradBias = 0;
        for (float e : err) gradBias += 2.0f * e / n;
        sync.markReady(kBias);
        std::fill(gradWeight.begin(), gradWeight.end(), 0.0f);
        for (size_t k = start; k < end; ++k) {
          const float* xs = &x[mine[k] * kFeatures];
          for (size_t f = 0; f < kFeatures; ++f) gradWeight[f] += 2.0f * err[k - start] * xs[f] / n;
        }
        sync.markReady(kWeight);

        // Wait for every bucket: each gradient now holds the average over all ranks.
        sync.synchronize();

        // The optimiser step, identical on every rank because the gradients are.
        for (size_t f = 0; f < kFeatures; ++f) weight[f] -= kLearningRate * gradWeight[f];
        bias -= kLearningRate * gradBias;
      }

      // The epoch's loss over all ranks' samples (a small all-reduce), printed by rank 0 only.
      double loss[2] = {lossSum, static_cast<double>(lossCount)};
      comm.allReduce(loss, loss, 2, loom::DataType::Float64, loom::ReduceOp::Sum);
      if (rank == 0) {
        std::printf("epoch %2d  loss %.6f\n", epoch, loss[0] / loss[1]);
        std::fflush(stdout);  // now, not when the pipe's buffer fills
      }
    }

    // 6. Checkpoint: rank 0 alone writes it, after a barrier (every rank has finished training:
    //    nobody still needs the old file, and a rank that failed would have stopped us here).
    //    A second barrier tells the others the file is complete, should they read it.
    comm.barrier();
    if (rank == 0) {
      FILE* f = std::fopen(checkpointPath.c_str(), "wb");
      if (f == nullptr || std::fwrite(weight.data(), sizeof(float), kFeatures, f) != kFeatures ||
          std::fwrite(&bias, sizeof(float), 1, f) != 1) {
        std::fprintf(stderr, "rank 0: could not write %s\n", checkpointPath.c_str());
      }
      if (f != nullptr) std::fclose(f);
      std::printf("rank 0 saved the checkpoint to %s\n", checkpointPath.c_str());
    }
    comm.barrier();

    // 7. Every rank prints a checksum of its weights: identical replicas print the same number.
    std::vector<float> all(weight);
    all.push_back(bias);
    double distance = 0;
    for (size_t f = 0; f < kFeatures; ++f) distance += std::pow(weight[f] - trueW[f], 2);
    std::printf("rank %d: weights checksum %016llx (distance to the true weights %.4f, bias %.4f)\n", rank,
                static_cast<unsigned long long>(checksum(all.data(), all.size() * sizeof(float))), std::sqrt(distance),
                bias);
    return 0;
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
