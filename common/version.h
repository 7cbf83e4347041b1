// The version of hybridps this build is: what every binary's --version prints, what
// hybridps.__version__ says, and what the connection handshake compares, so that a job
// whose processes run different versions fails at its start, naming both.
#ifndef HYBRIDPS_COMMON_VERSION_H_
#define HYBRIDPS_COMMON_VERSION_H_

namespace hybridps {

// "0.1.0": read by CMake from mxnet_kvstore/hybridps/_version.py, its one source.
const char* Version();

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_VERSION_H_
