// Where a served model's calls spend their time (HSTU_REPLAY_BACKEND_PHASES=N), in the line
// hstu_replay/server/phases.py writes for the Python backend: every N calls, the mean
// milliseconds per call of each phase in the order they first ran, then the calls' whole time and
// what the named phases leave unexplained. A phase named `outer.inner` runs inside `outer`: it is
// shown, not subtracted again. Off (N = 0, the default) a phase costs one branch.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace hstu {

class PhaseClock {
 public:
  explicit PhaseClock(std::string label) : label_(std::move(label)) {
    const char* value = std::getenv("HSTU_REPLAY_BACKEND_PHASES");
    every_ = value == nullptr ? 0 : std::atol(value);
  }

  class Timed {  // one phase's wall time, added when it goes out of scope
   public:
    Timed(PhaseClock* clock, const char* name) : clock_(clock), name_(name), started_(now()) {}
    ~Timed() {
      if (clock_ != nullptr) clock_->add(name_, now() - started_);
    }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    PhaseClock* clock_;
    const char* name_;
    double started_;
  };

  Timed phase(const char* name) { return Timed(every_ > 0 ? this : nullptr, name); }

  class Call {  // one call: its whole time, and the line every N calls
   public:
    explicit Call(PhaseClock* clock) : clock_(clock), started_(now()) {}
    ~Call() {
      if (clock_ != nullptr) clock_->end_call(now() - started_);
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    PhaseClock* clock_;
    double started_;
  };

  Call call() { return Call(every_ > 0 ? this : nullptr); }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  void add(const std::string& name, double seconds) {
    for (auto& entry : totals_) {
      if (entry.first == name) {
        entry.second += seconds;
        return;
      }
    }
    totals_.emplace_back(name, seconds);
  }

  void end_call(double seconds) {
    whole_ += seconds;
    if (++calls_ < every_) return;
    const double per_call = 1e3 / double(calls_);
    std::string line = "phases " + label_ + ": " + std::to_string(calls_) + " calls, ms per call: ";
    double named = 0.0;
    char number[32];
    for (size_t i = 0; i < totals_.size(); ++i) {
      std::snprintf(number, sizeof number, "%.3f", totals_[i].second * per_call);
      line += (i ? ", " : "") + totals_[i].first + " " + number;
      if (totals_[i].first.find('.') == std::string::npos) named += totals_[i].second;
    }
    std::snprintf(number, sizeof number, "; whole %.3f, other %.3f", whole_ * per_call, (whole_ - named) * per_call);
    std::fprintf(stderr, "%s%s\n", line.c_str(), number);
    std::fflush(stderr);
    totals_.clear();
    calls_ = 0;
    whole_ = 0.0;
  }

  std::string label_;
  long every_ = 0;
  long calls_ = 0;
  double whole_ = 0.0;
  std::vector<std::pair<std::string, double>> totals_;
};

}  // namespace hstu
