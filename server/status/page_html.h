#ifndef ZEROD_SERVER_STATUS_PAGE_HTML_H_
#define ZEROD_SERVER_STATUS_PAGE_HTML_H_

// The status page (server/status/page.html), embedded into the binary at build time by
// embed_file.cmake: one self-contained file, since the browser may reach nothing but zerod.

#include <string_view>

namespace zerod::status {

std::string_view StatusPageHtml();

}  // namespace zerod::status

#endif  // ZEROD_SERVER_STATUS_PAGE_HTML_H_
