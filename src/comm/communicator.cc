// loom::Communicator, Work and UniqueId: thin wrappers over CommImpl and Request.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "bootstrap/launcher_env.hpp"
#include "bootstrap/rendezvous.hpp"
#include "comm/comm_impl.hpp"
#include "comm/split_meeting.hpp"
#include "comm/tune.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"
#include "core/signature.hpp"

namespace loom {

// ---- UniqueId ----

UniqueId UniqueId::create() {
  UniqueId id;
  encodeUniqueId(createUniqueId(), id.bytes_.data());
  return id;
}

UniqueId UniqueId::fromBytes(const void* data, size_t size) {
  UniqueIdFields f;
  std::string why;
  if (data == nullptr || !decodeUniqueId(static_cast<const uint8_t*>(data), size, &f, &why)) {
    LOOM_THROW(ErrorCode::InvalidArgument, -1, "invalid unique id: " + (data == nullptr ? std::string("null") : why));
  }
  UniqueId id;
  std::memcpy(id.bytes_.data(), data, kBytes);
  return id;
}

UniqueId UniqueId::fromHex(const std::string& hex) {
  if (hex.size() != 2 * kBytes) {
    LOOM_THROW(ErrorCode::InvalidArgument, -1,
               strFormat("a unique id in hex has %zu digits, not %zu", 2 * kBytes, hex.size()));
  }
  uint8_t raw[kBytes];
  for (size_t i = 0; i < kBytes; ++i) {
    auto nib = [&](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      LOOM_THROW(ErrorCode::InvalidArgument, -1, "unique id hex holds a non-hex character");
    };
    raw[i] = static_cast<uint8_t>(nib(hex[2 * i]) << 4 | nib(hex[2 * i + 1]));
  }
  return fromBytes(raw, kBytes);
}

std::string UniqueId::toHex() const {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes_) {
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

Launch launchFromEnv() { return detectLaunch(processEnv()); }  // without the job key's secret

// ---- Work ----

Work::Work(std::shared_ptr<detail::Request> request) : request_(std::move(request)) {}

namespace {
detail::Request& checked(const std::shared_ptr<detail::Request>& r) {
  if (!r) LOOM_THROW(ErrorCode::InvalidUsage, -1, "wait/test on an empty Work");
  return *r;
}
}  // namespace

bool Work::test() { return checked(request_).test(); }
void Work::wait() { checked(request_).wait(); }
void Work::wait(std::chrono::milliseconds timeout) { checked(request_).wait(timeout); }
size_t Work::bytes() const { return request_ ? request_->bytes() : 0; }

int Work::source() const { return request_ ? request_->source() : -1; }

void Work::onCompletion(std::function<void(std::exception_ptr)> fn) {
  detail::Request& r = checked(request_);
  const int rank = r.rank();
  r.onDone(
      [fn = std::move(fn), rank](const Status& s) { fn(s.ok ? nullptr : std::make_exception_ptr(s.toError(rank))); });
}

void waitAll(std::vector<Work>& works) {
  for (auto& w : works) w.wait();
}

// ---- Communicator ----

namespace {

void checkRankSize(int rank, int size) {
  if (size < 1) LOOM_THROW(ErrorCode::InvalidArgument, -1, strFormat("world size %d is not positive", size));
  if (rank < 0 || rank >= size) {
    LOOM_THROW(ErrorCode::InvalidArgument, rank, strFormat("rank %d is out of range for world size %d", rank, size));
  }
}

}  // namespace

Communicator::Communicator(std::unique_ptr<detail::CommImpl> impl) : impl_(std::move(impl)) {}

namespace {
// Joins this rank through `access` and tunes the links where asked: every way a communicator is
// made (a unique id, a launcher, shrink, split, group) ends here.
std::unique_ptr<detail::CommImpl> joinThrough(int rank, int size, StoreAccess access, const Options& options,
                                              const std::string& origin, detail::Meeting* meeting = nullptr) {
  auto impl = std::make_unique<detail::CommImpl>(rank, size, std::move(access), options, origin, meeting);
  detail::tuneLinksIfAsked(*impl);
  return impl;
}
}  // namespace

Communicator::Communicator(int rank, int size, const UniqueId& id, const Options& options) {
  checkRankSize(rank, size);
  LogRankScope scope(rank);
  UniqueIdFields f;
  std::string why;
  if (!decodeUniqueId(id.bytes().data(), id.bytes().size(), &f, &why)) {
    LOOM_THROW(ErrorCode::InvalidArgument, rank, "invalid unique id: " + why);
  }
  Deadline deadline(detail::initTimeoutOf(options));
  auto access = connectWithUniqueId(f, rank, deadline, detail::opTimeoutOf(options));
  impl_ = joinThrough(rank, size, std::move(access), options, "unique id");
}

Communicator Communicator::fromEnv(const Options& options) {
  LaunchInfo launch = detectLaunch(processEnv());
  LogRankScope scope(launch.rank);
  for (const auto& [field, value] : launch.provenance) LOOM_TRACE("launch: %s = %s", field.c_str(), value.c_str());
  Deadline deadline(detail::initTimeoutOf(options));
  auto access = connectFromLaunch(launch, deadline, detail::opTimeoutOf(options));
  return Communicator(joinThrough(
      launch.rank, launch.size, std::move(access), options,
      strFormat("launcher %s, store at %s:%d", launch.launcher.c_str(), launch.masterAddr.c_str(), launch.masterPort)));
}

Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;
Communicator::~Communicator() = default;

namespace {
detail::CommImpl& live(const std::unique_ptr<detail::CommImpl>& impl) {
  if (!impl) {
    LOOM_THROW(ErrorCode::InvalidUsage, -1,
               "the communicator is empty: moved from, or split with kSplitNoColor (check valid())");
  }
  return *impl;
}
// The options of a communicator made from `c`: c's own, or `given`, in c's reproducible mode unless
// `given` says otherwise (the mode is read once, when the first communicator is made).
Options childOptions(const detail::CommImpl& c, const Options* given = nullptr) {
  Options o = given != nullptr ? *given : c.options();
  if (o.reproducible < 0) o.reproducible = c.reproducible() ? 1 : 0;
  return o;
}
}  // namespace

Communicator Communicator::shrink(std::chrono::milliseconds wait) {
  auto& c = live(impl_);
  int rank = 0, size = 0;
  StoreAccess access = c.shrinkAccess(wait, &rank, &size);
  LogRankScope scope(rank);
  return Communicator(joinThrough(rank, size, std::move(access), childOptions(c),
                                  strFormat("shrunk from communicator \"%s\"", c.name().c_str())));
}

Communicator Communicator::split(int color, int key) {
  auto& c = live(impl_);
  if (color < 0 && color != kSplitNoColor) {
    LOOM_THROW(ErrorCode::InvalidArgument, c.rank(),
               strFormat("split: color %d is negative (colors are 0 or more; kSplitNoColor to take no part)", color));
  }
  // Every rank's color and key, through this communicator's own links: the split takes its place
  // among the collectives (a rank that calls another one instead is named at once).
  const int32_t mine[2] = {color, key};
  std::vector<int32_t> all(2 * static_cast<size_t>(c.size()));
  allGather(mine, all.data(), 2, DataType::Int32);
  StoreAccess access = c.splitAccess(color);
  // The new communicators meet through this one's links (no rendezvous in the store), and every
  // rank here takes part, those passing kSplitNoColor too.
  std::vector<std::pair<int32_t, int>> members;  // (key, rank here), in the new rank order
  if (color != kSplitNoColor)
    for (int r = 0; r < c.size(); ++r)
      if (all[2 * static_cast<size_t>(r)] == color) members.emplace_back(all[2 * static_cast<size_t>(r) + 1], r);
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;
  for (const auto& m : members) ranks.push_back(m.second);
  detail::SplitMeeting meeting(*this, ranks);
  if (color == kSplitNoColor) {
    const Deadline deadline(detail::initTimeoutOf(c.options()));
    meeting.swap({}, "", deadline, false);
    meeting.done("", deadline);
    return Communicator(nullptr);
  }
  const int newRank = static_cast<int>(std::find(ranks.begin(), ranks.end(), c.rank()) - ranks.begin());
  LogRankScope scope(newRank);
  return Communicator(joinThrough(
      newRank, static_cast<int>(members.size()), std::move(access), childOptions(c),
      strFormat("split from communicator \"%s\" (rank %d there, color %d)", c.name().c_str(), c.rank(), color),
      &meeting));
}

Communicator Communicator::group(const std::vector<int>& ranks, const std::string& name, const Options* options) {
  auto& c = live(impl_);
  std::vector<int> seen = ranks;
  std::sort(seen.begin(), seen.end());
  for (size_t i = 0; i < seen.size(); ++i) {
    c.checkPeer(seen[i], "group");
    if (i > 0 && seen[i] == seen[i - 1])
      LOOM_THROW(ErrorCode::InvalidArgument, c.rank(), strFormat("group: rank %d is listed twice", seen[i]));
  }
  const auto me = std::find(ranks.begin(), ranks.end(), c.rank());
  if (me == ranks.end()) {
    LOOM_THROW(
        ErrorCode::InvalidArgument, c.rank(),
        strFormat("group \"%s\": this rank (%d) is not among its ranks; only they call it", name.c_str(), c.rank()));
  }
  const int newRank = static_cast<int>(me - ranks.begin());
  StoreAccess access = c.groupAccess(ranks, name);
  LogRankScope scope(newRank);
  return Communicator(joinThrough(
      newRank, static_cast<int>(ranks.size()), std::move(access), childOptions(c, options),
      strFormat("group \"%s\" of communicator \"%s\" (rank %d there)", name.c_str(), c.name().c_str(), c.rank())));
}

int Communicator::rank() const { return live(impl_).rank(); }
int Communicator::size() const { return live(impl_).size(); }
int Communicator::localRank() const { return live(impl_).localRank(); }
int Communicator::localSize() const { return live(impl_).localSize(); }
int Communicator::nodeCount() const { return live(impl_).nodeCount(); }
int Communicator::nodeOf(int rank) const {
  auto& c = live(impl_);
  c.checkPeer(rank, "nodeOf");
  return c.nodeOf(rank);
}
std::string Communicator::transportOf(int peer) const {
  auto& c = live(impl_);
  c.checkPeer(peer, "transportOf");
  return c.transportOf(peer);
}
std::string Communicator::describeLink(int peer) const {
  auto& c = live(impl_);
  c.checkPeer(peer, "describeLink");
  return c.describeLink(peer);
}
int Communicator::linkCount() const { return live(impl_).linkCount(); }
const std::string& Communicator::name() const { return live(impl_).name(); }
bool Communicator::reproducible() const { return live(impl_).reproducible(); }
std::chrono::milliseconds Communicator::timeout() const { return live(impl_).timeout(); }
void Communicator::checkError() const { live(impl_).checkOk(); }
void Communicator::finalize() {
  auto& c = live(impl_);
  // The op queue runs in call order: an empty op completes once every op queued before it has.
  c.submitUnnumbered("finalize", [](detail::Request&) -> size_t { return 0; })->wait();
  c.checkOk();
}
void Communicator::abort() {
  if (impl_) impl_->abort();
}

Work Communicator::ibarrier() {
  auto& c = live(impl_);
  const uint64_t sig = makeSignature(SigKind::Barrier, DataType::Uint8, ReduceOp::Sum, 0, 0);
  return Work(c.submit(
      "barrier", [&c](int64_t seq) { c.barrierBody(seq); }, sig));
}
void Communicator::monitoredBarrier(std::chrono::milliseconds timeout, bool waitAll) {
  auto& c = live(impl_);
  if (timeout.count() <= 0) timeout = c.timeout();
  c.run(
      "monitored_barrier", [&c, timeout, waitAll](int64_t seq) { c.monitoredBarrierBody(seq, timeout, waitAll); },
      makeSignature(SigKind::Barrier, DataType::Uint8, ReduceOp::Sum, 1, 0));
}
void Communicator::barrier() {
  auto& c = live(impl_);
  c.run(
      "barrier", [&c](int64_t seq) { c.barrierBody(seq); },
      makeSignature(SigKind::Barrier, DataType::Uint8, ReduceOp::Sum, 0, 0));
}

}  // namespace loom
