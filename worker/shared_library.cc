// libhybridps.so is made of the worker's static libraries (worker/CMakeLists.txt); this
// file only gives the target a source of its own.
namespace hybridps {
namespace internal {
int shared_library_anchor = 0;
}  // namespace internal
}  // namespace hybridps
