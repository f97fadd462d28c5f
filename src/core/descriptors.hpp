// File descriptors as a resource: a communicator that links many peers over sockets needs one or
// more per link, and the default soft limit (often 1,024) is far below the hard limit on most
// systems. Rather than fail deep inside a handshake with EMFILE, the link table asks here first.
#pragma once

#include <cstddef>
#include <string>

namespace loom {

/// Descriptors this process has open now (a count of /proc/self/fd; 0 where it cannot be read).
size_t openDescriptors();

/// Makes room for `more` descriptors beyond those open now and those promised to other callers
/// (ranks as threads of one process connect at once): raises the soft RLIMIT_NOFILE toward the
/// hard limit when it is short (logged at INFO). Returns "" when there is room, and the room is
/// promised until releaseDescriptors(more) (once they are open, they count as such); else why
/// not (the count, the limits), for an error message, and nothing is promised. Thread-safe.
/// With mustFit false (room wanted, not needed: a shortage is only worth a log line) it returns ""
/// without counting where the soft limit cannot be raised anyway.
std::string makeRoomForDescriptors(size_t more, bool mustFit = true);
void releaseDescriptors(size_t more);

}  // namespace loom
