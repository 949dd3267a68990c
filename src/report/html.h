// Small HTML and number-formatting helpers for the report page.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "report/run_data.h"

namespace shardtrain::detail {

// Text made safe for HTML and SVG (XML) element content and attribute values.
std::string escape_html(const std::string& text);

// "27.5 MiB" (GiB from 10 GiB up); "" for NaN.
std::string format_bytes(double bytes);
// "850 µs", "12.3 ms", "1.25 s", "2 h 03 min"; "" for NaN.
std::string format_seconds(double seconds);
// "42.1 %" of a fraction; "" for NaN.
std::string format_percent(double fraction);
// "989 TFLOP/s", "61.2 GFLOP/s".
std::string format_flops(double flops_per_s);
// Three significant digits, or an integer with thousands separated ("12 345").
std::string format_number(double value);
// A JSON leaf as a table cell: strings bare, numbers and literals as JSON writes them.
std::string format_leaf(const ojson& value);

// A table: a header row, then rows of cells already escaped or formatted. `numeric_from`: the
// first column aligned right.
std::string html_table(const std::vector<std::string>& header,
                       const std::vector<std::vector<std::string>>& rows, size_t numeric_from = 1,
                       const std::string& css_class = "");

// A value of a metrics row: NaN when null or not a number.
inline double number_at(const std::vector<ojson>& row, int column) {
  if (column < 0 || static_cast<size_t>(column) >= row.size()) return NAN;
  const ojson& v = row[static_cast<size_t>(column)];
  return v.is_number() ? v.get<double>() : NAN;
}

}  // namespace shardtrain::detail
