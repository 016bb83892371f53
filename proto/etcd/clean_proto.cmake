# Makes a compilable copy of one of etcd's .proto files: cmake -DIN=... -DOUT=... -P clean_proto.cmake
#
# etcd's protos import gogoproto/gogo.proto and google/api/annotations.proto, which Debian does not
# ship for C++. They only add Go code-generation options and REST gateway routes; the wire format
# depends on field numbers and types alone, so dropping the imports and those options leaves
# messages that etcd reads and writes unchanged.
file(READ "${IN}" text)
string(REGEX REPLACE "import \"gogoproto/gogo.proto\";" "" text "${text}")
string(REGEX REPLACE "import \"google/api/annotations.proto\";" "" text "${text}")
# option (gogoproto.x) = y;
string(REGEX REPLACE "option \\(gogoproto\\.[a-z_]+\\) = [a-z]+;" "" text "${text}")
# [(gogoproto.x) = y] and [(gogoproto.x) = y, (gogoproto.z) = w] on fields
string(REGEX REPLACE "\\[\\(gogoproto\\.[^]]*\\]" "" text "${text}")
# option (google.api.http) = { post: "..." body: "*" [additional_bindings { ... }] };
string(REGEX REPLACE "option \\(google\\.api\\.http\\) = {([^{}]*{[^{}]*})*[^{}]*};" "" text
       "${text}")
if(text MATCHES "gogoproto|google\\.api")
  message(FATAL_ERROR "${IN}: an option of gogoproto or google.api is left after cleaning")
endif()
file(WRITE "${OUT}" "${text}")
