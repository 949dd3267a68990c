#include "report/html.h"

#include <cstdio>

namespace shardtrain::detail {

std::string escape_html(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {

std::string printf_text(const char* format, double value, const char* unit = "") {
  char text[64];
  std::snprintf(text, sizeof(text), format, value, unit);
  return text;
}

}  // namespace

std::string format_bytes(double bytes) {
  if (std::isnan(bytes)) return "";
  const double mib = bytes / (1024.0 * 1024.0);
  if (mib >= 10 * 1024) return printf_text("%.2f GiB", mib / 1024);
  return printf_text(mib >= 100 ? "%.0f MiB" : "%.1f MiB", mib);
}

std::string format_seconds(double s) {
  if (std::isnan(s)) return "";
  if (s == 0) return "0 s";
  if (s < 1e-3) return printf_text("%.0f µs", s * 1e6);
  if (s < 1) return printf_text(s < 0.1 ? "%.2f ms" : "%.1f ms", s * 1e3);
  if (s < 600) return printf_text(s < 10 ? "%.3f s" : "%.1f s", s);
  const long minutes = std::lround(s / 60);
  char text[64];
  if (minutes < 60) {
    std::snprintf(text, sizeof(text), "%ld min %02ld s", static_cast<long>(s) / 60,
                  static_cast<long>(s) % 60);
  } else {
    std::snprintf(text, sizeof(text), "%ld h %02ld min", minutes / 60, minutes % 60);
  }
  return text;
}

std::string format_percent(double fraction) {
  if (std::isnan(fraction)) return "";
  return printf_text(fraction < 0.1 ? "%.2f %%" : "%.1f %%", fraction * 100);
}

std::string format_flops(double f) {
  if (f >= 1e12) return printf_text("%.4g TFLOP/s", f / 1e12);
  if (f >= 1e9) return printf_text("%.4g GFLOP/s", f / 1e9);
  return printf_text("%.4g MFLOP/s", f / 1e6);
}

std::string format_number(double v) {
  if (std::isnan(v)) return "";
  if (std::abs(v) >= 1000 && std::abs(v) < 1e15) {
    // An integer with thin groups: 12 345
    std::string digits = std::to_string(std::llround(std::abs(v)));
    std::string out;
    for (size_t i = 0; i < digits.size(); ++i) {
      if (i && (digits.size() - i) % 3 == 0) out += "\u202f";
      out += digits[i];
    }
    return (v < 0 ? "-" : "") + out;
  }
  return printf_text("%.4g", v);
}

std::string format_leaf(const ojson& value) {
  if (value.is_string()) return value.get<std::string>();
  return value.dump();
}

std::string html_table(const std::vector<std::string>& header,
                       const std::vector<std::vector<std::string>>& rows, size_t numeric_from,
                       const std::string& css_class) {
  std::string out =
      "<table" + (css_class.empty() ? "" : " class=\"" + css_class + "\"") + "><thead><tr>";
  for (size_t i = 0; i < header.size(); ++i) {
    out += i >= numeric_from ? "<th class=\"num\">" : "<th>";
    out += header[i] + "</th>";
  }
  out += "</tr></thead><tbody>\n";
  for (const auto& row : rows) {
    out += "<tr>";
    for (size_t i = 0; i < row.size(); ++i) {
      out += i >= numeric_from ? "<td class=\"num\">" : "<td>";
      out += row[i] + "</td>";
    }
    out += "</tr>\n";
  }
  return out + "</tbody></table>\n";
}

}  // namespace shardtrain::detail
