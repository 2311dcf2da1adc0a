# Warnings for strata's own targets (not for dependencies).
set(STRATA_WARNINGS -Wall -Wextra -Wshadow=local -Wno-unused-parameter)
if(STRATA_WERROR)
  list(APPEND STRATA_WARNINGS -Werror)
endif()
function(strata_target_warnings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${STRATA_WARNINGS}>)
endfunction()
