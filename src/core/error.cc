// loom::Error and the names of codes, datatypes and ops.
#include <cstring>

#include "core/format.hpp"
#include "core/status.hpp"

namespace loom {

const char* toString(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument:
      return "invalid argument";
    case ErrorCode::InvalidUsage:
      return "invalid usage";
    case ErrorCode::System:
      return "system error";
    case ErrorCode::Remote:
      return "remote error";
    case ErrorCode::Timeout:
      return "timeout";
    case ErrorCode::Aborted:
      return "aborted";
    case ErrorCode::Internal:
      return "internal error";
    case ErrorCode::Cuda:
      return "CUDA error";
  }
  return "unknown error";
}

const char* toString(DataType type) {
  switch (type) {
    case DataType::Int8:
      return "int8";
    case DataType::Uint8:
      return "uint8";
    case DataType::Int32:
      return "int32";
    case DataType::Uint32:
      return "uint32";
    case DataType::Int64:
      return "int64";
    case DataType::Uint64:
      return "uint64";
    case DataType::Float16:
      return "float16";
    case DataType::Float32:
      return "float32";
    case DataType::Float64:
      return "float64";
    case DataType::Bfloat16:
      return "bfloat16";
  }
  return "unknown-type";
}

const char* toString(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Prod:
      return "prod";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
    case ReduceOp::Avg:
      return "avg";
  }
  return "unknown-op";
}

size_t sizeOf(DataType type) {
  switch (type) {
    case DataType::Int8:
    case DataType::Uint8:
      return 1;
    case DataType::Float16:
    case DataType::Bfloat16:
      return 2;
    case DataType::Int32:
    case DataType::Uint32:
    case DataType::Float32:
      return 4;
    case DataType::Int64:
    case DataType::Uint64:
    case DataType::Float64:
      return 8;
  }
  return 0;
}

namespace {

std::string decorate(ErrorCode code, const std::string& message, int rank, int peer, int64_t seq) {
  std::string out = "loom ";
  out += toString(code);
  if (rank >= 0) out += strFormat(" on rank %d", rank);
  if (peer >= 0) out += strFormat(" (peer rank %d)", peer);
  if (seq >= 0) out += strFormat(" [collective #%lld]", static_cast<long long>(seq));
  out += ": ";
  out += message;
  return out;
}

std::string location(const char* file, int line) {
  if (file == nullptr) return "";
  const char* base = std::strrchr(file, '/');
  return strFormat("%s:%d", base != nullptr ? base + 1 : file, line);
}

}  // namespace

Error::Error(ErrorCode code, const std::string& message, int rank, int peer, int64_t seq, const char* file, int line)
    : std::runtime_error(decorate(code, message, rank, peer, seq)),
      code_(code),
      rank_(rank),
      peer_(peer),
      seq_(seq),
      message_(message),
      where_(location(file, line)) {}

Status statusFromCurrentException() {
  try {
    throw;
  } catch (const Error& e) {
    return Status::error(e.code(), e.message(), e.peer(), e.seq());
  } catch (const std::bad_alloc&) {
    return Status::error(ErrorCode::System, "out of memory");
  } catch (const std::exception& e) {
    return Status::error(ErrorCode::Internal, e.what());
  } catch (...) {
    return Status::error(ErrorCode::Internal, "unknown exception");
  }
}

}  // namespace loom
