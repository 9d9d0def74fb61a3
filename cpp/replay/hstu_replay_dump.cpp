// hstu_replay_dump: run every batch of an HSTU reference dump through an AOTInductor package
// (the no-cache interface: values, lengths, num_candidates -> logits [N, 8]) with libtorch
// alone, and compare the logits with the dumped reference; or, with --produce-reference, write
// them as the reference (batch_%06d_compiled_logits.pt) of a dump that has none yet.
//
// Exit status: 0 every batch within the tolerance (or written); 2 some batch is not (or has
// another shape); 1 a usage or I/O error, reported as one line on stderr.

// Only the headers used (not <torch/script.h>): about a fifth less compile time on 2 cores.
#include <ATen/core/Tensor.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <regex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fs = std::filesystem;

namespace {

const char* const kUsage =
    "usage: hstu_replay_dump --package model.pt2 --dump-dir DIR [--tolerance 0.0625] "
    "[--write-reference NAME | --produce-reference]";

// Tensors a dump already holds: --write-reference must never overwrite them.
const std::vector<std::string> kDumpNames = {
    "values", "lengths", "num_candidates", "user_ids", "total_history_lengths",
    "compiled_logits", "compiled_offload_task_ids", "ref_logits"};

struct Options {
  std::string package;
  fs::path dump_dir;
  double tolerance = 0.0625;
  std::string write_reference;  // empty: write nothing
  bool produce_reference = false;  // write compiled_logits, compare nothing
};

struct Failure : std::runtime_error {  // usage or I/O: exit 1
  using std::runtime_error::runtime_error;
};

std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

std::string error_text(const std::exception& e) {
  if (auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return first_line(c10_error->what_without_backtrace());
  }
  return first_line(e.what());
}

Options parse_options(int argc, char** argv) {
  Options opts;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::puts(kUsage);
      std::exit(0);
    }
    if (flag == "--produce-reference") {
      opts.produce_reference = true;
      continue;
    }
    if (flag != "--package" && flag != "--dump-dir" && flag != "--tolerance" &&
        flag != "--write-reference") {
      throw Failure("unknown argument " + flag + " (" + kUsage + ")");
    }
    if (i + 1 >= argc) throw Failure(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--package") {
      opts.package = value;
    } else if (flag == "--dump-dir") {
      opts.dump_dir = value;
    } else if (flag == "--tolerance") {
      char* end = nullptr;
      opts.tolerance = std::strtod(value.c_str(), &end);
      if (end == value.c_str() || *end != '\0' || !std::isfinite(opts.tolerance) ||
          opts.tolerance < 0) {
        throw Failure("--tolerance must be a finite number >= 0, got " + value);
      }
    } else {
      opts.write_reference = value;
    }
  }
  if (opts.package.empty() || opts.dump_dir.empty()) {
    throw Failure(std::string("--package and --dump-dir are required (") + kUsage + ")");
  }
  const std::string& name = opts.write_reference;
  if (opts.produce_reference && !name.empty()) {
    throw Failure("--produce-reference and --write-reference exclude each other");
  }
  if (!name.empty()) {
    if (!std::regex_match(name, std::regex("[A-Za-z0-9_]+"))) {
      throw Failure("--write-reference " + name + ": use letters, digits and _ only");
    }
    if (std::find(kDumpNames.begin(), kDumpNames.end(), name) != kDumpNames.end()) {
      throw Failure("--write-reference " + name + ": would overwrite the dump's own tensors");
    }
  }
  return opts;
}

// Batch prefixes ("batch_000003") of every batch_%06d_values.pt, in index order.
std::vector<std::string> find_batches(const fs::path& dir) {
  if (!fs::is_directory(dir)) throw Failure(dir.string() + ": no such dump directory");
  const std::regex values_file(R"((batch_(\d{6,18}))_values\.pt)");
  std::vector<std::pair<unsigned long long, std::string>> found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    std::smatch match;
    if (entry.is_regular_file() && std::regex_match(name, match, values_file)) {
      found.emplace_back(std::stoull(match[2].str()), match[1].str());
    }
  }
  if (found.empty()) throw Failure(dir.string() + ": no batch_NNNNNN_values.pt files");
  std::sort(found.begin(), found.end());
  std::vector<std::string> prefixes;
  for (auto& item : found) prefixes.push_back(std::move(item.second));
  return prefixes;
}

// A dump file: a TorchScript archive whose module holds the tensor as the buffer `tensor`.
at::Tensor read_tensor(const fs::path& path) {
  if (!fs::is_regular_file(path)) throw Failure(path.string() + ": missing");
  try {
    return torch::jit::load(path.string()).attr("tensor").toTensor();
  } catch (const std::exception& e) {
    throw Failure(path.string() + ": not a tensor file (" + error_text(e) + ")");
  }
}

// The same format, written through a temporary name so a reader never sees half a file.
void write_tensor(const fs::path& path, const at::Tensor& tensor) {
  torch::jit::Module holder("TensorHolder");
  holder.register_buffer("tensor", tensor.contiguous().clone());
  fs::path partial = path;
  partial += ".partial";
  holder.save(partial.string());
  fs::rename(partial, path);
}

at::Tensor read_input(const fs::path& path) {
  at::Tensor t = read_tensor(path);
  if (t.scalar_type() != at::kLong || t.dim() != 1) {
    throw Failure(path.string() + ": expected a 1-D int64 tensor");
  }
  return t.contiguous();
}

std::string shape_text(const at::Tensor& t) {
  std::string text;
  for (int64_t size : t.sizes()) text += (text.empty() ? "" : "x") + std::to_string(size);
  return text.empty() ? "scalar" : text;
}

std::unique_ptr<torch::inductor::AOTIModelPackageLoader> load_package(const std::string& package) {
  if (!fs::is_regular_file(package)) throw Failure(package + ": no AOTInductor package there");
  try {
    return std::make_unique<torch::inductor::AOTIModelPackageLoader>(package, "model", false, 1, -1);
  } catch (const std::exception& e) {
    throw Failure(package + ": cannot load the AOTInductor package (" + error_text(e) + ")");
  }
}

// The device the package was compiled for (its AOTI_DEVICE_KEY metadata; the CPU when it names none).
c10::Device package_device(torch::inductor::AOTIModelPackageLoader& loader) {
  const auto metadata = loader.get_metadata();
  const auto found = metadata.find("AOTI_DEVICE_KEY");
  return c10::Device(found == metadata.end() || found->second.empty() ? std::string("cpu") : found->second);
}

// The package's logits for one dumped batch (inputs moved to the package's device, logits back on the CPU).
at::Tensor run_batch(torch::inductor::AOTIModelPackageLoader& loader, const fs::path& dir, const std::string& batch) {
  const c10::Device device = package_device(loader);
  at::Tensor values = read_input(dir / (batch + "_values.pt")).to(device);
  at::Tensor lengths = read_input(dir / (batch + "_lengths.pt")).to(device);
  at::Tensor num_candidates = read_input(dir / (batch + "_num_candidates.pt")).to(device);
  try {
    c10::InferenceMode guard;
    return loader.run({values, lengths, num_candidates}).at(0).to(at::kCPU).to(at::kFloat);
  } catch (const std::exception& e) {
    throw Failure(batch + ": the package failed (" + error_text(e) + ")");
  }
}

// --produce-reference: every batch's logits become its compiled_logits; a dump that already holds
// reference logits is refused before anything is written.
int produce(const Options& opts, const std::vector<std::string>& batches) {
  const fs::path& dir = opts.dump_dir;
  for (const std::string& batch : batches) {
    for (const char* name : {"_compiled_logits.pt", "_ref_logits.pt"}) {
      if (fs::exists(dir / (batch + name))) {
        throw Failure(batch + " already has reference logits (" + batch + name + "); --produce-reference "
                      "writes them only into a dump without any");
      }
    }
  }
  auto loader = load_package(opts.package);
  for (const std::string& batch : batches) {
    const at::Tensor out = run_batch(*loader, dir, batch);
    write_tensor(dir / (batch + "_compiled_logits.pt"), out);
    std::printf("%s wrote=compiled_logits rows=%lld\n", batch.c_str(),
                static_cast<long long>(out.dim() > 0 ? out.size(0) : 0));
    std::fflush(stdout);
  }
  std::printf("summary batches=%zu written=%zu PASS\n", batches.size(), batches.size());
  return 0;
}

int replay(const Options& opts) {
  const std::vector<std::string> batches = find_batches(opts.dump_dir);
  if (opts.produce_reference) return produce(opts, batches);
  auto loader = load_package(opts.package);

  const fs::path& dir = opts.dump_dir;
  int failed = 0;
  double worst = 0.0;
  for (const std::string& batch : batches) {
    fs::path reference_path = dir / (batch + "_compiled_logits.pt");
    if (!fs::is_regular_file(reference_path)) reference_path = dir / (batch + "_ref_logits.pt");
    if (!fs::is_regular_file(reference_path)) {
      throw Failure(batch + ": neither compiled_logits nor ref_logits to compare with");
    }
    const at::Tensor reference = read_tensor(reference_path).to(at::kFloat);

    const at::Tensor out = run_batch(*loader, dir, batch);
    if (!opts.write_reference.empty()) {
      write_tensor(dir / (batch + "_" + opts.write_reference + ".pt"), out);
    }

    const int64_t rows = out.dim() > 0 ? out.size(0) : 0;
    const bool same_shape = out.sizes() == reference.sizes();
    double max_abs = INFINITY;
    double mean_abs = INFINITY;
    if (same_shape && out.numel() == 0) {
      max_abs = mean_abs = 0.0;
    } else if (same_shape) {
      const at::Tensor diff = out.sub(reference).abs();
      max_abs = diff.max().item<double>();  // NaN propagates, and NaN never passes below
      mean_abs = diff.mean().item<double>();
    }
    const bool ok = max_abs <= opts.tolerance;
    failed += ok ? 0 : 1;
    worst = (std::isnan(max_abs) || max_abs > worst) ? max_abs : worst;
    std::printf("%s max_abs_diff=%.6g mean_abs_diff=%.6g rows=%lld %s", batch.c_str(), max_abs, mean_abs,
                static_cast<long long>(rows), ok ? "ok" : "FAIL");
    if (!same_shape) {
      std::printf(" shape=%s reference_shape=%s", shape_text(out).c_str(), shape_text(reference).c_str());
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  std::printf("summary batches=%zu failed=%d max_abs_diff=%.6g tolerance=%g %s\n", batches.size(), failed,
              worst, opts.tolerance, failed == 0 ? "PASS" : "FAIL");
  return failed == 0 ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return replay(parse_options(argc, argv));
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "hstu_replay_dump: error: %s\n", error_text(e).c_str());
    return 1;
  }
}
