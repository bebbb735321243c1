# smp_lines_of(<path> <out>): the file's lines as a CMake list, one element per
# line, with what CMake's list splitting treats specially neutralised
# (backslashes become '/', brackets and ';' become '_').
function(smp_lines_of path out)
  file(READ "${path}" text)
  string(REPLACE "\\" "/" text "${text}")
  string(REGEX REPLACE "[][;]" "_" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()
