// GradSync (include/loom/ddp.hpp) on ranks as threads: data-parallel training equals training on
// the full batch in one process, the replicas stay bitwise identical, buckets start during the
// backward pass, gradient views, no_sync accumulation, compression, and every misuse's error.
//
// The model: linear regression y = w . x + b with the weight split into "layers" of different
// widths (so that they form several buckets), trained with SGD on mean squared error.
#include "loom/ddp.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "common/ranks.hpp"

using loom::DataType;
using loom::ddp::GradSync;
using loom::ddp::GradSyncOptions;
using loom::ddp::Parameter;

namespace {

constexpr size_t kWidths[] = {3, 5, 1, 7, 2};  // the weight's "layers"
constexpr size_t kLayers = sizeof(kWidths) / sizeof(kWidths[0]);
constexpr size_t kFeatures = 3 + 5 + 1 + 7 + 2;
constexpr size_t kBatch = 24;  // divides by 1, 2, 3 and 4 ranks
constexpr int kSteps = 25;
constexpr float kRate = 0.05f;

struct Data {
  std::vector<float> x, y;  // x: kSteps * kBatch rows of kFeatures; y: one per row
};

const Data& data() {
  static const Data d = [] {
    Data d;
    std::mt19937 rng(2024);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> truth(kFeatures);
    for (auto& t : truth) t = normal(rng);
    for (int s = 0; s < kSteps; ++s)
      for (size_t i = 0; i < kBatch; ++i) {
        float y = 0.5f;
        for (size_t f = 0; f < kFeatures; ++f) {
          const float v = normal(rng);
          d.x.push_back(v);
          y += truth[f] * v;
        }
        d.y.push_back(y + 0.01f * normal(rng));
      }
    return d;
  }();
  return d;
}

// The model's parameters: one weight block per layer, then the bias.
struct Model {
  std::vector<std::vector<float>> w, gw;
  float b = 0, gb = 0;
  explicit Model(float init) {
    for (size_t l = 0; l < kLayers; ++l) {
      w.emplace_back(kWidths[l], init);
      gw.emplace_back(kWidths[l], 0.0f);
    }
  }
  std::vector<Parameter> parameters() {
    std::vector<Parameter> p;
    for (size_t l = 0; l < kLayers; ++l)
      p.push_back(Parameter{w[l].data(), gw[l].data(), kWidths[l], DataType::Float32, "w" + std::to_string(l)});
    p.push_back(Parameter{&b, &gb, 1, DataType::Float32, "bias"});
    return p;
  }
  std::vector<float> flat() const {
    std::vector<float> out;
    for (const auto& l : w) out.insert(out.end(), l.begin(), l.end());
    out.push_back(b);
    return out;
  }
};

// Gradients of the mean squared error over rows [from, to) of step s, into the given buffers
// (grads[l] for layer l, grads[kLayers] for the bias).
void gradients(const Model& m, int s, size_t from, size_t to, const std::vector<float*>& grads) {
  const Data& d = data();
  for (size_t l = 0; l < kLayers; ++l) std::fill(grads[l], grads[l] + kWidths[l], 0.0f);
  *grads[kLayers] = 0;
  const float scale = 2.0f / static_cast<float>(to - from);
  for (size_t i = from; i < to; ++i) {
    const size_t row = static_cast<size_t>(s) * kBatch + i;
    const float* x = &d.x[row * kFeatures];
    float pred = m.b;
    size_t f = 0;
    for (size_t l = 0; l < kLayers; ++l)
      for (size_t k = 0; k < kWidths[l]; ++k) pred += m.w[l][k] * x[f++];
    const float err = (pred - d.y[row]) * scale;
    f = 0;
    for (size_t l = 0; l < kLayers; ++l)
      for (size_t k = 0; k < kWidths[l]; ++k) grads[l][k] += err * x[f++];
    *grads[kLayers] += err;
  }
}

void sgd(Model& m, const std::vector<float*>& grads) {
  for (size_t l = 0; l < kLayers; ++l)
    for (size_t k = 0; k < kWidths[l]; ++k) m.w[l][k] -= kRate * grads[l][k];
  m.b -= kRate * *grads[kLayers];
}

std::vector<float> trainAlone() {
  Model m(0.0f);
  std::vector<float*> g;
  for (auto& l : m.gw) g.push_back(l.data());
  g.push_back(&m.gb);
  for (int s = 0; s < kSteps; ++s) {
    gradients(m, s, 0, kBatch, g);
    sgd(m, g);
  }
  return m.flat();
}

// Data-parallel: each rank takes its slice of each step's batch. Rank r starts from weights r
// (the broadcast at construction makes them rank 0's).
// With `shuffled`, each rank marks its gradients ready in an order of its own, different at every
// step: the all-reduces must still be issued in one order on every rank.
std::vector<float> trainParallel(loom::Communicator& c, GradSyncOptions o, bool shuffled = false) {
  Model m(static_cast<float>(c.rank()));
  GradSync sync(c, m.parameters(), o);
  std::vector<float*> g;
  for (size_t i = 0; i <= kLayers; ++i) g.push_back(static_cast<float*>(sync.gradient(i)));
  const size_t share = kBatch / static_cast<size_t>(c.size()), from = share * static_cast<size_t>(c.rank());
  for (int s = 0; s < kSteps; ++s) {
    gradients(m, s, from, from + share, g);
    std::vector<size_t> order;
    for (size_t i = kLayers + 1; i-- > 0;) order.push_back(i);  // backward: bias, then the last layer first
    if (shuffled) {
      std::mt19937 rng(static_cast<unsigned>(1000 * c.rank() + s));
      std::shuffle(order.begin(), order.end(), rng);
    }
    for (size_t i : order) sync.markReady(i);
    sync.synchronize();
    sgd(m, g);
  }
  return m.flat();
}

GradSyncOptions smallBuckets() {
  GradSyncOptions o;
  o.firstBucketCapBytes = 12;  // the bias and the last layer's 2
  o.bucketCapBytes = 32;
  return o;
}

}  // namespace

class DataParallel : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Ranks, DataParallel, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// The weights after 25 steps equal single-process training on the full batch within 1e-5
// (float32 sums in another order), and are bitwise identical on every rank, however the
// gradients travel.
TEST_P(DataParallel, MatchesFullBatchTrainingAndReplicasAreIdentical) {
  const int n = GetParam();
  const std::vector<float> alone = trainAlone();
  // Packed into the buckets (over shared memory); gradients living in the buckets (over mixed
  // links: two "nodes", TCP between); every gradient all-reduced in place, unpacked; in place and
  // packed ones in the same buckets, marked ready in a different order on every rank.
  for (const char* how : {"packed", "view", "direct", "shuffled"}) {
    const std::string mode = how;
    loomtest::TransportSetup links(mode == "view" ? "mixed" : "shm");
    GradSyncOptions o = smallBuckets();
    o.gradientAsBucketView = mode == "view";
    if (mode == "direct") o.directMinBytes = 1;
    if (mode == "shuffled") o.directMinBytes = 8;  // layers of 2 or more weights in place, the rest packed
    std::vector<std::vector<float>> weights(static_cast<size_t>(n));
    loomtest::runOk(n, [&](loom::Communicator& c) {
      weights[static_cast<size_t>(c.rank())] = trainParallel(c, o, mode == "shuffled");
    });
    for (size_t k = 0; k < alone.size(); ++k)
      EXPECT_NEAR(weights[0][k], alone[k], 1e-5 + 1e-5 * std::fabs(alone[k])) << "weight " << k << " " << mode;
    for (int r = 1; r < n; ++r)
      EXPECT_EQ(std::memcmp(weights[static_cast<size_t>(r)].data(), weights[0].data(), alone.size() * sizeof(float)), 0)
          << "rank " << r << " differs from rank 0 (" << mode << ")";
  }
}

// A bucket's all-reduce starts as soon as its gradients are marked, before the backward pass
// ends; buckets start in order even when gradients are marked out of order.
TEST(GradSync, BucketsStartDuringBackwardInOrder) {
  for (size_t directMin : {size_t{1} << 20, size_t{1}}) {  // gradients packed, or all-reduced in place
    loomtest::runOk(3, [&](loom::Communicator& c) {
      Model m(1.0f);
      GradSyncOptions o = smallBuckets();
      o.directMinBytes = directMin;
      GradSync sync(c, m.parameters(), o);
      ASSERT_GE(sync.buckets().size(), 3u);
      EXPECT_EQ(sync.buckets().front(), (std::vector<size_t>{kLayers, kLayers - 1}));  // bias and last layer
      for (int step = 0; step < 2; ++step) {
        sync.markReady(0);  // the first layer (the last bucket) first: nothing can start yet
        EXPECT_EQ(sync.bucketsStarted(), 0u);
        sync.markReady(kLayers);
        sync.markReady(kLayers - 1);  // the first bucket is complete
        EXPECT_EQ(sync.bucketsStarted(), 1u);
        for (size_t i = kLayers - 1; i-- > 1;) sync.markReady(i);
        EXPECT_EQ(sync.bucketsStarted(), sync.buckets().size());  // every bucket started before synchronize
        sync.synchronize();
        EXPECT_EQ(sync.bucketsStarted(), 0u);  // a new step
      }
    });
  }
}

// noSync: the micro-batches' gradients stay local and accumulate; the step after the scope
// averages the sum.
TEST(GradSync, NoSyncAccumulatesThenAverages) {
  loomtest::runOk(4, [](loom::Communicator& c) {
    std::vector<float> w(100, 0.0f), g(100, 0.0f);
    GradSync sync(c, {Parameter{w.data(), g.data(), w.size(), DataType::Float32, "w"}});
    const float mine = static_cast<float>(c.rank() + 1);
    {
      auto scope = sync.noSync();
      std::fill(g.begin(), g.end(), mine);
      sync.markReady(0);
      EXPECT_EQ(sync.bucketsStarted(), 0u);
      sync.synchronize();
      EXPECT_EQ(g[0], mine);  // not averaged: local
    }
    for (auto& v : g) v += mine;  // the second micro-batch adds its gradient
    sync.markReady(0);
    sync.synchronize();
    const float want = 2.0f * (1 + 2 + 3 + 4) / 4.0f;
    for (float v : g) ASSERT_FLOAT_EQ(v, want);
  });
}

// Half-precision gradients on the wire: averages within the format's precision.
TEST(GradSync, CompressionToFloat16AndBfloat16) {
  for (auto mode : {loom::ddp::Compression::Float16, loom::ddp::Compression::Bfloat16}) {
    loomtest::runOk(3, [&](loom::Communicator& c) {
      std::vector<float> w(1000, 0.0f), g(1000), h(10, 0.0f), gh(10);
      GradSyncOptions o;
      o.compression = mode;
      GradSync sync(c,
                    {Parameter{w.data(), g.data(), w.size(), DataType::Float32, "w"},
                     Parameter{h.data(), gh.data(), h.size(), DataType::Float32, "h"}},
                    o);
      for (size_t i = 0; i < g.size(); ++i) g[i] = 0.001f * static_cast<float>(i) * static_cast<float>(c.rank() + 1);
      for (size_t i = 0; i < gh.size(); ++i) gh[i] = 100.0f + static_cast<float>(c.rank());
      sync.markReady(1);
      sync.markReady(0);
      sync.synchronize();
      const double rel = mode == loom::ddp::Compression::Float16 ? 2e-3 : 1.6e-2;
      for (size_t i = 0; i < g.size(); ++i) {
        const double want = 0.001 * static_cast<double>(i) * 2.0;  // mean of 1, 2, 3 is 2
        ASSERT_NEAR(g[i], want, rel * want + 1e-6) << i;
      }
      for (float v : gh) ASSERT_NEAR(v, 101.0, rel * 101.0);
    });
  }
}

// Gradients of float64 and float32 parameters in one model, each type in its own buckets.
TEST(GradSync, MixedDatatypes) {
  loomtest::runOk(2, [](loom::Communicator& c) {
    std::vector<double> a(5, 0.0), ga(5);
    std::vector<float> b(7, 0.0f), gb(7);
    GradSync sync(c, {Parameter{a.data(), ga.data(), a.size(), DataType::Float64, "a"},
                      Parameter{b.data(), gb.data(), b.size(), DataType::Float32, "b"}});
    EXPECT_EQ(sync.buckets().size(), 2u);
    std::fill(ga.begin(), ga.end(), c.rank() == 0 ? 1.0 : 3.0);
    std::fill(gb.begin(), gb.end(), c.rank() == 0 ? 10.0f : 20.0f);
    sync.markReady(1);
    sync.markReady(0);
    sync.synchronize();
    for (double v : ga) EXPECT_EQ(v, 2.0);
    for (float v : gb) EXPECT_EQ(v, 15.0f);
  });
}

// ---- Misuse: each gets its own clear error. ----

TEST(GradSync, MarkedTwiceIsAnError) {
  loomtest::runOk(2, [](loom::Communicator& c) {
    Model m(0.0f);
    GradSync sync(c, m.parameters(), smallBuckets());
    sync.markReady(2);
    try {
      sync.markReady(2);
      ADD_FAILURE() << "no error";
    } catch (const loom::Error& e) {
      EXPECT_EQ(e.code(), loom::ErrorCode::InvalidUsage);
      EXPECT_NE(std::string(e.what()).find("parameter 2 (w2) was marked ready twice"), std::string::npos) << e.what();
    }
    EXPECT_THROW(sync.markReady(kLayers + 1), loom::Error);  // out of range
    for (size_t i = 0; i <= kLayers; ++i)
      if (i != 2) sync.markReady(i);
    sync.synchronize();  // the step still completes on every rank
  });
}

TEST(GradSync, SynchronizeWithGradientsNeverMarkedNamesThem) {
  loomtest::runOk(2, [](loom::Communicator& c) {
    Model m(0.0f);
    GradSync sync(c, m.parameters(), smallBuckets());
    for (size_t i = 2; i <= kLayers; ++i) sync.markReady(i);
    try {
      sync.synchronize();
      ADD_FAILURE() << "no error";
    } catch (const loom::Error& e) {
      EXPECT_EQ(e.code(), loom::ErrorCode::InvalidUsage);
      EXPECT_NE(std::string(e.what()).find("2 of 6 gradients were never marked ready this step: parameter 0 (w0), "
                                           "parameter 1 (w1)"),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(GradSync, DifferentParametersAcrossRanksAreNamedOnEveryRank) {
  // Rank 1's third parameter has another size.
  auto results = loomtest::runRanks(3, [](loom::Communicator& c) {
    std::vector<float> w(10, 0.0f), g(10, 0.0f);
    std::vector<Parameter> p = {Parameter{w.data(), g.data(), 4, DataType::Float32, ""},
                                Parameter{w.data(), g.data(), 3, DataType::Float32, ""},
                                Parameter{w.data(), g.data(), c.rank() == 1 ? 5u : 2u, DataType::Float32, ""}};
    GradSync sync(c, p);
  });
  for (const auto& r : results)
    EXPECT_NE(r.error.find("the ranks registered different parameters (rank 1's parameter 2 is 5 float32, rank 0's "
                           "is 2 float32)"),
              std::string::npos)
        << r.error;
  // Rank 2 registered one parameter fewer.
  results = loomtest::runRanks(3, [](loom::Communicator& c) {
    std::vector<float> w(10, 0.0f), g(10, 0.0f);
    std::vector<Parameter> p = {Parameter{w.data(), g.data(), 4, DataType::Float32, ""}};
    if (c.rank() != 2) p.push_back(Parameter{w.data(), g.data(), 3, DataType::Float32, ""});
    GradSync sync(c, p);
  });
  for (const auto& r : results)
    EXPECT_NE(r.error.find("rank 2 registered 1 parameters, rank 0 2"), std::string::npos) << r.error;
  // Two parameters of one shape, registered in swapped order (their names tell).
  results = loomtest::runRanks(2, [](loom::Communicator& c) {
    std::vector<float> w(10, 0.0f), g(10, 0.0f);
    std::vector<Parameter> p = {Parameter{w.data(), g.data(), 4, DataType::Float32, "fc1.bias"},
                                Parameter{w.data(), g.data(), 4, DataType::Float32, "fc2.bias"}};
    if (c.rank() == 1) std::swap(p[0], p[1]);
    GradSync sync(c, p);
  });
  for (const auto& r : results)
    EXPECT_NE(r.error.find("rank 1's parameter 0 has another name than rank 0's, with the same size and datatype: "
                           "registered in another order?"),
              std::string::npos)
        << r.error;
  // A datatype differs.
  results = loomtest::runRanks(2, [](loom::Communicator& c) {
    std::vector<double> w(10, 0.0), g(10, 0.0);
    GradSync sync(c, {Parameter{w.data(), g.data(), 4, c.rank() == 0 ? DataType::Float32 : DataType::Float64, ""}});
  });
  for (const auto& r : results)
    EXPECT_NE(r.error.find("rank 1's parameter 0 is 4 float64, rank 0's is 4 float32"), std::string::npos) << r.error;
}

TEST(GradSync, NullBuffersAreRejected) {
  loomtest::runOk(1, [](loom::Communicator& c) {
    std::vector<float> w(4, 0.0f);
    try {
      GradSync sync(c, {Parameter{w.data(), nullptr, 4, DataType::Float32, "layer.weight"}});
      ADD_FAILURE() << "no error";
    } catch (const loom::Error& e) {
      EXPECT_EQ(e.code(), loom::ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find("parameter 0 (layer.weight) has a null gradient pointer"), std::string::npos)
          << e.what();
    }
    GradSyncOptions view;
    view.gradientAsBucketView = true;  // no gradient pointer needed: it lives in the bucket
    GradSync sync(c, {Parameter{w.data(), nullptr, 4, DataType::Float32, "layer.weight"}}, view);
    EXPECT_NE(sync.gradient(0), nullptr);
  });
}
