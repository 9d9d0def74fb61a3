// libtriton_hstu.so: the Triton backend serving the HSTU ranking models from the batched-step
// AOTInductor package. Each model's config.pbtxt says its role in `parameters`:
//   role=cached    hstu_gr_ranking_kvcache: the KV cache kept between requests, with a host tier
//                  behind it where host_budget_tokens > 0; adds OUTPUT__1 (-1), CACHED_TOKENS and
//                  HOST_CACHED_TOKENS (the part of them onboarded from the host tier); the pool's
//                  whole budget taken at start where reserve_pool is 1;
//   role=uncached  hstu_gr_ranking / hstu_model: a pool that keeps nothing;
//   role=control   hstu_kvcache_control: the cached model's counters, after emptying it when CLEAR is 1.
// Inputs are read in place from Triton's buffers (copied only when they arrive in pieces).
#include <c10/util/Exception.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "engine.h"
#include "triton_api.h"

namespace {

using hstu::InputError;
using hstu::LimitError;

uint64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct TritonFailure : std::runtime_error {  // a call into Triton that failed: its message
  using std::runtime_error::runtime_error;
};

void check(TRITONSERVER_Error* error) {
  if (error == nullptr) return;
  std::string message = TRITONSERVER_ErrorMessage(error);
  TRITONSERVER_ErrorDelete(error);
  throw TritonFailure(message);
}

std::vector<std::string> split(const std::string& text, char by) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, by);) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

// The model config's string parameters, read from its JSON form. Values are written by the
// frontend and carry no quote or backslash.
class Parameters {
 public:
  explicit Parameters(TRITONBACKEND_Model* model) {
    TRITONSERVER_Message* message = nullptr;
    check(TRITONBACKEND_ModelConfig(model, 1, &message));
    const char* base = nullptr;
    size_t size = 0;
    TRITONSERVER_Error* error = TRITONSERVER_MessageSerializeToJson(message, &base, &size);
    if (error == nullptr) json_.assign(base, size);
    TRITONSERVER_MessageDelete(message);
    check(error);
  }

  std::string text(const std::string& key) const {
    const std::string name = "\"" + key + "\"";
    size_t at = json_.find("\"parameters\"");  // the config's own fields never shadow a key
    at = at == std::string::npos ? at : json_.find(name, at);
    at = at == std::string::npos ? at : json_.find("\"string_value\"", at + name.size());
    at = at == std::string::npos ? at : json_.find('"', json_.find(':', at) + 1);
    const size_t end = at == std::string::npos ? at : json_.find('"', at + 1);
    if (end == std::string::npos) throw InputError("config.pbtxt lacks the parameter " + key);
    return json_.substr(at + 1, end - at - 1);
  }

  int64_t integer(const std::string& key) const {
    const std::string value = text(key);
    try {
      return std::stoll(value);
    } catch (const std::exception&) {
      throw InputError("config.pbtxt parameter " + key + ": " + value + " is not an integer");
    }
  }

 private:
  std::string json_;
};

// Where each field of the jagged request arrives: field -> input name (hstu_replay.interface).
struct Interface {
  std::map<std::string, std::string> inputs;
  std::string logits;
  bool cache_outputs;
};

struct ModelState {
  std::string name;
  std::string role;
  Interface interface;
  std::shared_ptr<hstu::Engine> engine;  // the control model's is the cached model's
  std::string cache_model;               // control: whose cache
  std::vector<std::string> control_outputs;
};

// Cached models by name: the control model finds its cache here (one tritonserver process).
std::mutex registry_lock;
std::map<std::string, std::shared_ptr<hstu::Engine>> cached_engines;

struct InputData {  // an int64 input as one view (a copy only when it came in pieces)
  hstu::Int64s view;
  std::vector<int64_t> joined;
};

void read_input(TRITONBACKEND_Request* request, const std::string& field, const std::string& name, InputData& out) {
  TRITONBACKEND_Input* input = nullptr;
  if (TRITONSERVER_Error* error = TRITONBACKEND_RequestInput(request, name.c_str(), &input)) {
    TRITONSERVER_ErrorDelete(error);
    throw InputError("request lacks input " + name);
  }
  TRITONSERVER_DataType dtype;
  const int64_t* shape = nullptr;
  uint32_t dims = 0, buffers = 0;
  uint64_t bytes = 0;
  check(TRITONBACKEND_InputProperties(input, nullptr, &dtype, &shape, &dims, &bytes, &buffers));
  if (dtype != TRITONSERVER_TYPE_INT64 || dims != 1) {
    throw InputError(field + " (" + name + ") must be a 1-D int64 tensor");
  }
  out.view.size = int64_t(bytes / sizeof(int64_t));
  for (uint32_t i = 0; i < buffers; ++i) {
    const void* buffer = nullptr;
    uint64_t size = 0;
    TRITONSERVER_MemoryType memory = TRITONSERVER_MEMORY_CPU;
    int64_t memory_id = 0;
    check(TRITONBACKEND_InputBuffer(input, i, &buffer, &size, &memory, &memory_id));
    if (memory == TRITONSERVER_MEMORY_GPU) throw InputError(name + ": inputs in GPU memory are not taken");
    if (buffers == 1) {
      out.view.data = static_cast<const int64_t*>(buffer);
      return;
    }
    const auto* first = static_cast<const int64_t*>(buffer);
    out.joined.insert(out.joined.end(), first, first + size / sizeof(int64_t));
  }
  static const int64_t kEmpty = 0;  // an input of no elements is there all the same (not derived)
  out.view.data = out.joined.empty() ? &kEmpty : out.joined.data();
}

void add_output(TRITONBACKEND_Response* response, const std::string& name, TRITONSERVER_DataType dtype,
                const std::vector<int64_t>& shape, const void* data, size_t bytes) {
  TRITONBACKEND_Output* output = nullptr;
  check(TRITONBACKEND_ResponseOutput(response, &output, name.c_str(), dtype, shape.data(), uint32_t(shape.size())));
  void* buffer = nullptr;
  TRITONSERVER_MemoryType memory = TRITONSERVER_MEMORY_CPU;
  int64_t memory_id = 0;
  check(TRITONBACKEND_OutputBuffer(output, &buffer, bytes, &memory, &memory_id));
  if (memory == TRITONSERVER_MEMORY_GPU) throw TritonFailure(name + ": Triton gave a GPU buffer for an output");
  if (bytes) std::memcpy(buffer, data, bytes);
}

void add_int64s(TRITONBACKEND_Response* response, const std::string& name, const std::vector<int64_t>& values) {
  add_output(response, name, TRITONSERVER_TYPE_INT64, {int64_t(values.size())}, values.data(),
             values.size() * sizeof(int64_t));
}

void answer_ranking(ModelState& state, TRITONBACKEND_Request* request, TRITONBACKEND_Response* response) {
  hstu::PhaseClock& clock = state.engine->clock;
  const auto call = clock.call();
  std::map<std::string, InputData> data;
  std::vector<hstu::UserView> users;
  {
    const auto timed = clock.phase("inputs");
    for (const auto& [field, name] : state.interface.inputs) read_input(request, field, name, data[field]);
    auto view = [&](const char* field) { return data.count(field) ? data[field].view : hstu::Int64s{}; };
    users = hstu::split_request(view("values"), view("lengths"), view("num_candidates"), view("user_ids"),
                                view("total_history_lengths"), state.engine->limits());
  }
  hstu::Answer answer;
  {
    const auto timed = clock.phase("engine");
    answer = state.engine->infer(users);
  }
  const auto timed = clock.phase("outputs");
  add_output(response, state.interface.logits, TRITONSERVER_TYPE_FP32, {answer.logits.size(0), 8},
             answer.logits.data_ptr<float>(), answer.logits.numel() * sizeof(float));
  if (state.interface.cache_outputs) {
    add_int64s(response, "OUTPUT__1", std::vector<int64_t>(users.size(), -1));  // no offload task
    add_int64s(response, "CACHED_TOKENS", answer.cached);
    add_int64s(response, "HOST_CACHED_TOKENS", answer.onboarded);
  }
}

void answer_control(ModelState& state, TRITONBACKEND_Request* request, TRITONBACKEND_Response* response) {
  std::shared_ptr<hstu::Engine> engine;
  {
    std::lock_guard<std::mutex> hold(registry_lock);
    auto found = cached_engines.find(state.cache_model);
    if (found != cached_engines.end()) engine = found->second;
  }
  if (!engine) throw InputError("the KV-cache model " + state.cache_model + " is not loaded");
  InputData clear;
  read_input(request, "clear", "CLEAR", clear);
  if (clear.view.size < 1) throw InputError("CLEAR must hold one value");
  if (clear.view[0] == 1) engine->clear();
  const auto stats = engine->stats();
  for (const auto& name : state.control_outputs) {
    const auto found = stats.find(name);
    add_int64s(response, name, {found == stats.end() ? 0 : found->second});  // no host tier: its figures 0
  }
}

TRITONSERVER_Error* error_of(TRITONSERVER_Error_Code code, const std::string& kind, const std::string& message) {
  return TRITONSERVER_ErrorNew(code, (kind + ": " + message).c_str());
}

// Runs `body`, turning what it throws into a Triton error (never an exception across the C API).
template <typename Body>
TRITONSERVER_Error* guarded(Body&& body) {
  try {
    body();
    return nullptr;
  } catch (const LimitError& e) {
    return error_of(TRITONSERVER_ERROR_INVALID_ARG, "LimitError", e.what());
  } catch (const InputError& e) {
    return error_of(TRITONSERVER_ERROR_INVALID_ARG, "InputError", e.what());
  } catch (const c10::Error& e) {
    const std::string text = e.what_without_backtrace();
    return error_of(TRITONSERVER_ERROR_INTERNAL, "RuntimeError", text.substr(0, text.find('\n')));
  } catch (const std::exception& e) {
    return error_of(TRITONSERVER_ERROR_INTERNAL, "Error", e.what());
  }
}

at::ScalarType dtype_named(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  throw InputError("config.pbtxt parameter dtype: " + name + " is neither float32 nor bfloat16");
}

std::unique_ptr<ModelState> load(TRITONBACKEND_Model* model) {
  auto state = std::make_unique<ModelState>();
  const char* name = nullptr;
  check(TRITONBACKEND_ModelName(model, &name));
  state->name = name;
  const Parameters params(model);
  state->role = params.text("role");
  if (state->role == "control") {
    state->cache_model = params.text("cache_model");
    state->control_outputs = split(params.text("outputs"), ',');
    return state;
  }
  if (state->role != "cached" && state->role != "uncached") throw InputError("unknown role " + state->role);
  for (const auto& pair : split(params.text("inputs"), ',')) {
    const size_t eq = pair.find('=');
    state->interface.inputs[pair.substr(0, eq)] = pair.substr(eq + 1);
  }
  state->interface.logits = params.text("logits_output");
  const bool cached = state->role == "cached";
  state->interface.cache_outputs = cached;
  TRITONBACKEND_ArtifactType artifact;
  const char* location = nullptr;
  uint64_t version = 0;
  check(TRITONBACKEND_ModelRepository(model, &artifact, &location));
  check(TRITONBACKEND_ModelVersion(model, &version));
  const std::string package = std::string(location) + "/" + std::to_string(version) + "/model.pt2";
  const hstu::ModelShape shape{params.integer("num_layers"), params.integer("num_heads"), params.integer("head_dim"),
                               {params.integer("max_batch"), params.integer("max_history"),
                                params.integer("max_candidates")},
                               dtype_named(params.text("dtype"))};
  const int64_t budget = cached ? params.integer("cache_budget_tokens") : 0;
  const bool reserve_pool = cached && params.integer("reserve_pool") != 0;
  const hstu::HostTierShape host =
      cached ? hstu::HostTierShape{params.integer("host_budget_tokens"), hstu::offload_mode_named(params.text("offload_mode")),
                                   params.integer("offload_chunk_tokens")}
             : hstu::HostTierShape{0, hstu::OffloadMode::kNative, 1};
  state->engine =
      std::make_shared<hstu::Engine>(package, shape, budget, params.integer("page_tokens"), reserve_pool, host,
                                     state->name);
  if (cached) {
    std::lock_guard<std::mutex> hold(registry_lock);
    cached_engines[state->name] = state->engine;
  }
  return state;
}

}  // namespace

extern "C" {

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend*) {
  uint32_t major = 0, minor = 0;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ApiVersion(&major, &minor)) return error;
  if (major != 1) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED,
                                 ("hstu backend: written for backend API 1.x, the server has " +
                                  std::to_string(major) + "." + std::to_string(minor)).c_str());
  }
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  return guarded([&] { check(TRITONBACKEND_ModelSetState(model, load(model).release())); });
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* raw = nullptr;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ModelState(model, &raw)) return error;
  std::unique_ptr<ModelState> state(static_cast<ModelState*>(raw));
  if (state && state->role == "cached") {
    std::lock_guard<std::mutex> hold(registry_lock);
    cached_engines.erase(state->name);
  }
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance*) { return nullptr; }

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance*) { return nullptr; }

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, const uint32_t count) {
  TRITONBACKEND_Model* model = nullptr;
  void* raw = nullptr;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ModelInstanceModel(instance, &model)) return error;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ModelState(model, &raw)) return error;
  ModelState& state = *static_cast<ModelState*>(raw);
  const uint64_t exec_start = now_ns();
  uint64_t compute_start = exec_start, compute_end = exec_start;
  for (uint32_t r = 0; r < count; ++r) {
    TRITONBACKEND_Request* request = requests[r];
    const uint64_t started = now_ns();
    TRITONBACKEND_Response* response = nullptr;
    TRITONSERVER_Error* failed = TRITONBACKEND_ResponseNew(&response, request);
    if (failed == nullptr) {
      failed = guarded([&] {
        if (state.role == "control") {
          answer_control(state, request, response);
        } else {
          answer_ranking(state, request, response);
        }
      });
      const bool success = failed == nullptr;
      compute_end = now_ns();
      TRITONSERVER_Error* sent = TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, failed);
      if (sent != nullptr) TRITONSERVER_ErrorDelete(sent);
      if (failed != nullptr) TRITONSERVER_ErrorDelete(failed);  // the response took a copy of it
      const uint64_t ended = now_ns();
      TRITONSERVER_Error* reported =
          TRITONBACKEND_ModelInstanceReportStatistics(instance, request, success, started, started, compute_end, ended);
      if (reported != nullptr) TRITONSERVER_ErrorDelete(reported);
    } else {
      TRITONSERVER_ErrorDelete(failed);
    }
    if (r == 0) compute_start = started;
    TRITONSERVER_Error* released = TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL);
    if (released != nullptr) TRITONSERVER_ErrorDelete(released);
  }
  TRITONSERVER_Error* reported = TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, count, exec_start,
                                                                                 compute_start, compute_end, now_ns());
  if (reported != nullptr) TRITONSERVER_ErrorDelete(reported);
  return nullptr;
}

}  // extern "C"
