# What `cmake --install` puts where, in two components:
#   cpp    (for C++ users): bin/ hybridps-scheduler, hybridps-server, hybridrun;
#          lib/ libhybridps.so, the CMake package (find_package(hybridps)), hybridrun's
#          Python package; include/hybridps/ the public headers.
#   python (what the wheel holds, scikit-build-core installs it into site-packages):
#          the package hybridps with its binaries in hybridps/bin/, the extension
#          _hybridps_core, and hybridps.pth (the hook that explains a forgotten
#          `import hybridps.mxnet`).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# ---- cpp ------------------------------------------------------------------------------
install(TARGETS hybridps-scheduler hybridps-server RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        COMPONENT cpp)
install(TARGETS hybridps_shared EXPORT hybridpsTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT cpp
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/hybridps)
foreach(header worker/kvstore.h worker/handle.h worker/process_set.h common/options.h common/dtype.h common/spin.h
               common/clock.h common/compression.h
               optimizers/update_rule.h optimizers/lr_schedule.h)
  get_filename_component(dir "${header}" DIRECTORY)
  install(FILES "${PROJECT_SOURCE_DIR}/${header}"
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/hybridps/${dir} COMPONENT cpp)
endforeach()
set(HYBRIDPS_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/hybridps)
install(EXPORT hybridpsTargets NAMESPACE hybridps:: DESTINATION ${HYBRIDPS_CMAKE_DIR}
        COMPONENT cpp)
configure_package_config_file(cmake/hybridpsConfig.cmake.in
  "${PROJECT_BINARY_DIR}/hybridpsConfig.cmake" INSTALL_DESTINATION ${HYBRIDPS_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_BINDIR)
# 0.x: a minor version may change the API, so only the same minor version is compatible.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/hybridpsConfigVersion.cmake"
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/hybridpsConfig.cmake"
              "${PROJECT_BINARY_DIR}/hybridpsConfigVersion.cmake"
        DESTINATION ${HYBRIDPS_CMAKE_DIR} COMPONENT cpp)
# hybridrun: its Python package (the pure-Python part of hybridps) under lib/hybridps/, and
# bin/hybridrun, which runs it and finds the binaries beside itself.
install(DIRECTORY "${PROJECT_SOURCE_DIR}/mxnet_kvstore/hybridps"
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/hybridps/python COMPONENT cpp
        PATTERN "__pycache__" EXCLUDE)
configure_file(cmake/hybridrun.in "${PROJECT_BINARY_DIR}/hybridrun" @ONLY)
install(PROGRAMS "${PROJECT_BINARY_DIR}/hybridrun" DESTINATION ${CMAKE_INSTALL_BINDIR}
        COMPONENT cpp)

# ---- python (the wheel) ---------------------------------------------------------------
# Only when asked for by name (scikit-build-core does): a plain `cmake --install` must not
# put a Python package at the prefix's root.
install(DIRECTORY "${PROJECT_SOURCE_DIR}/mxnet_kvstore/hybridps" DESTINATION .
        COMPONENT python EXCLUDE_FROM_ALL PATTERN "__pycache__" EXCLUDE)
install(TARGETS hybridps-scheduler hybridps-server RUNTIME DESTINATION hybridps/bin
        COMPONENT python EXCLUDE_FROM_ALL)
if(TARGET _hybridps_core)
  install(TARGETS _hybridps_core LIBRARY DESTINATION . COMPONENT python EXCLUDE_FROM_ALL)
endif()
install(FILES "${PROJECT_SOURCE_DIR}/cmake/hybridps.pth" DESTINATION . COMPONENT python
        EXCLUDE_FROM_ALL)
