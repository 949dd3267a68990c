// Checks done before any backend connects, so that a missing rank or interface is named.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace shardtrain::detail {

// Announces group rank `rank` of `group` (whose members have the global ranks `members`) in
// the store, then waits until every member has announced itself. On timeout throws an error
// naming the global ranks that never joined.
void wait_for_members(c10d::Store& store, const std::string& group, int rank,
                      const std::vector<int>& members, std::chrono::milliseconds timeout);

// Throws std::invalid_argument naming `name` when this host has no network interface of that
// name (--iface, GLOO_SOCKET_IFNAME); "" is "none chosen".
void check_interface(const std::string& name);

// "0,1,2" for {0,1,2}.
std::string join_ranks(const std::vector<int>& ranks);

// The first line of an error's text (c10's errors carry a backtrace after it).
inline std::string first_line(const std::string& what) { return what.substr(0, what.find('\n')); }

// The value a store holds for `text`, and the text of a value read from a store.
inline std::vector<uint8_t> store_value(const std::string& text) {
  return {text.begin(), text.end()};
}
inline std::string store_text(const std::vector<uint8_t>& value) {
  return {value.begin(), value.end()};
}

}  // namespace shardtrain::detail
