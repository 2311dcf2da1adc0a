# Every dependency is a Debian package installed by scripts/setup.sh; nothing is downloaded.
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(PkgConfig REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
if(STRATA_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
endif()
if(STRATA_BUILD_BENCH)
  find_package(benchmark CONFIG REQUIRED)
endif()
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)  # tokenizer pre-splitting (Unicode classes)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)  # core topology; pins the compute threads
