#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "optim/adam_state.h"
#include "shardtrain/optimizers.h"

namespace shardtrain {
namespace {

// ZeroOneAdam's counters, per parameter (DeepSpeed's state keys).
enum Counter : int64_t {
  kVarInterval,
  kVarCounter,
  kLocalInterval,
  kLocalCounter,
  kLrSum,
  kCounters
};

}  // namespace

ZeroOneAdam::ZeroOneAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                         torch::optim::AdamWOptions defaults, ZeroOneAdamOptions options)
    : CompressedMomentumOptimizer(std::move(param_groups), defaults, options.var_freeze_step,
                                  "ZeroOneAdam"),
      options_(options) {
  if (options_.var_update_scaler < 1 || options_.local_step_scaler < 1 ||
      options_.local_step_clipper < 1) {
    throw std::invalid_argument(
        "ZeroOneAdam: var_update_scaler, local_step_scaler and local_step_clipper must be >= 1");
  }
}

ZeroOneAdam::Local& ZeroOneAdam::local_of(const at::Tensor& param) const {
  const auto key = detail::optimizer_state_key(param);
  auto it = local_.find(key);
  if (it == local_.end()) {
    at::Tensor counters = at::zeros({kCounters}, at::kDouble);
    counters[kVarInterval] = 1;
    counters[kLocalInterval] = 1;
    it = local_.emplace(key, Local{at::zeros_like(param, at::MemoryFormat::Contiguous), counters})
             .first;
  }
  return it->second;
}

int64_t ZeroOneAdam::var_interval() const {
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) {
      if (state_.count(detail::optimizer_state_key(p))) {
        return static_cast<int64_t>(local_of(p).counters[kVarInterval].item<double>());
      }
    }
  }
  return 1;
}

bool ZeroOneAdam::compressing() const {
  // The next step (count updates() + 1) averages its gradients only at a variance update.
  const int64_t done = updates();
  return done > options_.var_freeze_step || (done + 1) % var_interval() != 0;
}

std::vector<std::pair<std::string, at::Tensor>> ZeroOneAdam::extra_state(
    const at::Tensor& param) const {
  if (!state_.count(detail::optimizer_state_key(param))) return {};
  Local& local = local_of(param);
  return {{"local_start", local.start}, {"zero_one_counters", local.counters}};
}

at::Tensor ZeroOneAdam::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  const at::Tensor loss = detail::run_closure(closure);
  const int64_t done = updates();
  const bool frozen = done > options_.var_freeze_step;
  // The exchanges of updates start without the warmup's errors (a resume starts without any).
  if (done == options_.var_freeze_step + 1) errors_.clear();
  for (auto& group : param_groups_) {
    const auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    const auto [beta1, beta2] = options.betas();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& grad = detail::dense_gradient(p, "ZeroOneAdam");
      auto& state = detail::adam_state_of(*this, p);
      Local& local = local_of(p);
      auto counter = local.counters.accessor<double, 1>();
      const int64_t s = state.step() + 1;
      state.step(s);
      if (s == 1) continue;  // DeepSpeed's initialization step: nothing moves
      at::Tensor& m = state.exp_avg();
      at::Tensor& v = state.exp_avg_sq();
      const auto var_interval = static_cast<int64_t>(counter[kVarInterval]);
      CompressionErrors& errors = errors_[detail::optimizer_state_key(p)];
      if (!frozen && s % var_interval == 0) {
        m.mul_(beta1).add_(grad, 1 - beta1);  // the averaged gradient
        v.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      } else if (!frozen) {
        at::Tensor average = grad.contiguous().clone();
        if (averaging()) compressed_all_reduce(*group_, average, errors);
        m.mul_(beta1).add_(average, 1 - beta1);
        mask_unseen(m, v);
      } else {
        if (counter[kLrSum] == 0) local.start.copy_(p);  // the first local step since an exchange
        m.mul_(beta1).add_(grad, 1 - beta1);             // this rank's own
        counter[kLrSum] += options.lr();
      }
      p.add_(detail::decayed_direction(p, m, v, options), -options.lr());
      if (frozen && s % static_cast<int64_t>(counter[kLocalInterval]) == 0) {
        // Exchange: the local updates since the start replaced by their average, exchanged in
        // units of the momentum. From the start itself (DeepSpeed subtracts the updates again),
        // so that replicas stay equal bit for bit.
        const at::Tensor denominator = v.sqrt().add_(options.eps());
        at::Tensor exchanged = (p - local.start).mul_(denominator).mul_(v.ne(0));
        if (averaging()) compressed_all_reduce(*group_, exchanged, errors);
        exchanged.mul_(v.ne(0));
        if (counter[kLrSum] > 0) m.copy_(exchanged / -counter[kLrSum]);
        p.copy_(local.start + exchanged / denominator);
        counter[kLrSum] = 0;
      }
      if (!frozen) {
        if (s % var_interval == 0 && ++counter[kVarCounter] == options_.var_update_scaler) {
          counter[kVarCounter] = 0;
          counter[kVarInterval] *= 2;
        }
      } else if (++counter[kLocalCounter] == options_.local_step_scaler) {
        counter[kLocalCounter] = 0;
        counter[kLocalInterval] =
            std::min(static_cast<double>(options_.local_step_clipper), counter[kLocalInterval] * 2);
      }
    }
  }
  return loss;
}

}  // namespace shardtrain
