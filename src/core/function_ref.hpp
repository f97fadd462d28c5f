// FunctionRef: a non-owning reference to something callable, for functions that call what they are
// given before they return and keep nothing. Unlike std::function it never allocates: a blocking
// collective's fast path passed its body through two std::function objects (two heap allocations
// per call, a tenth of an 8-byte all-reduce's time on one rank).
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace loom {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  /// Refers to `f`, which must outlive every call through this reference.
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef> &&
                                                    std::is_invocable_r_v<R, F&, Args...>>>
  FunctionRef(F&& f) noexcept  // NOLINT(google-explicit-constructor): converts like std::function
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))), call_([](void* o, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace loom
