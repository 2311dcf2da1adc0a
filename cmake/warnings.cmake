# Warnings for strata's own targets (not for dependencies).
# designated initializers that leave fields at their defaults are the style (STYLE.md 2)
set(STRATA_WARNINGS -Wall -Wextra -Wshadow=local -Wno-unused-parameter -Wno-missing-field-initializers)
if(STRATA_WERROR)
  list(APPEND STRATA_WARNINGS -Werror)
endif()
function(strata_target_warnings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${STRATA_WARNINGS}>)
endfunction()
