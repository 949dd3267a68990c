// Expert parallelism's dispatch and combine: each MoE layer's rows, grouped by expert, go to the
// ranks that hold their experts by all-to-all (the counts first, since every rank routes its
// own tokens), and the experts' outputs come back the same way. Both are autograd functions
// whose backward is the opposite exchange.
#include <torch/autograd.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "parallel/autograd_group.h"
#include "parallel/expert/expert_parallel.h"

namespace shardtrain {
namespace detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// `sent[r]` rows of `rows` to rank r, in order; `received[r]` rows from rank r, in rank order.
at::Tensor exchange(const at::Tensor& rows, ProcessGroup& group, const std::vector<int64_t>& sent,
                    const std::vector<int64_t>& received) {
  std::vector<int64_t> shape = rows.sizes().vec();
  shape[0] = std::accumulate(received.begin(), received.end(), int64_t{0});
  at::Tensor out = at::empty(shape, rows.options());
  group.all_to_all(rows.contiguous(), out, sent, received)->wait();
  return out;
}

class AllToAllRows : public torch::autograd::Function<AllToAllRows> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, int64_t group,
                            const std::vector<int64_t>& sent,
                            const std::vector<int64_t>& received) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["sent"] = sent;
    ctx->saved_data["received"] = received;
    ctx->saved_data["width"] = rows.numel() / std::max<int64_t>(rows.size(0), 1);
    ctx->saved_data["dtype"] = static_cast<int64_t>(rows.scalar_type());
    return exchange(rows, detail::saved_group(ctx), sent, received);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> sent = ctx->saved_data["sent"].toIntVector();
    const std::vector<int64_t> received = ctx->saved_data["received"].toIntVector();
    // Every rank takes part in the exchange back, even with no gradient for these rows.
    at::Tensor grad = grads[0];
    if (!grad.defined()) {
      const int64_t rows = std::accumulate(received.begin(), received.end(), int64_t{0});
      grad = at::zeros({rows, ctx->saved_data["width"].toInt()},
                       static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt()));
    }
    return {exchange(grad, detail::saved_group(ctx), received, sent), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

// The identity, whose backward multiplies the gradient by `factor`.
class ScaleGradient : public torch::autograd::Function<ScaleGradient> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double factor) {
    ctx->saved_data["factor"] = factor;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const double factor = ctx->saved_data["factor"].toDouble();
    return {grads[0].defined() ? grads[0] * factor : grads[0], at::Tensor()};
  }
};

// Where dispatch()'s rows went: rows per peer each way, and the order that groups the rows
// that arrived (peer by peer) by local expert, with its inverse.
struct Route {
  std::vector<int64_t> sent, received;
  at::Tensor by_expert, by_peer;
};

class AllToAllSplit : public ExpertSplit {
 public:
  AllToAllSplit(std::shared_ptr<ProcessGroup> group, int64_t n_experts)
      : group_(std::move(group)), n_experts_(n_experts), local_(n_experts / group_->size()) {}

  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }

  Received dispatch(const at::Tensor& rows, const std::vector<int64_t>& counts) const override {
    TORCH_CHECK(static_cast<int64_t>(counts.size()) == n_experts_,
                "expert dispatch: ", counts.size(), " counts for ", n_experts_, " experts");
    const int peers = group_->size();
    // What each peer sends to each of this rank's experts: counts[e] of every rank, for the
    // experts e this rank holds, peer by peer.
    at::Tensor theirs = at::empty({n_experts_}, at::kLong);
    group_->all_to_all(at::tensor(counts, at::kLong), theirs, {}, {})->wait();
    const int64_t* from = theirs.data_ptr<int64_t>();
    auto route = std::make_shared<Route>();
    Received out;
    out.counts.assign(static_cast<size_t>(local_), 0);
    for (int peer = 0; peer < peers; ++peer) {
      int64_t sent = 0, received = 0;
      for (int64_t l = 0; l < local_; ++l) {
        sent += counts[static_cast<size_t>(peer * local_ + l)];
        received += from[peer * local_ + l];
        out.counts[static_cast<size_t>(l)] += from[peer * local_ + l];
      }
      route->sent.push_back(sent);
      route->received.push_back(received);
    }
    // Arrived peer by peer, each peer's rows by expert; the experts take theirs together.
    std::vector<int64_t> start(static_cast<size_t>(peers * local_));
    int64_t at = 0;
    for (int64_t i = 0; i < peers * local_; ++i) {
      start[static_cast<size_t>(i)] = at;
      at += from[i];
    }
    std::vector<int64_t> order;
    order.reserve(static_cast<size_t>(at));
    for (int64_t l = 0; l < local_; ++l) {
      for (int peer = 0; peer < peers; ++peer) {
        const int64_t first = start[static_cast<size_t>(peer * local_ + l)];
        for (int64_t k = 0; k < from[peer * local_ + l]; ++k) order.push_back(first + k);
      }
    }
    const auto index = at::TensorOptions(at::kLong).device(rows.device());
    route->by_expert = at::tensor(order, at::kLong).to(index.device());
    route->by_peer = at::empty_like(route->by_expert)
                         .index_copy_(0, route->by_expert,
                                      at::arange(static_cast<int64_t>(order.size()), index));
    const at::Tensor arrived =
        AllToAllRows::apply(rows, detail::group_handle(*group_), route->sent, route->received);
    // The experts' gradients are averaged over the data-parallel ranks that hold the same
    // experts (the expert mesh), not over every data-parallel rank as the rest of the model's
    // are, yet they are sums over the tokens of all `peers` ranks: the gradient through the
    // experts is divided by the group's size on the way in and multiplied back on the way out,
    // which leaves every activation's gradient as it was and the experts' averaged over all.
    out.rows =
        ScaleGradient::apply(arrived.index_select(0, route->by_expert), static_cast<double>(peers));
    out.route = std::move(route);
    return out;
  }

  void sum_across(at::Tensor& x) const override { group_->all_reduce(x, ReduceOp::kSum)->wait(); }

  at::Tensor combine(const at::Tensor& outputs, const Received& received) const override {
    const auto& route = *std::static_pointer_cast<Route>(received.route);
    const at::Tensor scaled =
        ScaleGradient::apply(outputs, 1.0 / static_cast<double>(group_->size()));
    return AllToAllRows::apply(scaled.index_select(0, route.by_peer), detail::group_handle(*group_),
                               route.received, route.sent);
  }

 private:
  std::shared_ptr<ProcessGroup> group_;
  int64_t n_experts_, local_;
};

// "...moe.experts.{e}.rest" -> ("...moe.experts.", e, ".rest"); e = -1 for other names.
struct ExpertName {
  std::string prefix, suffix;
  int64_t expert = -1;
};
ExpertName parse_expert(const std::string& name) {
  static const std::string marker = ".moe.experts.";
  ExpertName out;
  const size_t at = name.find(marker);
  if (at == std::string::npos) return out;
  const size_t begin = at + marker.size();
  const size_t end = name.find('.', begin);
  if (end == std::string::npos) return out;
  out.prefix = name.substr(0, begin);
  out.suffix = name.substr(end);
  out.expert = std::stoll(name.substr(begin, end - begin));
  return out;
}

}  // namespace

std::shared_ptr<ExpertSplit> make_expert_split(std::shared_ptr<ProcessGroup> group,
                                               int64_t n_experts) {
  if (n_experts % group->size() != 0) {
    throw std::invalid_argument(std::to_string(n_experts) + " experts do not divide over ep=" +
                                std::to_string(group->size()) + " ranks");
  }
  return std::make_shared<AllToAllSplit>(std::move(group), n_experts);
}

bool is_expert_tensor(const std::string& name) { return parse_expert(name).expert >= 0; }

std::vector<TensorSpec> with_every_expert(const std::vector<TensorSpec>& specs, int64_t n_experts) {
  std::vector<TensorSpec> out;
  std::vector<std::string> done;  // prefix + suffix of the expert tensors listed
  for (const TensorSpec& spec : specs) {
    const ExpertName name = parse_expert(spec.name);
    if (name.expert < 0) {
      out.push_back(spec);
      continue;
    }
    const std::string key = name.prefix + "*" + name.suffix;
    if (std::find(done.begin(), done.end(), key) != done.end()) continue;
    done.push_back(key);
    for (int64_t e = 0; e < n_experts; ++e) {
      TensorSpec each = spec;
      each.name = name.prefix + std::to_string(e) + name.suffix;
      out.push_back(std::move(each));
    }
  }
  return out;
}

}  // namespace detail

void limit_to_own_experts(ModelParts& parts, const ModelConfig& config, int ep_rank, int ep) {
  if (ep == 1) return;
  parts.experts = config.n_experts / ep;
  parts.first_expert = ep_rank * parts.experts;
}

void apply_ep(Transformer& model, const DeviceMesh& mesh) {
  if (mesh.ep_size() == 1) return;
  const int64_t n_experts = model->config().n_experts;
  if (model->parts().experts != n_experts / mesh.ep_size()) {
    throw std::invalid_argument("expert parallelism over ep=" + std::to_string(mesh.ep_size()) +
                                " needs the model built with its rank's experts only "
                                "(limit_to_own_experts)");
  }
  model->set_expert_split(detail::make_expert_split(mesh.ep_ptr(), n_experts));
}

}  // namespace shardtrain
