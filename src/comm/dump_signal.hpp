// On-demand dump by signal: with LOOM_DUMP_SIGNAL set (USR1, USR2 or a number), that signal makes
// every live communicator of the process print, to stderr, its recent collectives (its flight
// record) and, when it is inside a collective, the hang report gathered from every rank (as
// `loom-info --dump` does from outside). `pkill -USR1 -f train.py` then shows each rank's view.
//
// The handler only writes a byte to a pipe (async-signal-safe); a watcher thread, started with the
// first communicator, does the printing. Off by default: a library does not take a signal the
// application may use.
#pragma once

#include <string>

namespace loom {
namespace detail {

class CommImpl;

/// Adds a communicator to those dumped (and installs the handler the first time, if configured).
void registerForDump(CommImpl* comm);
/// Removes it; after this returns, no dump reads it.
void unregisterForDump(CommImpl* comm);
/// The signal number LOOM_DUMP_SIGNAL names (0: off, -1: unreadable).
int dumpSignalNumber(const std::string& text);

}  // namespace detail
}  // namespace loom
