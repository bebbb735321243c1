# Runs a command and passes only when both its exit status and its output are
# the expected ones (ctest's PASS_REGULAR_EXPRESSION alone ignores the exit
# status, so a crash that printed the right words would pass).
#
#   cmake -DEXIT=0|nonzero -DREGEX=<regex> -P expect_output.cmake -- <command> [args...]
# (after "--" cmake leaves the arguments alone: a -D or -P of the command would
# otherwise be taken as cmake's own)
if(NOT DEFINED EXIT OR NOT DEFINED REGEX)
  message(FATAL_ERROR "expect_output: give -DEXIT=0|nonzero and -DREGEX=<regex>")
endif()
set(cmd)
set(after_script FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  if(after_script)
    string(REPLACE ";" "\\;" arg "${CMAKE_ARGV${i}}")  # one argument, even with a ';' in it
    list(APPEND cmd "${arg}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(after_script TRUE)
  endif()
endforeach()
if(NOT cmd)
  message(FATAL_ERROR "expect_output: no command after the script")
endif()
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
message("${all}")
if(EXIT STREQUAL "0")
  if(NOT rc STREQUAL "0")
    message(FATAL_ERROR "expect_output: exit status ${rc}, expected 0")
  endif()
elseif(rc STREQUAL "0" OR NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "expect_output: exit status '${rc}', expected a non-zero exit")
endif()
if(NOT all MATCHES "${REGEX}")
  message(FATAL_ERROR "expect_output: the output does not match: ${REGEX}")
endif()
