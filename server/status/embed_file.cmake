# cmake -DINPUT=page.html -DOUTPUT=page_html.cc -P embed_file.cmake: writes a .cc that defines
# zerod::status::StatusPageHtml() as the bytes of INPUT (as hex, so no byte of the page can end
# a string literal early).
file(READ "${INPUT}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REPEAT "0x[0-9a-f][0-9a-f]," 16 sixteen)
string(REGEX REPLACE "(${sixteen})" "\\1\n" bytes "${bytes}")
file(WRITE "${OUTPUT}.tmp"
"// Generated from ${INPUT} by embed_file.cmake; do not edit.\n"
"#include \"server/status/page_html.h\"\n\n"
"namespace zerod::status {\nnamespace {\n\n"
"constexpr unsigned char kPage[] = {\n${bytes}};\n\n"
"}  // namespace\n\n"
"std::string_view StatusPageHtml() {\n"
"  return std::string_view(reinterpret_cast<const char*>(kPage), sizeof(kPage));\n}\n\n"
"}  // namespace zerod::status\n")
# Only a changed page touches the .cc (and rebuilds what links it).
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
