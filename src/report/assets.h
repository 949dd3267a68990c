// Files built into the library (cmake/EmbedFiles.cmake generates their definitions from the
// files named in CMakeLists.txt): uPlot's script, stylesheet and license from npm
// (scripts/setup.sh installs them into .deps/npm), and the report page's own script.
#pragma once

#include <string_view>

namespace shardtrain::detail {

std::string_view uplot_js();       // uplot/dist/uPlot.iife.min.js
std::string_view uplot_css();      // uplot/dist/uPlot.min.css
std::string_view uplot_license();  // uplot/LICENSE (MIT: the page carries it with the script)
std::string_view report_js();      // src/report/report.js

}  // namespace shardtrain::detail
