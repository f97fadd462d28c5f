// docs/settings.md, made from the settings' own declarations (core/param.hpp): every LOOM_*
// variable the library reads, grouped by the folder that declares it, with its default and
// meaning. `loom-info --env --markdown` prints it; the docs check (tools/check_docs) fails CI when
// the committed file differs, so the manual cannot fall behind the code.
#pragma once

#include <string>
#include <vector>

#include "core/param.hpp"

namespace loom::tools {

/// The whole of docs/settings.md for `params` (as allParams() returns them).
std::string settingsMarkdown(const std::vector<ParamInfo>& params);

}  // namespace loom::tools
