// printf-style formatting into std::string, and errno text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace loom {

/// Formats like printf into a new string.
std::string strFormat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
/// strerror_r of `err` as a string.
std::string errnoText(int err);
/// Lower-case hex of n bytes.
std::string hexOf(const uint8_t* p, size_t n);
/// "1.50 GiB" style size text.
std::string bytesText(uint64_t bytes);

}  // namespace loom
