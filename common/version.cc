#include "common/version.h"

namespace hybridps {

// One copy per binary, behind a tag: a test makes "another version's" binary by patching
// the bytes after the tag in a copy of a built one (tests/multiproc: mixed versions).
extern const char kVersionTag[];
__attribute__((used)) const char kVersionTag[] = "hybridps-version=" HYBRIDPS_VERSION_STRING;

const char* Version() { return kVersionTag + sizeof("hybridps-version=") - 1; }

}  // namespace hybridps
