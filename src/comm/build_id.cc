// Which Loom this is: its version and commit, and the digest of the public headers it was built
// with (tools/build_id.py), for programs and extensions that check what they load.
#include "loom/loom.h"
#include "loom_build_id.h"
#include "loom_config.h"

extern "C" {

const char* loomGetBuildId(void) { return LOOM_VERSION_STRING "+" LOOM_BUILD_COMMIT; }

const char* loomGetHeadersDigest(void) { return LOOM_HEADERS_DIGEST; }

}  // extern "C"
